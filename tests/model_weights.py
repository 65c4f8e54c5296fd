"""Weights for comparing an architecture with a reference implementation: every tensor a fixed function of
its name in the reference and its shape, so the reference's model (in ``tests/golden/gen_models_*.py``) and
fastfair's (loaded through the authors' key names of ``fastfair.evaluation.foreign.AUTHORS_KEYS``) hold the
same numbers exactly when the key mapping is right, and other numbers when it is not."""
from __future__ import annotations

import math
import zlib

import numpy as np
import torch


def fill(key: str, shape) -> torch.Tensor:
    """Seeded by crc32(key): convolution and linear weights He-scaled (so logits stay O(1) through 100+ layers),
    BN scales near 1, biases and running means near 0, running variances in [1, 1.5]."""
    shape = tuple(shape)
    leaf = key.rpartition(".")[2]
    if leaf == "num_batches_tracked":
        return torch.zeros(shape, dtype=torch.long)
    g = torch.Generator().manual_seed(zlib.crc32(key.encode()))
    if leaf == "running_var":
        return 1 + 0.5 * torch.rand(shape, generator=g)
    noise = torch.randn(shape, generator=g)
    if leaf in ("running_mean", "bias"):
        return 0.1 * noise
    if len(shape) == 1:  # a norm layer's scale
        return 1 + 0.1 * noise
    return noise * math.sqrt(2 / math.prod(shape[1:]))


def key_shapes(state: dict) -> dict[str, np.ndarray]:
    """The arrays a golden file keeps of a reference's state dict: its key names in order and their shapes
    (rows padded with -1)."""
    keys = list(state)
    shapes = np.full((len(keys), 4), -1, dtype=np.int64)
    for i, k in enumerate(keys):
        shapes[i, :state[k].dim()] = state[k].shape
    return {"keys": np.array(keys), "shapes": shapes}


def filled_state(keys, shapes) -> dict[str, torch.Tensor]:
    """The reference's state dict (named as the reference names it) holding :func:`fill`'s numbers."""
    return {str(k): fill(str(k), [d for d in row if d >= 0]) for k, row in zip(keys, shapes)}
