"""HE (ShawnXYang/AT_HE, CIFAR-10/): the FN + WN head of ``models/wideresnet.py`` ``WideResNet.forward`` on
TinyNet's features and class weights; ``losses.pgd_loss`` (PGD-HE) and ``losses.trades_loss`` (TRADES-HE):
training attack, loss and weight gradient on the first ``BATCH`` images (what is kept per step: record.py);
and the PGD-20 evaluation ``_pgd_whitebox`` of ``pgd_attack_cifar10.py``.

The head is the tail of their ``WideResNet.forward`` (normalise the pooled features, overwrite ``fc.weight``
with its row-normalised copy, apply ``fc``), run unbound on :class:`StandIn`: a module holding the attributes
that forward reads, with TinyNet's features in the body's place and TinyNet's ``fc.weight`` (no bias) as ``fc``.
"""
import sys
import types

import torch
from torch import nn

from conformance import Recorder
from record import BATCH, STEP_IMAGES, load_function, script_namespace, steps_record

REPO = "ShawnXYang/AT_HE"
PINNED = "dad6a41bb170bba94f9818e7ba891163143c3e10"
FLOAT64 = []  # the AT_HE code casts nothing the float64 run does not cover
# train_adv_cifar10.py defaults (epsilon, step size, steps); s and m of the README's commands:
# `--loss=pgd_he --s=10.0 --m=0.2`, `--loss=trades_he --beta=6.0 --s=15.0 --m=0.2`
ATTACK = {"epsilon": 0.031, "step_size": 0.007, "perturb_steps": 10}
PGD_HE = {**ATTACK, "loss": "pgd_he", "s": 10.0, "m": 0.2}
TRADES_HE = {**ATTACK, "loss": "trades_he", "s": 15.0, "m": 0.2, "beta": 6.0}
EVAL = {"epsilon": 0.031, "num_steps": 20, "step_size": 0.003, "random": True}  # pgd_attack_cifar10.py defaults
FEATURES = 16 * 8 * 8
SGD = {"lr": 0.1, "momentum": 0.9, "weight_decay": 5e-4}  # train_adv_cifar10.py; wd of the README's PGD-HE command
TRAIN_BATCH = 8


class Spread(nn.Module):
    """TinyNet's (N, 16, 8, 8) features as the (N, 1024, 8, 8) map whose 8x8 average pool (their forward's
    ``F.avg_pool2d(out, 8)``) is the flattened feature vector exactly: 64 z at one position, 0 elsewhere."""

    def forward(self, f):
        z = f.flatten(1)
        out = z.new_zeros(z.shape[0], FEATURES, 8, 8)
        out[:, :, 0, 0] = 64.0 * z
        return out


