"""boqili/WAT's training setup (worst_class_adversarial_train.py, data_loader.py): the script's argparse defaults,
the lr of every epoch from its adjust_learning_rate as its epoch loop calls it (`adjust_learning_rate(optimizer,
epoch + 1)`), its optimiser statement, data_loader.get_cifar10_loader's loaders, training transform and split (on a
CIFAR10 stand-in with made-up labels, each image holding its index), what ResNet18's first convolution reads, and
the checkpoint statement of the epoch loop (torch.save recording the names)."""
import ast
import re

import numpy as np
import torch

from conformance_setup import (split_record, Saved, fake_cifar10, loader_facts, made_up_labels, normalisation,
                               optimiser_facts, parse_args, statements, transform_facts)
from record import load_function

REPO = "boqili/WAT"
PINNED = "62d1184f9b88909c9e782ab8234128324235ac84"


def loaders(data_loader, labels):
    """get_cifar10_loader on the stand-in: (train, valid) loaders and the images (indices) of each split."""
    real = data_loader.datasets.CIFAR10
    data_loader.datasets.CIFAR10 = fake_cifar10(labels)
    try:
        train, valid, _ = data_loader.get_cifar10_loader(batch_size=128)
    finally:
        data_loader.datasets.CIFAR10 = real
    return train, valid


def generate(path, inp):
    import data_loader
    from models import ResNet18

    script = path / "worst_class_adversarial_train.py"
    tree = ast.parse(script.read_text())
    args = parse_args(tree.body, [])
    ns = {"args": args, "optim": torch.optim, "torch": torch}
    adjust = load_function(script, "adjust_learning_rate", ns)
    model = ResNet18(10)
    ns.update(model=model, adjust_learning_rate=adjust)
    exec(statements(tree.body, "optimizer = optim.SGD("), ns)
    loop = next(n for n in tree.body if isinstance(n, ast.For))
    assert ast.unparse(loop.iter) == "tqdm(range(start_epoch, args.epochs))"
    step = statements(loop.body, "adjust_learning_rate(optimizer, epoch + 1)")
    lrs = []
    for epoch in range(0, args.epochs):
        ns["epoch"] = epoch
        exec(step, ns)
        lrs.append(ns["optimizer"].param_groups[0]["lr"])

    labels = made_up_labels()
    train, valid = loaders(data_loader, labels)
    facts = {**loader_facts(train), "epochs": int(args.epochs), **optimiser_facts(ns["optimizer"]),
             "eps": float(args.epsilon), "alpha": float(args.step_size), "steps": int(args.num_steps),
             **transform_facts(train.dataset.transform), "normalise": normalisation(model, inp.x[:4])}

    keep = statements(loop.body, "if (epoch + 1) % 3 == 0:")
    sv = Saved()
    ns.update(torch=sv, save_checkpoint=lambda state, checkpoint, filename: sv.save(state, filename),
              param_list="p", optimizer=ns["optimizer"])
    for epoch in range(args.epochs):
        ns["epoch"] = epoch
        exec(keep, ns)
    saved_epochs = [int(re.match(r"(\d+)\.pt$", f).group(1)) for f in sv.files]
    print(f"WAT setup: lr {sorted(set(lrs))}, saved every third epoch: {saved_epochs[:4]}..{saved_epochs[-1]}")
    arrays = {"lr": np.array(lrs), "select.saved": np.array(saved_epochs),
              "split.val": split_record(train, valid)}
    sources = {"lr": {"file": "worst_class_adversarial_train.py", "function": "adjust_learning_rate (epoch + 1)"},
               "setup": {"file": "worst_class_adversarial_train.py", "function": "argparse defaults; data_loader.py"},
               "split": {"file": "data_loader.py", "function": "get_cifar10_loader"},
               "select": {"file": "worst_class_adversarial_train.py", "function": "epoch loop (save_checkpoint)"}}
    meta = {"file": "worst_class_adversarial_train.py", "function": "-", "sources": sources, "setup": facts,
            "split": "split.val: the validation images (indices into made_up_labels()); the rest train"}
    return {"setup_wat": (arrays, meta)}
