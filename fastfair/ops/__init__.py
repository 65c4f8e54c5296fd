"""The hot small ops of a training step (loss rows, per-class PGD step, random start) and their backends.

``torch`` is the PyTorch reference (:mod:`fastfair.ops.losses`, :mod:`fastfair.ops.steps`);
``triton`` is ``fastfair.kernels``' fused kernels, which must match the reference within
tolerance. Callers always go through :func:`get`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fastfair.ops import losses, steps
from fastfair.registry import Registry


@dataclass(frozen=True)
class Ops:
    row_loss: Callable
    pgd_step: Callable
    random_start: Callable


BACKENDS: Registry[Callable[[], Ops]] = Registry("kernel backend")


@BACKENDS.register("torch", "PyTorch reference ops (fastfair.ops.losses, fastfair.ops.steps)")
def _torch_ops() -> Ops:
    return Ops(losses.row_loss, steps.pgd_step, steps.random_start)


@BACKENDS.register("triton", "fused Triton kernels (fastfair.kernels); PyTorch reference where they cannot launch")
def _triton_ops() -> Ops:
    from fastfair import kernels  # needs triton, an optional dependency

    return Ops(kernels.row_loss, kernels.pgd_step, kernels.random_start)


_active: dict[str, Ops] = {}


def use(name: str) -> Ops:
    """Select the backend every later :func:`get` returns."""
    _active["ops"] = BACKENDS.get(name)()
    _active["name"] = name
    return _active["ops"]


def get() -> Ops:
    if "ops" not in _active:
        use("torch")
    return _active["ops"]
