"""The hot small ops of a training step (loss rows, per-class PGD step, random start) and their backends.

``torch`` is the PyTorch reference (:mod:`fastfair.ops.losses`, :mod:`fastfair.ops.steps`);
``triton`` is ``fastfair.kernels``' fused kernels, which must match the reference within
tolerance. A backend is an :class:`Ops` value handed to whoever runs the ops (the trainer
gives it to the method, the method to its attack): no process-global switch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fastfair.ops import losses, steps
from fastfair.registry import Registry


@dataclass(frozen=True)
class Ops:
    name: str
    row_loss: Callable
    pgd_step: Callable
    random_start: Callable


REFERENCE = Ops("torch", losses.row_loss, steps.pgd_step, steps.random_start)

BACKENDS: Registry[Callable[[], Ops]] = Registry("kernel backend")
BACKENDS.register("torch", "PyTorch reference ops (fastfair.ops.losses, fastfair.ops.steps)")(lambda: REFERENCE)


@BACKENDS.register("triton", "fused Triton kernels (fastfair.kernels); PyTorch reference where they cannot launch")
def _triton_ops() -> Ops:
    from fastfair import kernels  # needs triton, an optional dependency

    return Ops("triton", kernels.row_loss, kernels.pgd_step, kernels.random_start)


@BACKENDS.register("inductor", "PyTorch reference loss rows and PGD step (Inductor fuses them inside a compiled "
                               "step), the fused Triton random start (drawn eagerly, outside the graphs)")
def _inductor_ops() -> Ops:
    from fastfair import kernels

    return Ops("inductor", losses.row_loss, steps.pgd_step, kernels.random_start)


def backend(name: str) -> Ops:
    """The ops of backend ``name`` (``fastfair methods`` lists them)."""
    return BACKENDS.get(name)()
