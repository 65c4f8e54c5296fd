"""BAT (silvercherry/Improving-Robust-Fairness-via-Balance-Adversarial-Training): train.py's ``train`` step on the
fixed inputs, with its two early-stopped attacks (``train_mode/stop_to_lastclean.py``,
``train_mode/stop_to_firstadv.py``) and ``BAT_loss``.

train.py is a script (argparse and CIFAR-10 download at the top level): ``train`` and ``BAT_loss`` are taken from
its syntax tree and run in a namespace holding what they read (``args`` as its defaults, a one-batch loader, an
optimizer that keeps the weight gradient). The attack modules import a ``models`` package the repository does not
hold (and use nothing of it): an empty module stands in for it. Each attack keeps only the rows still iterated
from one check to the next and returns the stopped rows first (the first adversarial example's shuffled); the
generator scatters every check's iterate back to its row of the batch, so a trace holds per step the point each
row of the batch is at, as fastfair's engine keeps it (a stopped row holds what the code returns for it).
"""
import argparse
import random
import sys
import types

import torch
import torch.nn.functional as F
from torch import nn

from conformance import Recorder
from conformance_fat import encode
from gen_fat import Loader, rows_of
from record import BATCH, Capture, load_function

REPO = "silvercherry/Improving-Robust-Fairness-via-Balance-Adversarial-Training"
PINNED = "9bcee67aedeea64cd5c3790e88d292f7dafe8a8f"
FLOAT64 = []  # its code casts nothing the float64 run does not cover
# train.py's argparse defaults the step reads; tau 1 of the first adversarial example is train.py line 106's
SETTINGS = {"epsilon": 0.031, "num_steps": 10, "step_size": 0.007, "beta": 6.0, "log_interval": 100}
ATTACKS = {"lastclean": "stop_to_lastclean", "firstadv": "stop_to_firstadv"}
SHUFFLE_SEED = 7  # Python's random, which stop_to_firstadv shuffles its output rows with


def trace(x, checks, grads, out_adv, out_nat, eps):
    """(iterates x_0..x_K of the whole batch, gradients, moved (K, N)) from one attack's checks: ``checks[k]`` the
    rows it iterated at check k, ``out_adv``/``out_nat`` what it returned (any row order)."""
    K, n = SETTINGS["num_steps"], len(x)
    rows = [rows_of(c, x, eps) for c in checks]
    back = (out_nat[:, None] - x[None]).flatten(2).abs().amax(2).argmin(1)
    assert torch.equal(out_nat, x[back]) and sorted(back.tolist()) == list(range(n))
    final = torch.empty_like(x)
    final[back] = out_adv
    full = [final.clone() for _ in range(K + 1)]  # a row not iterated at a check holds what the code returns for it
    moved = torch.zeros(K, n, dtype=torch.bool)
    grad_full = [None] * K
    for k, (c, r) in enumerate(zip(checks, rows)):
        full[k][r] = c
        g = torch.zeros_like(x)
        g[r] = grads[k]
        grad_full[k] = g
        if k + 1 < len(checks):
            moved[k, rows[k + 1]] = True
        elif k + 1 == K:  # the last check: a row that stepped returns x_K, one that stopped a point checked before
            moved[k, [j for j in r if not any(torch.equal(final[j], p[j]) for p in full[:k + 1])]] = True
    return full, grad_full, moved


def generate(path, inp):
    sys.modules.setdefault("models", types.ModuleType("models"))  # train_mode/*.py: from models import *
    from train_mode import stop_to_firstadv, stop_to_lastclean

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = inp.model("train")
    rec, opt = Recorder(model), Capture(model)
    calls = {}

    def recorded(name, fn):
        def run(*a, **k):
            before = len(rec.iterates)
            out = fn(*a, **k)
            calls[name] = (before, len(rec.iterates), out)
            return out
        return run

    ns = {"torch": torch, "nn": nn, "F": F, "print": lambda *a, **k: None,
          "stop_to_lastclean": recorded("lastclean", stop_to_lastclean.stop_to_lastclean),
          "stop_to_firstadv": recorded("firstadv", stop_to_firstadv.stop_to_firstadv),
          "args": argparse.Namespace(**SETTINGS)}
    load_function(path / "train.py", "BAT_loss", ns)
    train = load_function(path / "train.py", "train", ns)
    loss_value = []
    real_bat_loss = ns["BAT_loss"]

    def bat_loss(*a):
        terms = real_bat_loss(*a)
        loss_value.append(sum(t.detach() for t in terms))
        return terms

    ns["BAT_loss"] = bat_loss
    random.seed(SHUFFLE_SEED)
    train(ns["args"], rec, torch.device("cpu"), Loader([(x, y)]), opt, 1)
    arrays, stops = {}, {}
    eps, alpha = SETTINGS["epsilon"], SETTINGS["step_size"]
    for name in ATTACKS:
        first, last, (adv, _, nat, _) = calls[name]
        full, grads, moved = trace(x, rec.iterates[first:last], rec.grads[first:last], adv, nat, eps)
        arrays.update(encode(name, x, full, grads, torch.full((BATCH,), eps), alpha, moved))
        stops[name] = moved.sum(0).tolist()
        print(f"BAT {name}: steps taken per row {stops[name]}")
    arrays["loss"] = loss_value[0].numpy()
    arrays["weight_grad"] = opt.grad.numpy()
    src = {"file": "train.py", "function": "train"}
    meta = {**src, "settings": SETTINGS, "batch": BATCH, "steps_per_row": stops,
            "sources": {"lastclean": {"file": "train_mode/stop_to_lastclean.py", "function": "stop_to_lastclean"},
                        "firstadv": {"file": "train_mode/stop_to_firstadv.py", "function": "stop_to_firstadv"},
                        "loss": {"file": "train.py", "function": "train, BAT_loss"}},
            "traces": "lastclean.*, firstadv.*: each attack of train.py's step on the first BATCH images, its iterates "
                      "scattered back to the batch order (conformance_fat.encode), a stopped row holding the point "
                      "the code returns for it",
            "loss": "loss_robust + loss_natural + loss_uniform of the step (BAT_loss's three terms)",
            "weight_grad": "its gradient (optimizer.step)"}
    return {"bat": (arrays, meta)}
