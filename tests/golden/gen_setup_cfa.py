"""PKU-ML/CFA's training setup (train.py, generate_validation.py, utils.py): the lr of every epoch from train.py's
lr_schedule as its epoch loop applies it, the optimiser, attack and epoch statements of its __main__ block with
get_args()'s defaults, generate_validation.py's transform and loader, where the input is normalised, and the
checkpoint block of the epoch loop on made-up test results (torch.save recording the file names)."""
import ast
import re

import numpy as np
import torch

from conformance import TinyNet
from conformance_setup import (Saved, loader_facts, made_up_results, normalisation, optimiser_facts, statements,
                               transform_facts)
from gen_cfa import epoch_loop
from record import load_function, script_namespace

REPO = "PKU-ML/CFA"
PINNED = "071f3334a59d144cedbe65b18019c9757bece6f2"


def main_block(path):
    tree = ast.parse(path.read_text())
    return next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)).body


def generate(path, inp):
    import sys

    import utils

    train = path / "train.py"
    import argparse

    ns = script_namespace(np=np, argparse=argparse)
    saved, sys.argv = sys.argv, ["train.py"]
    try:
        args = load_function(train, "get_args", ns)()  # the argparse defaults
    finally:
        sys.argv = saved
    ns["args"] = args
    load_function(train, "lr_schedule", ns)
    load_function(train, "lr_schedule_wrn", ns)
    main, loop = main_block(train), epoch_loop(train)
    setup = statements(main, "eps = args.epsilon", "alpha = args.pgd_alpha", "iteration = args.attack_iters",
                       "epochs = args.epochs if", "opt = torch.optim.SGD", "save_threshold = ")
    ns["params"] = TinyNet().parameters()
    exec(setup, ns)
    lr_step = statements(loop, "if args.model == 'WRN':", "opt.param_groups[0].update(lr=lr)")
    lrs = []
    for epoch in range(ns["epochs"]):
        ns["epoch"] = epoch
        exec(lr_step, ns)
        lrs.append(ns["opt"].param_groups[0]["lr"])

    # generate_validation.py: the training transform and loader (n = 100 per class is checked in setup_cfa's split)
    gv = ast.parse((path / "generate_validation.py").read_text())
    gmain = next(n for n in gv.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)).body
    cifar10 = next(n for n in gmain if isinstance(n, ast.If) and "cifar10" in ast.unparse(n.test)).body
    from torch.utils.data.sampler import SubsetRandomSampler
    from torchvision import transforms

    gns = {"transforms": transforms, "torch": torch, "ori_set": list(range(10)),
           "train_sampler": SubsetRandomSampler(list(range(10)))}
    exec(statements(cifar10, "train_transform_ = ", "train_loader = "), gns)

    x = inp.x[:4]
    setup_facts = {**loader_facts(gns["train_loader"]), "epochs": int(ns["epochs"]), **optimiser_facts(ns["opt"]),
                   "eps": float(ns["eps"]), "alpha": float(ns["alpha"]), "steps": int(ns["iteration"]),
                   **transform_facts(gns["train_transform_"]),
                   # train_epoch / attack.py call model(normalize_cifar(x)): the CIFAR-10 mean and std in front
                   "normalise": normalisation(TinyNet(), x, utils.normalize_cifar)}

    # the checkpoint block: after each epoch, on its test robust accuracy (avg, per class)
    results = made_up_results(ns["epochs"], seed=11, peak=60)
    keep = statements(loop, "if epoch >= 0.5 * args.epochs:")
    sv = Saved()
    ns.update(torch=sv, model=TinyNet(), EMA_model=TinyNet(), FAWA_model=TinyNet())
    index = []
    for epoch, acc in enumerate(results):
        log = torch.zeros(epoch + 1, 7)
        log[:, 6] = torch.from_numpy(results[: epoch + 1].mean(1))
        cw = torch.zeros(epoch + 1, 6, 10)
        cw[:, 5] = torch.from_numpy(results[: epoch + 1])
        avg = np.zeros((epoch + 1, 4))
        ns.update(epoch=epoch, log_tensor=log, cw_tensor=cw, EMA_data=avg, FAWA_data=avg)
        exec(keep, ns)
        index.append(float(log[-1, -1] + cw[-1, -1].min()))
    main_files = [f for f in sv.files if re.fullmatch(r".*/\d+\.pth", f)]
    saved_epochs = [int(re.search(r"(\d+)\.pth$", f).group(1)) for f in main_files]
    # the model reported: the saved one of highest index (the paper's 'best': avg + worst-class robust)
    kept = max(saved_epochs, key=lambda e: index[e])
    print(f"CFA setup: lr {sorted(set(lrs))}, {len(saved_epochs)} models saved from epoch {min(saved_epochs)}, "
          f"kept {kept}; best of all epochs {int(np.argmax(index))}")
    arrays = {"lr": np.array(lrs), "select.results": results, "select.kept": np.int64(kept),
              "select.saved": np.array(saved_epochs)}
    sources = {"lr": {"file": "train.py", "function": "lr_schedule (epoch loop)"},
               "setup": {"file": "train.py", "function": "get_args, __main__; generate_validation.py"},
               "select": {"file": "train.py", "function": "__main__ (epoch loop: save models)"}}
    meta = {"file": "train.py", "function": "-", "sources": sources, "setup": setup_facts,
            "select": "select.results: made-up test robust accuracy per epoch and class; select.saved: the epochs "
                      "whose main model the code saves; select.kept: of those, the one of highest avg + worst"}
    return {"setup_cfa": (arrays, meta)}
