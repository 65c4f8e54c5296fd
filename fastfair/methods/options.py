"""Class-wise options that combine with any method: CCM, CCR, cost-sensitive weights, HE, ...

An option is not a method: it owns a few per-class vectors in the
:class:`~fastfair.training.class_state.ClassState` and updates them at epoch ends (the design sketch's
"add-ons that several methods share are options of the state"). Methods read the vectors by
name: ``eps`` (the product of the base eps and every option's ``eps_*`` factor),
``kl_weight`` (TRADES family), ``loss_weight`` (any method, via :meth:`Method.reduce`).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from fastfair.training.class_state import ClassState
from fastfair.config import Config
from fastfair.registry import Registry

if TYPE_CHECKING:
    from fastfair.methods.base import Method

OPTIONS: Registry[type["Option"]] = Registry("method option")


class Option:
    """One switchable add-on; :meth:`enabled` reads the config, the rest mirror :class:`Method`'s hooks."""

    eps_factor: ClassVar[str | None] = None  # name of the per-class vector this option multiplies eps by

    def __init__(self, cfg: Config, method: "Method"):
        self.cfg, self.method = cfg, method

    @staticmethod
    def enabled(cfg: Config) -> bool:
        raise NotImplementedError

    def setup(self, state: ClassState) -> None:
        """Create this option's vectors (after the method created its own)."""

    def begin_epoch(self, model, epoch: int) -> None:
        """Called before the epoch's first step (outside the step: may read the model once)."""

    def end_epoch(self, state: ClassState, epoch: int, stats: dict) -> None:
        """Update vectors for epoch ``epoch + 1`` from the epoch's counters and validation."""


def train_robust_fraction(stats: dict, state: ClassState):
    """A_k of the finished epoch as a (C,) device tensor in [0, 1] (CFA Sec. 4.1: train robust accuracy)."""
    import torch

    return torch.tensor(stats["train_acc_per_class"], dtype=torch.float32, device=state.device) / 100.0
