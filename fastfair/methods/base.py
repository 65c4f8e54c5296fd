"""The Method interface: how one training step makes its examples and its loss.

A method declares ``defaults`` (config keys its paper's code uses: attack objective, init, BN
mode, loss weights) and implements ``perturb`` and ``loss``; ``setup``, ``begin_epoch`` and
``end_epoch`` let it own per-class vectors in :class:`~fastfair.training.class_state.ClassState` and update
them once per epoch. The enabled :mod:`options <fastfair.methods.options>` (CCM, CCR,
cost-sensitive, HE, adversarial classes) ride along on the same hooks. Nothing in
``perturb``/``loss`` may sync with the host.
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from fastfair.attacks import PGD
from fastfair.training.class_state import ClassState
from fastfair.config import Config
from fastfair.registry import Registry
from fastfair.methods.options import OPTIONS

METHODS: Registry[type["Method"]] = Registry("method")


class Method:
    defaults: ClassVar[dict[str, Any]] = {}
    needs_initial_validation: ClassVar[bool] = False  # FRL: update from validation before the first epoch
    supports_margin: ClassVar[bool] = False  # its CE terms go through ce_logits (HE margin)

    def __init__(self, cfg: Config):
        self.cfg = cfg
        a = cfg.attack
        self.attack = PGD(steps=a.steps, objective=a.objective, init=a.init, bn_mode=a.bn_mode)
        self.options = [OPTIONS.get(n)(cfg, self) for n in OPTIONS if OPTIONS.get(n).enabled(cfg)]
        self.eps_factors: list[str] = [o.eps_factor for o in self.options if o.eps_factor]

    def setup(self, state: ClassState) -> None:
        """Create the per-class vectors this method reads (eps_k and alpha_k for every method), then the options'."""
        state.add_vector("eps", self.cfg.attack.eps)
        state.add_vector("alpha", self.cfg.attack.alpha)
        for option in self.options:
            option.setup(state)
        self.refresh_eps(state)

    def refresh_eps(self, state: ClassState) -> None:
        """eps_k = eps * prod of the options' per-class factors (CCM, FRL remargin, adversarial classes)."""
        eps = torch.full((state.num_classes,), self.cfg.attack.eps, device=state.device)
        for name in self.eps_factors:
            eps = eps * state[name]
        state.set("eps", eps)

    def begin_epoch(self, model: nn.Module, epoch: int) -> None:
        for option in self.options:
            option.begin_epoch(model, epoch)

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, state: ClassState) -> torch.Tensor:
        return self.attack(model, x, y, state["eps"], state["alpha"])

    def loss(self, model: nn.Module, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
             state: ClassState) -> tuple[torch.Tensor, torch.Tensor]:
        """(scalar loss, logits whose per-class accuracy is counted as train robust accuracy)."""
        raise NotImplementedError

    def reduce(self, rows: torch.Tensor, y: torch.Tensor, state: ClassState) -> torch.Tensor:
        """mean_i w_{y_i} loss_i with the cost-sensitive class weights when set (Benz et al. 2021), else the mean."""
        if "loss_weight" in state.vectors:
            return (rows * state["loss_weight"][y]).mean()
        return rows.mean()

    def ce_logits(self, model: nn.Module, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Logits the CE terms see: HE subtracts the angular margin, s (cos_y - m) (Pang et al. 2020, Eq. 6)."""
        m = self.cfg.method.he_margin
        if m == 0.0:
            return z
        return z - (model.head.scale * m) * F.one_hot(y, z.shape[1]).to(z.dtype)

    def end_epoch(self, state: ClassState, epoch: int, stats: dict) -> None:
        """Update per-class vectors from the epoch's counters and validation (``stats``, read once)."""
        for option in self.options:
            option.end_epoch(state, epoch, stats)
        self.refresh_eps(state)

    def before_training(self, state: ClassState, val: dict) -> None:
        """Called once before the first epoch with a validation of the initial model (when ``needs_initial_validation``)."""
