"""Training on a subset of classes (ME paper Sec. 2.2: binary classification AT, e.g. cat vs dog)."""
from __future__ import annotations

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
    return DataBundle(bundle.name, x_train, y_train, x_test, y_test, [bundle.classes[k] for k in classes])
