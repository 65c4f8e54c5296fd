"""TrustAI/FAAL's fine-tuning setup (run_prn.py, ft_prn.py, utils.py): run_prn.py run with os.system recording its
commands, the first ft_prn.py command's flags parsed by ft_prn.py's own argparse statements; ft_prn.py's
optimiser statement and its lr-schedule block, read and stepped as its epoch loop does (`lr =
scheduler.get_last_lr()[0]` at the start, `scheduler.step()` at the end); utils.get_loaders' training loader and
transform (on a CIFAR10 stand-in), the normalisation block (`--normalization std`); and the loop's three
checkpoint statements on made-up per-epoch results (torch.save recording the names)."""
import ast
import os
import shlex

import numpy as np
import torch

from conformance import TinyNet
from conformance_setup import (Saved, fake_cifar10, loader_facts, made_up_labels, optimiser_facts, parse_args,
                               statements, transform_facts)

REPO = "TrustAI/FAAL"
PINNED = "b20ee9dbe60c5ab700eaab3d41faa10e5295d39a"


def commands(path):
    """The shell commands run_prn.py runs (os.system recording them instead)."""
    seen = []
    real = os.system
    os.system = seen.append
    try:
        exec(compile((path / "run_prn.py").read_text(), "run_prn.py", "exec"), {"__name__": "run_prn"})
    finally:
        os.system = real
    return seen


def generate(path, inp):
    import utils

    cmd = next(c for c in commands(path) if "ft_prn.py" in c and "--loss AT " in c)
    argv = shlex.split(cmd.split("ft_prn.py", 1)[1])
    tree = ast.parse((path / "ft_prn.py").read_text())
    args = parse_args(tree.body, argv)
    model = TinyNet()
    real = utils.datasets.CIFAR10
    utils.datasets.CIFAR10 = fake_cifar10(made_up_labels())
    try:
        train_loader, _ = utils.get_loaders(args.data_dir, args.batch_size)
    finally:
        utils.datasets.CIFAR10 = real
    ns = {"args": args, "torch": torch, "model": model, "train_loader": train_loader,
          "cifar10_mean": utils.cifar10_mean, "cifar10_std": utils.cifar10_std}
    exec(statements(tree.body, "epsilon = args.epsilon", "alpha = args.alpha", "if args.normalization == 'std':",
                    "opt = torch.optim.SGD(", "lr_steps = ", "if args.lr_schedule == 'cyclic':"), ns)
    loop = next(n for n in tree.body if isinstance(n, ast.For))
    assert ast.unparse(loop.iter) == "range(args.epochs)"
    read = statements(loop.body, "lr = scheduler.get_last_lr()")
    step = statements(loop.body, "if args.lr_schedule != 'cyclic':")
    lrs = []
    for epoch in range(args.epochs):
        exec(read, ns)
        lrs.append(ns["lr"])
        exec(step, ns)
    mu, std = ns["mu"].flatten(), ns["std"].flatten()
    facts = {**loader_facts(train_loader), "epochs": int(args.epochs), **optimiser_facts(ns["opt"]),
             "eps": float(ns["epsilon"]), "alpha": float(ns["alpha"]), "steps": int(args.steps),
             **transform_facts(train_loader.dataset.transform),
             # the training step calls model(normalize(X_adv, mu, std))
             "normalise": "none" if torch.equal(mu, torch.zeros(3)) and torch.equal(std, torch.ones(3)) else "mean/std"}

    # the checkpoint statements of the loop on made-up results: val_adv_acc (PGD on the CW loss, average) and
    # cw_results (per class), as evaluate_pgd returns them
    results = np.random.default_rng(21).uniform(0.2, 0.6, (8, 10))  # no trend: the rules pick inside the run
    keep = statements(loop.body, "if val_adv_acc >= highest_acc", "if torch.min(cw_results) >= highest_acc_worst",
                      "if torch.min(cw_results) + val_adv_acc >= highest_acc_both", "if epoch == args.epochs - 1")
    init = statements(tree.body, "highest_acc = 0", "highest_acc_worst = 0", "highest_acc_both = 0")
    sv = Saved()
    ns.update(torch=sv, os=os)
    exec(init, ns)
    for epoch, acc in enumerate(results):
        ns.update(epoch=epoch, cw_results=torch.from_numpy(acc), val_adv_acc=float(acc.mean()))
        exec(keep, ns)
    kept = {k: int(ns[f"highest_{k}_idx"]) for k in ("worst", "both")}
    kept["avg"] = int(ns["highest_idx"])
    print(f"FAAL setup: {argv}\n  lr per epoch {lrs}, kept {kept}, {facts}")
    arrays = {"lr": np.array(lrs), "select.results": results.astype(np.float32),
              "select.kept": np.int64(kept["worst"])}
    sources = {"lr": {"file": "ft_prn.py", "function": "lr schedule block (multistep), epoch loop"},
               "setup": {"file": "ft_prn.py", "function": "argparse (run_prn.py's flags); utils.get_loaders"},
               "select": {"file": "ft_prn.py", "function": "epoch loop (worst_best.pth, run_prn.py evaluates it)"}}
    meta = {"file": "ft_prn.py", "function": "-", "sources": sources, "setup": facts, "flags": argv, "kept": kept,
            "select": "select.results: made-up per-class robust accuracy per epoch (no ties: the code keeps the "
                      "last of equal scores, fastfair the first); "
                      "select.kept: the epoch of the worst_best.pth the code keeps (run_prn.py evaluates it)"}
    return {"setup_faal": (arrays, meta)}
