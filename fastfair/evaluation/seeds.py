"""Seeds for the random starts of evaluation attacks (PGD/CW/T-PGD uniform start, AutoAttack).

Each attack call runs under its own seed, derived from the evaluation seed (``eval.seed``), the
attack's name and the batch index, inside ``torch.random.fork_rng``: the same checkpoint, data and
settings give the same numbers every time, and the caller's random stream (training, say) is left
exactly where it was.
"""
from __future__ import annotations

import contextlib
import hashlib

import torch


def derive(seed: int, *parts) -> int:
    """A 63-bit seed from ``seed`` and ``parts``, the same on every machine and Python process."""
    digest = hashlib.sha256(repr((int(seed), *parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@contextlib.contextmanager
def seeded(seed: int, *parts, device: torch.device):
    """Run the block with torch's generators seeded by ``derive(seed, *parts)``; restore them after."""
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive(seed, *parts))
        yield
