"""The hot small ops of training (loss rows, PGD step, random start) behind one switch.

``torch`` is the PyTorch reference in :mod:`fastfair.losses` and :mod:`fastfair.attacks`;
other backends (``fastfair.kernels``' fused Triton ops) register here under their own name
and must match it within tolerance. Callers always go through :func:`get`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .registry import Registry


@dataclass(frozen=True)
class Ops:
    row_loss: Callable
    pgd_step: Callable
    random_start: Callable


BACKENDS: Registry[Callable[[], Ops]] = Registry("kernel backend")


@BACKENDS.register("torch", "PyTorch reference ops (fastfair.losses, fastfair.attacks)")
def _torch_ops() -> Ops:
    from . import attacks, losses

    return Ops(losses.row_loss, attacks.pgd_step_reference, attacks.random_start_reference)


@BACKENDS.register("triton", "fused Triton kernels (fastfair.kernels); PyTorch reference where they cannot launch")
def _triton_ops() -> Ops:
    from . import kernels

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
