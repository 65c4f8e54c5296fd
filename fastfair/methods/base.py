"""The Method interface: how one training step makes its examples and its loss.

A method declares ``defaults`` (config keys its paper's code uses: attack objective, init, BN
mode, loss weights) and implements ``perturb`` and ``loss``; ``setup`` and ``end_epoch`` let it
own per-class vectors in :class:`~fastfair.classwise.ClassState` and update them once per epoch.
Nothing in ``perturb``/``loss`` may sync with the host.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from ..attacks import PGD
from ..classwise import ClassState
from ..config import Config
from ..registry import Registry

METHODS: Registry[type["Method"]] = Registry("method")


class Method:
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, cfg: Config):
        self.cfg = cfg
        a = cfg.attack
        self.attack = PGD(steps=a.steps, objective=a.objective, init=a.init, bn_mode=a.bn_mode)

    def setup(self, state: ClassState) -> None:
        """Create the per-class vectors this method reads (eps_k and alpha_k for every method)."""
        state.add_vector("eps", self.cfg.attack.eps)
        state.add_vector("alpha", self.cfg.attack.alpha)

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, state: ClassState) -> torch.Tensor:
        return self.attack(model, x, y, state["eps"], state["alpha"])

    def loss(self, model: nn.Module, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
             state: ClassState) -> tuple[torch.Tensor, torch.Tensor]:
        """(scalar loss, logits whose per-class accuracy is counted as train robust accuracy)."""
        raise NotImplementedError

    def end_epoch(self, state: ClassState, epoch: int, stats: dict) -> None:
        """Update per-class vectors from the epoch's counters (``stats``, read once)."""
