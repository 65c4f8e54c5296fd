"""Training on a subset of classes (ME paper Sec. 2.2: binary classification AT, e.g. cat vs dog)."""
from __future__ import annotations

import dataclasses

import torch

from fastfair.data.datasets import DataBundle
from fastfair.errors import UserError


def select(bundle: DataBundle, classes: list[int]) -> DataBundle:
    """Keep only ``classes`` (train and test), relabelled 0..k-1 in the order given; empty keeps all."""
    if not classes:
        return bundle
    c = bundle.num_classes
    bad = [k for k in classes if not 0 <= k < c]
    if bad or len(set(classes)) != len(classes) or len(classes) < 2:
        raise UserError(f"data.classes needs at least two distinct class indices in 0..{c - 1} "
                        f"(for example --classes 3,5); got {classes}")
    relabel = torch.full((c,), -1, dtype=torch.int64)
    relabel[torch.tensor(classes)] = torch.arange(len(classes))

    def keep(x, y):
        new = relabel[y]
        mask = new >= 0
        return x[mask], new[mask]

    x_train, y_train = keep(bundle.x_train, bundle.y_train)
    x_test, y_test = keep(bundle.x_test, bundle.y_test)
    # replace keeps the bundle's class (a FolderBundle's file indices stay file indices)
    return dataclasses.replace(bundle, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                               classes=[bundle.classes[k] for k in classes])


def drop_from_training(bundle: DataBundle, splits: dict, drop: list[int]) -> dict:
    """Remove the ``drop`` classes' images from train and val, as Tian et al. (KDD 2021, Sec. 6.1) re-train.

    The labels and the head are not renumbered: the re-trained model's predictions must be compared, class
    index for class index, with the model trained on every class. The test split is left whole."""
    if not drop:
        return splits
    c = bundle.num_classes
    bad = [k for k in drop if not 0 <= k < c]
    if bad or len(set(drop)) != len(drop):
        raise UserError(f"data.drop_classes takes distinct class indices in 0..{c - 1} of {bundle.name} "
                        f"({', '.join(f'{i} {n}' for i, n in enumerate(bundle.classes))}); got {drop}")
    if c - len(drop) < 2:
        raise UserError(f"data.drop_classes={drop} leaves {c - len(drop)} of the {c} classes to train on; "
                        "a classifier needs at least two")
    gone = torch.tensor(drop)

    def keep(x, y):
        mask = ~torch.isin(y, gone)
        return x[mask], y[mask]

    return {"train": keep(*splits["train"]), "val": keep(*splits["val"]), "test": splits["test"]}


def dropped_note(drop: list[int], classes: list[str]) -> str:
    """The words every per-class table of a run trained with ``data.drop_classes`` carries ("" for none), so a
    dropped class's near-zero accuracy is not read as a result (Tian et al., KDD 2021, Sec. 6.1)."""
    if not drop:
        return ""
    named = ", ".join(f"class {i}" + ("" if classes[i] == str(i) else f" ({classes[i]})") for i in drop)
    its, rows = ("its", "its row counts") if len(drop) == 1 else ("their", "their rows count")
    return (f"trained without {named} (data.drop_classes): the model never saw {its} training images ({rows} in "
            "the mean and the worst class)")
