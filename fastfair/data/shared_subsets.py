"""The real-data subsets that the tests and benchmarks read (``cifar10-subset.npz``, ``mnist-subset.npz`` in
``../shared/data`` or ``$FASTFAIR_SHARED_DATA``), made from the official data set files by ``fastfair data subset``.

Each keeps the images in their official order and takes fixed positions, never a random draw, so that anyone with
the official files makes the same arrays: uint8 ``x_train``, ``x_test`` (CIFAR-10 NCHW, MNIST without a channel
axis, as the project's files hold them) and int64 ``y_train``, ``y_test``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fastfair import data
from fastfair.errors import UserError
from fastfair.registry import Registry
from fastfair.rundir import write_npz_atomic


@dataclass(frozen=True)
class Subset:
    train: Callable[[int], np.ndarray]  # positions in the official training set, from its size
    test: Callable[[int], np.ndarray]
    channel_axis: bool  # kept (CIFAR-10, N x 3 x 32 x 32) or dropped (MNIST, N x 28 x 28)


SUBSETS: Registry[Subset] = Registry("data set with a test subset")
CIFAR10_BATCH, CIFAR10_PER_BATCH = 10_000, 1017  # torchvision joins data_batch_1..5 in order, 10,000 images each
SUBSETS.register("cifar10", "the first 1017 images of each of the five training batches (data_batch_1 .. 5): 5085, "
                            "475-537 a class; the first 1017 of the test batch: 87-114 a class")(Subset(
    lambda n: np.concatenate([np.arange(b, b + CIFAR10_PER_BATCH) for b in range(0, n, CIFAR10_BATCH)]),
    lambda n: np.arange(CIFAR10_PER_BATCH), True))
SUBSETS.register("mnist", "the first 17435 training images; the whole test set (10000)")(Subset(
    lambda n: np.arange(17_435), lambda n: np.arange(n), False))


def write(dataset: str, data_dir: str | None, out: str | Path) -> dict[str, tuple[int, ...]]:
    """Writes ``dataset``'s test subset, read from the official files under ``data_dir`` as ``--dataset DATASET``
    reads them (torchvision's folder), to ``out`` (compressed .npz, atomically); the arrays' shapes."""
    spec = SUBSETS.get(dataset)
    out = Path(out)
    if out.suffix != ".npz":
        raise UserError(f"--out {out}: the subset is written as an .npz (np.savez adds .npz to any other name)")
    bundle = data.load(dataset, data_dir)
    arrays = {}
    for split, take in (("train", spec.train), ("test", spec.test)):
        x, y = getattr(bundle, f"x_{split}").numpy(), getattr(bundle, f"y_{split}").numpy()
        keep = take(len(x))
        arrays[f"x_{split}"] = x[keep] if spec.channel_axis else x[keep, 0]
        arrays[f"y_{split}"] = y[keep].astype(np.int64)
    write_npz_atomic({k: arrays[k] for k in ("x_train", "y_train", "x_test", "y_test")}, out, compressed=True)
    return {k: v.shape for k, v in arrays.items()}
