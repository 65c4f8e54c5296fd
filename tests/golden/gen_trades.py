"""TRADES (yaodongyu/TRADES): the training attack, loss and weight gradient of ``trades.trades_loss``."""
import numpy as np
import torch

from conformance import Recorder

REPO = "yaodongyu/TRADES"
PINNED = "6e8e11b7c281371c2f027ffadfbaea80361f09de"
SETTINGS = {"epsilon": 0.031, "step_size": 0.007, "perturb_steps": 10, "beta": 6.0}  # train_trades_cifar10.py


def generate(path, inp):
    from trades import trades_loss

    model = inp.model("train")
    rec = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = trades_loss(rec, inp.x, inp.y, opt, distance="l_inf", **SETTINGS)
    grad = torch.autograd.grad(loss, list(model.parameters()))
    # The last forward inputs are x, x_adv, x (loss_natural, then the KL term's two forwards).
    x_adv = rec.inputs[-2]
    arrays = {"iterates": np.stack([t.numpy() for t in rec.iterates + [x_adv]]),
              "step_grads": np.stack([g.numpy() for g in rec.grads]),
              "loss": loss.detach().numpy(), "weight_grad": torch.cat([g.flatten() for g in grad]).numpy()}
    meta = {"file": "trades.py", "function": "trades_loss", "settings": SETTINGS,
            "iterates": "x_0 (the code's start x + 0.001 N(0, I)) .. x_K, recorded at each forward"}
    return {"trades": (arrays, meta)}
