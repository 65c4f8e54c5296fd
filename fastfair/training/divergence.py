"""A diverged run stops: non-finite numbers are found at the epoch's sync and before any checkpoint.

The training step never syncs, so a NaN is seen once per epoch, in what :meth:`ClassState.read`
brings to the host (the loss, the per-class vectors), and in every tensor a checkpoint would hold
(one sync for all of them). Either stops the run before the epoch's metrics line and checkpoints
are written, so ``last.pt`` keeps the last good epoch and the run can resume with another setting.
"""
from __future__ import annotations

import math

import torch

from fastfair.errors import UserError
from fastfair.scaleout import distributed


class Diverged(UserError):
    """Training produced a non-finite loss, per-class vector or weight (the fix is a setting)."""


def nonfinite_stats(stats: dict) -> list[str]:
    """Names of the non-finite values among the epoch's loss and per-class vectors (host numbers)."""
    bad = [] if math.isfinite(stats["loss"]) else [f"loss {stats['loss']}"]
    return bad + [f"per-class vector {name}" for name, values in stats["vectors"].items()
                  if not all(math.isfinite(v) for v in values)]


def _tensors(obj, prefix: str = ""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}[{i}]")


def nonfinite_tensors(obj) -> list[str]:
    """Names of the floating tensors in a (nested) state dict holding a NaN or inf; one host sync per device."""
    by_device: dict[torch.device, list] = {}
    for name, t in _tensors(obj):
        if t.is_floating_point() and t.numel():
            by_device.setdefault(t.device, []).append((name, t))
    bad = []
    for named in by_device.values():
        finite = torch.stack([torch.isfinite(t).all() for _, t in named]).tolist()
        bad += [n for (n, _), ok in zip(named, finite) if not ok]
    return bad


def diverged(epoch: int, what: list[str], run: str, resumable_from: int | None, lr: float) -> Diverged:
    """The error that stops a diverged run: what went non-finite, what was kept, the command that continues."""
    shown = ", ".join(what[:4]) + (f" and {len(what) - 4} more" if len(what) > 4 else "")
    kept = (f"checkpoints/last.pt keeps epoch {resumable_from + 1}" if resumable_from is not None
            else "no epoch finished, so it restarts from the first")
    return Diverged(f"training diverged in epoch {epoch + 1} (non-finite {shown}); nothing of that epoch was saved "
                    f"and {kept}. Continue with a lower learning rate: "
                    f"{distributed.command(f'train --out {run} --resume --set train.lr={lr / 10:g}')}")
