"""hannxu123/fair_robust's training setup for frlrmrw.py (with data_loader.py and pre_resnet.py): the argparse
defaults of its __main__ block, main()'s optimiser and MultiStepLR statements stepped as its epoch loop steps them
(`lr_scheduler.step(now_epoch)` after each 1-based epoch), frl_train's attack settings (main's `configs`),
get_cifar10_loader's loaders, transform and split (a CIFAR10 stand-in with made-up labels, as gen_setup_wat.py),
and what PreActResNet18's first convolution reads. The code keeps no checkpoint (it tests every 5 epochs)."""
import ast
import warnings

import numpy as np
import torch

from conformance_setup import (split_record, loader_facts, made_up_labels, normalisation, optimiser_facts, parse_args,
                               statements, transform_facts)
from gen_setup_wat import loaders

REPO = "hannxu123/fair_robust"
PINNED = "a80547def881cb4ca99b50e7544f997f9a0210a7"


def generate(path, inp):
    import data_loader
    from pre_resnet import PreActResNet18

    tree = ast.parse((path / "frlrmrw.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)).body
    args = parse_args(block, [])
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main").body
    model = PreActResNet18()
    ns = {"args": args, "optim": torch.optim, "torch": torch, "h_net": model}
    exec(statements(main, "optimizer = optim.SGD(", "lr_scheduler = ", "configs = ", "maxepoch = "), ns)
    loop = next(n for n in main if isinstance(n, ast.For))
    assert ast.unparse(loop.iter) == "range(1, maxepoch + 1)"
    step = statements(loop.body, "lr_scheduler.step(now_epoch)")
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # step(epoch) is deprecated; it still sets the closed-form lr
        for now_epoch in range(1, ns["maxepoch"] + 1):
            lrs.append(ns["optimizer"].param_groups[0]["lr"])  # the lr frl_train trains this epoch with
            ns["now_epoch"] = now_epoch
            exec(step, ns)

    labels = made_up_labels()
    train, valid = loaders(data_loader, labels)
    c = ns["configs"]
    facts = {**loader_facts(train), "epochs": int(ns["maxepoch"]), **optimiser_facts(ns["optimizer"]),
             "eps": float(c["epsilon"]), "alpha": float(c["step_size"]), "steps": int(c["num_steps"]),
             **transform_facts(train.dataset.transform), "normalise": normalisation(model, inp.x[:4])}
    print(f"FRL setup: lr {sorted(set(lrs))}, {facts}")
    arrays = {"lr": np.array(lrs), "split.val": split_record(train, valid)}
    sources = {"lr": {"file": "frlrmrw.py", "function": "main (MultiStepLR, step(now_epoch))"},
               "setup": {"file": "frlrmrw.py", "function": "__main__ argparse, main; data_loader.py"},
               "split": {"file": "data_loader.py", "function": "get_cifar10_loader"}}
    meta = {"file": "frlrmrw.py", "function": "-", "sources": sources, "setup": facts,
            "split": "split.val: the validation images (indices into made_up_labels()); the rest train"}
    return {"setup_frl": (arrays, meta)}
