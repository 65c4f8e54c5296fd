"""FAT (zjfheart/Friendly-Adversarial-Training): FAT.py's ``train`` step (its ``earlystop`` attack, omega noise
and CE loss) on the fixed inputs, and FAT.py's ``adjust_tau``.

FAT.py is a script (argparse and data loading at the top level): its functions ``train`` and ``adjust_tau``
are taken from the file's syntax tree and run in a namespace holding what they use (``args`` as FAT.py's
defaults, its ``earlystop``), a one-batch loader and an optimizer whose ``step`` records the gradients.
The code's step noise ``omega * torch.randn(shape)`` is served, for the run, from a bank of seeded draws
(``conformance.normals``, the same on every CPU): the draw at step k gives the first rows of the bank's step k,
one per moving row in order.
"""
import argparse
import ast
import datetime
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from torch import nn

from conformance import Recorder, normals
from conformance_fat import Flip, encode
from record import Capture

REPO = "zjfheart/Friendly-Adversarial-Training"
PINNED = "80a064074891775146bca8c4d8a6b99c1499285a"
FLOAT64 = ["the step noise omega * torch.randn served from a bank of float32 draws (conformance.normals), held in "
           "float64"]
# FAT.py's argparse defaults (CIFAR-10); rand_init True, randominit_type and loss_fn as its train() passes them
SETTINGS = {"epsilon": 0.031, "num_steps": 10, "step_size": 0.007, "omega": 0.001, "rand_init": True, "tau": 0,
            "dynamictau": True}
BATCH = 16  # the first 16 fixed images: the trace stays small
TAUS = (0, 2)  # FAT's dynamic tau runs 0, 1, 2
FLIP_TAUS = (1, 3)  # on conformance_fat.Flip, whose prediction flips with each step (labels all 0)
SEED = 1234


def functions(path: Path, names, namespace: dict) -> dict:
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


class Loader(list):
    dataset = property(lambda self: [None] * sum(len(b[1]) for b in self))


def rows_of(batch: torch.Tensor, x: torch.Tensor, eps: float, ordered: bool = True) -> list[int]:
    """Which image of x each row of batch (an iterate of a subset of rows) belongs to."""
    d = (batch[:, None] - x[None]).flatten(2).abs().amax(2)
    rows = [int(i) for i in d.argmin(1)]
    assert all(float(d[j, i]) <= eps + 1e-6 for j, i in enumerate(rows)) and len(set(rows)) == len(rows)
    assert not ordered or rows == sorted(rows)
    return rows


def generate(path, inp):
    import earlystop

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    args = argparse.Namespace(**SETTINGS)
    ns = functions(path / "FAT.py", {"train", "adjust_tau"},
                   {"args": args, "earlystop": earlystop.earlystop, "nn": nn, "datetime": datetime, "torch": torch})
    K, eps, alpha = SETTINGS["num_steps"], SETTINGS["epsilon"], SETTINGS["step_size"]
    bank = normals(SEED, (K, BATCH, *x.shape[1:])).to(x.dtype)  # the same on every CPU (conformance.normals)
    arrays = {}
    runs = [(f"tau{t}", t, inp.model("train"), y) for t in TAUS]
    runs += [(f"flip{t}", t, Flip(SETTINGS["step_size"]), torch.zeros_like(y)) for t in FLIP_TAUS]
    for prefix, tau, model, y in runs:
        rec = Recorder(model)
        opt = Capture(model)
        calls = []

        def randn(shape, *a, **k):
            calls.append(shape[0])
            return bank[len(calls) - 1, :shape[0]].clone()

        np.random.seed(tau)
        with mock.patch("torch.randn", randn):
            _, loss_sum, _ = ns["train"](rec, Loader([(x, y)]), opt, tau)
        if prefix.startswith("flip"):
            loss_sum = None
        # rec.inputs: x (the clean forward), then one forward per check (rows still iterated), then the CE forward
        checks = rec.iterates
        present = [rows_of(it, x, eps) for it in checks]
        final_rows = rows_of(rec.inputs[-1], x, eps, ordered=False)  # FAT returns the stopped rows first, then the rest
        x_adv = torch.empty_like(x)
        x_adv[torch.tensor(final_rows)] = rec.inputs[-1]
        assert sorted(final_rows) == list(range(BATCH))
        full = [x_adv.clone() for _ in range(K + 1)]  # a row not iterated at a check holds its final point
        moved = torch.zeros(K, BATCH, dtype=torch.bool)
        grads = [None] * K
        for k, (it, rows) in enumerate(zip(checks, present)):
            full[k][rows] = it
            g = torch.zeros_like(x)
            g[rows] = rec.grads[k]
            grads[k] = g
        for k in range(len(checks)):
            nxt = present[k + 1] if k + 1 < len(checks) else [i for i in present[k]
                                                              if not torch.equal(x_adv[i], full[k][i])]
            moved[k, nxt] = True
        for k in range(1, K + 1):  # a row stopped keeps its point
            full[k] = torch.where(moved[k - 1].view(-1, 1, 1, 1), full[k], full[k - 1])
        assert torch.equal(full[K], x_adv)
        assert calls == [int(m.sum()) for m in moved[:len(calls)]], "one draw per step, one row per moving row"
        noise = torch.zeros_like(bank)
        for k in range(K):
            noise[k, moved[k]] = bank[k, :int(moved[k].sum())]
        arrays.update(encode(prefix, x, full, grads, torch.full((BATCH,), eps), alpha, moved,
                             SETTINGS["omega"] * noise))
        if loss_sum is not None:
            arrays[f"{prefix}.loss"] = np.float64(loss_sum)
            arrays[f"{prefix}.weight_grad"] = opt.grad.numpy()
        print(f"FAT {prefix}: steps taken per row {moved.sum(0).tolist()}")
    epochs = 120  # FAT.py: --epochs 120; its loop calls adjust_tau(epoch + 1, args.dynamictau)
    arrays["tau_schedule"] = np.array([ns["adjust_tau"](e + 1, True) for e in range(epochs)])
    src = {"file": "FAT.py", "function": "train"}
    meta = {**src, "settings": SETTINGS, "batch": BATCH, "taus": list(TAUS),
            "flip_taus": {f"flip{t}": t for t in FLIP_TAUS},
            "noise": {"seed": SEED, "shape": list(bank.shape), "sum": float(bank.double().sum())},
            "sources": {"attack": {"file": "earlystop.py", "function": "earlystop"}, "train": src,
                        "tau_schedule": {"file": "FAT.py", "function": "adjust_tau"}},
            "traces": "tauT.*: FAT.py train() at tau T on the first BATCH images; the code's iterates, its "
                      "earlystop rows scattered back to the batch order (see conformance_fat.encode)",
            "tau_schedule": "adjust_tau(epoch + 1, dynamictau=True) for epoch 0..119, as FAT.py's loop calls it"}
    return {"fat": (arrays, meta)}
