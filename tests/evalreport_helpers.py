"""Trained models for the evaluation and report tests, built once per test run and cached.

Plain cached functions rather than conftest fixtures, so several test files share one training run
without touching the shared conftest. The digits run is trained once for the whole run, whichever xdist worker
asks first (the others wait on its lock, then read it): its users read it or copy it, never write into it.
"""
from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from helpers import CIFAR10, once_per_run, real_data


def _train(out: Path, sets: list[str], flags: dict):
    from fastfair import config
    from fastfair.training.trainer import Trainer, final_evaluation

    cfg = config.resolve(None, flags, ["train.progress=false", "train.device='cpu'", *sets])
    # two threads whatever the worker's share (the runs' numbers are the same in every session), and the share put
    # back: a worker left at two threads beside another kept OpenMP's threads spinning, and the next test's training
    # in it ran more than ten times slower (a preact-resnet18 fixture past 15 minutes; tests/conftest.py, 6.)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        Trainer(cfg, out, quiet=True).fit()
        final_evaluation(out, cfg, quiet=True)
    finally:
        torch.set_num_threads(threads)
    return cfg


@functools.lru_cache(maxsize=1)
def digits_run():
    """(run dir, config): tiny-cnn, PGD-AT on scikit-learn's digits, 4 epochs at eps 0.1; trained once a test run."""
    from fastfair import config

    sets = ["attack.eps=0.1", "attack.alpha=0.025", "attack.steps=5", "eval.eps=0.1", "eval.alpha=0.01",
            "train.lr=0.05", "train.lr_milestones=[3]", "data.batch_size=64", "eval.attacks=['clean']"]
    flags = {"method.name": "pgd-at", "data.dataset": "digits", "model.name": "tiny-cnn", "train.epochs": 4}
    out = once_per_run("digits", lambda folder: _train(folder / "run", sets, flags)) / "run"
    return out, config.resolve(None, flags, ["train.progress=false", "train.device='cpu'", *sets])


def cifar_npz(folder: Path, train: int = 30, test: int = 8) -> Path:
    """A few hundred real CIFAR-10 images (the first ``train`` train and ``test`` test images of each class) in an
    npz; skips without the data."""
    with np.load(real_data()) as f:
        def take(x, y, n):
            idx = np.concatenate([np.flatnonzero(y == c)[:n] for c in range(10)])
            return x[idx], y[idx]

        xt, yt = take(f["x_train"], f["y_train"], train)
        xs, ys = take(f["x_test"], f["y_test"], test)
    path = folder / "cifar10-small.npz"
    np.savez(path, x_train=xt, y_train=yt, x_test=xs, y_test=ys, class_names=np.array(CIFAR10))
    return path


def cifar_run(folder: Path) -> Path:
    """A real 2-epoch PGD-AT run of a width-8 tiny-cnn on the CIFAR-10 subset, evaluated and diagnosed."""
    from fastfair.evaluation.diagnose import diagnose_checkpoint

    out = folder / "pgd-at"
    _train(out, ["model.width=8", "attack.steps=3", "data.val_per_class=5", "data.batch_size=50",
                 "train.lr=0.05", "eval.attacks=['clean', 'pgd10']", "data.eval_batch_size=100"],
           {"method.name": "pgd-at", "data.dataset": "npz", "data.data_dir": str(cifar_npz(folder)),
            "model.name": "tiny-cnn", "train.epochs": 2})
    diagnose_checkpoint(out / "checkpoints" / "best_pgd.pt", attack="pgd10", device="cpu", tsne_points=80, quiet=True)
    return out


def cheap_aa_backend(model, eps, num_classes, seed):
    """Stand-in AutoAttack sub-attacks (seeded PGD) claiming the standard settings, to test the bookkeeping
    around AutoAttack (resume, result files) in seconds."""
    from fastfair.attacks import PGD, autoattack

    def make(steps, objective):
        def run(x, y):
            torch.manual_seed(seed + steps)
            e = torch.full((num_classes,), eps)
            return PGD(steps=steps, objective=objective)(model, x, y, e, e / 4)
        return run

    attacks = {"apgd-ce": make(1, "ce"), "apgd-t": make(2, "cw"), "fab-t": make(3, "ce"), "square": make(4, "cw")}
    return autoattack.Backend("cheap", attacks, autoattack.standard_settings(num_classes), "test", seed)