class StandIn(nn.Module):
    """What ``WideResNet.forward`` reads, with TinyNet in the body's place (use_FNandWN, no input normaliser)."""

    def __init__(self, inp, mode, forward):
        super().__init__()
        tiny = inp.model(mode)
        self.i_normalize, self.use_FNandWN, self.nChannels = False, True, FEATURES
        self.conv1 = tiny.features  # then block1..3, bn1, relu, avg_pool2d(8), view, FN, WN, fc
        self.block1, self.block2, self.block3 = nn.Identity(), nn.Identity(), Spread()
        self.bn1, self.relu = nn.Identity(), nn.ReLU(inplace=True)  # TinyNet's features are >= 0 already
        self.fc = nn.Linear(FEATURES, 10, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(tiny.fc.weight)
        self._forward = forward
        self.train(mode == "train")

    def forward(self, x):
        return self._forward(self, x)


class Loader(list):
    """A list of (x, y) batches with the ``dataset`` attribute train() reads."""


def training(fn, inp, settings):
    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = StandIn(inp, "train", fn["forward"])
    rec = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = fn["loss"](rec, x, y, opt, distance="l_inf", **settings)
    grad = torch.autograd.grad(loss, list(model.parameters()))
    x_adv = rec.inputs[-1]  # pgd_loss: model(x_adv); trades_loss: model(x_natural), then model(x_adv)
    return {**steps_record(rec.iterates + [x_adv], rec.grads), "start": rec.iterates[0].numpy(),
            "x_adv": x_adv.numpy(), "loss": loss.detach().numpy(),
            "weight_grad": torch.cat([g.flatten() for g in grad]).numpy()}


def generate(path, inp):
    code = path / "CIFAR-10"
    sys.path.insert(0, str(code))  # losses.py imports `he`, the scripts import `models.wideresnet`
    try:
        from losses import pgd_loss, trades_loss
        from models.wideresnet import WideResNet
    finally:
        sys.path.remove(str(code))
    forward = WideResNet.forward
    with torch.no_grad():
        cos = StandIn(inp, "eval", forward)(inp.x)
    steps = "x_0 (the code's start x + 0.001 N(0, I)) .. x_K of the first step_images images"
    common = {"batch": BATCH, "step_images": STEP_IMAGES, "step_iterates": steps,
              "weight_grad": "TinyNet's feature parameters, then fc.weight (the code's gradient at the "
                             "row-normalised weight its forward wrote into fc.weight.data)"}
    out = {"he": ({"cos": cos.numpy()},
                  {"file": "CIFAR-10/models/wideresnet.py", "function": "WideResNet.forward",
                   "cos": "the model's output (cosines; s enters only the losses) in eval mode on all 64 images"})}
    out["he_pgd"] = (training({"forward": forward, "loss": pgd_loss}, inp, PGD_HE),
                     {"file": "CIFAR-10/losses.py", "function": "pgd_loss", "settings": PGD_HE, **common})
    out["he_trades"] = (training({"forward": forward, "loss": trades_loss}, inp, TRADES_HE),
                        {"file": "CIFAR-10/losses.py", "function": "trades_loss", "settings": TRADES_HE, **common})

    # two steps of train_adv_cifar10.py's train(): the update, and fc.weight written back normalised by the
    # next forward (the weights after the second step are read through one more forward, as the code's
    # next step or evaluation would)
    args = types.SimpleNamespace(loss="pgd_he", beta=1.0, distance="l_inf", log_interval=100, num_steps=10,
                                 **{k: v for k, v in PGD_HE.items() if k not in ("loss", "perturb_steps")})
    train = load_function(code / "train_adv_cifar10.py", "train",
                          script_namespace(LOSS={"pgd_he": pgd_loss}))
    model = StandIn(inp, "train", forward)
    before = torch.cat([q.detach().flatten() for q in model.parameters()]).clone()
    rec = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=SGD["lr"], momentum=SGD["momentum"],
                          weight_decay=SGD["weight_decay"])
    n = TRAIN_BATCH
    batches = Loader((inp.x[i * n:(i + 1) * n], inp.y[i * n:(i + 1) * n]) for i in range(2))
    batches.dataset = range(2 * n)  # train() prints its progress with len(train_loader.dataset)
    train(args, rec, torch.device("cpu"), batches, opt, 1)
    x_adv = torch.stack([rec.inputs[(args.num_steps + 1) * i + args.num_steps] for i in range(2)])
    with torch.no_grad():
        model.eval()
        model(inp.x[:1])  # the next forward: fc.weight.data = F.normalize(fc.weight)
    after = torch.cat([q.detach().flatten() for q in model.parameters()])
    out["he_train"] = ({"x_adv": x_adv.numpy(), "change": (after - before).numpy()},
                       {"file": "CIFAR-10/train_adv_cifar10.py", "function": "train", "settings": {**PGD_HE, **SGD},
                        "batches": f"2 batches of {n}: images 0-{n - 1}, then {n}-{2 * n - 1}",
                        "x_adv": "pgd_loss's x_adv of each step",
                        "change": "every parameter after the two steps and one more forward (which writes the "
                                  "normalised rows into fc.weight), minus TinyNet's (fc.weight: its raw rows)"})

    # pgd_attack_cifar10.py's evaluation of an HE model: CE on the model's output, the cosines
    from gen_mart import eval_pgd

    args = types.SimpleNamespace(**EVAL)
    fn = load_function(code / "pgd_attack_cifar10.py", "_pgd_whitebox", script_namespace(args=args))
    x, y = inp.x[:BATCH], inp.y[:BATCH]
    out["he_pgd20"] = (eval_pgd(fn, x, y, StandIn(inp, "eval", forward)),
                       {"file": "CIFAR-10/pgd_attack_cifar10.py", "function": "_pgd_whitebox", "batch": BATCH,
                        "step_images": STEP_IMAGES, "settings": EVAL,
                        "start": "x + U(-eps, eps), not clipped to [0, 1]", "result": "x_20",
                        "loss": "CE of the model's output, the cosines (no s)",
                        "incorrect": "per image, the prediction on x_20 differs from y (err_pgd, unsummed)"})
    return out
