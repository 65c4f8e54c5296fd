"""TRADES (yaodongyu/TRADES): the training attack, loss and weight gradient of ``trades.trades_loss``
on the first ``BATCH`` images (what is kept per step: record.py)."""
import torch

from conformance import Recorder
from record import BATCH, STEP_IMAGES, steps_record

REPO = "yaodongyu/TRADES"
PINNED = "6e8e11b7c281371c2f027ffadfbaea80361f09de"
SETTINGS = {"epsilon": 0.031, "step_size": 0.007, "perturb_steps": 10, "beta": 6.0}  # train_trades_cifar10.py


def generate(path, inp):
    from trades import trades_loss

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = inp.model("train")
    rec = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = trades_loss(rec, x, y, opt, distance="l_inf", **SETTINGS)
    grad = torch.autograd.grad(loss, list(model.parameters()))
    # The last forward inputs are x, x_adv, x (loss_natural, then the KL term's two forwards).
    x_adv = rec.inputs[-2]
    arrays = {**steps_record(rec.iterates + [x_adv], rec.grads), "start": rec.iterates[0].numpy(),
              "x_adv": x_adv.numpy(), "loss": loss.detach().numpy(),
              "weight_grad": torch.cat([g.flatten() for g in grad]).numpy()}
    meta = {"file": "trades.py", "function": "trades_loss", "settings": SETTINGS, "batch": BATCH,
            "step_images": STEP_IMAGES,
            "step_iterates": "x_0 (the code's start x + 0.001 N(0, I)) .. x_K of the first step_images images"}
    return {"trades": (arrays, meta)}
