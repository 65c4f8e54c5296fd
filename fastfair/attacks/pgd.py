"""One L-inf PGD engine for training and evaluation (Madry et al. 2018, Eq. 2-3).

Objectives: ``ce`` (PGD-AT, PGD-k eval), ``kl`` (TRADES-PGD: KL(p(x) || p(x'))), ``cw``
(CW-inf margin), ``ce`` with ``temperature`` (Temperature-PGD, Tian et al.). FGSM is one step
with ``alpha = eps``. ``eps`` and ``alpha`` are per-class ``(C,)`` tensors gathered by label
(per-class budgets of CFA/FRL), so changing them never recompiles. During the attack the
model's parameters are frozen (no weight gradients are computed) and only
``torch.autograd.grad`` w.r.t. the input is taken.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from fastfair.errors import UserError
from fastfair.ops import REFERENCE, Ops
from fastfair.ops.steps import INITS

OBJECTIVES = ("ce", "kl", "cw")
BN_MODES = ("train", "eval")


@contextlib.contextmanager
def attack_mode(model: nn.Module, bn_mode: str):
    """Freeze parameters and set the BN mode for attack generation; restore both afterwards."""
    if bn_mode not in BN_MODES:
        raise UserError(f"unknown BN mode {bn_mode!r}; known: {', '.join(BN_MODES)}")
    was_training = model.training
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    model.train(bn_mode == "train")
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)
        model.train(was_training)


def per_class(value, num_classes: int, device) -> torch.Tensor:
    """A float or per-class vector as a float32 ``(C,)`` tensor on ``device``."""
    t = torch.as_tensor(value, dtype=torch.float32, device=device)
    return t.expand(num_classes).contiguous() if t.dim() == 0 else t


class StopRule(Protocol):
    """A per-sample early stop handed to :class:`PGD` (FAT's, :mod:`fastfair.methods.fat`): after each
    step's forward it says which samples still move; the others keep their current point."""

    def start(self, y: torch.Tensor) -> Any:
        """The rule's per-sample state before the first step (device tensors)."""

    def update(self, state: Any, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(bool mask of samples that take this step, the new state), from this step's logits."""


@dataclass(frozen=True)
class PGD:
    """L-inf PGD with a chosen objective; FGSM is ``steps=1, init='none', alpha=eps``.

    ``ops`` computes the loss rows, the step and the random start (the PyTorch reference unless
    the trainer hands its backend); ``stop`` is an optional per-sample early stop."""

    steps: int = 10
    objective: str = "ce"
    init: str = "uniform"
    restarts: int = 1
    temperature: float = 1.0
    kappa: float = math.inf
    bn_mode: str = "eval"
    ops: Ops = REFERENCE
    stop: StopRule | None = None

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown attack objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        if self.init not in INITS:
            raise UserError(f"unknown PGD init {self.init!r}; known: {', '.join(INITS)}")

    def _loss(self, model, z_nat, x_adv, y):
        z_adv = model(x_adv)
        weights = {"ce": {"ce_adv": 1.0}, "kl": {"kl": 1.0}, "cw": {"cw_adv": 1.0}}[self.objective]
        loss = self.ops.row_loss(z_nat, z_adv, y, **weights, temperature=self.temperature, kappa=self.kappa)
        return loss.sum(), z_adv

    def _run(self, model, x, y, eps_c, alpha_c, z_nat):
        o = self.ops
        x_adv = o.random_start(x, y, eps_c, self.init).detach()
        rule = self.stop.start(y) if self.stop else None
        for _ in range(self.steps):
            x_adv.requires_grad_(True)
            loss, z_adv = self._loss(model, z_nat, x_adv, y)
            (grad,) = torch.autograd.grad(loss, x_adv)
            stepped = o.pgd_step(x_adv.detach(), grad, x, y, eps_c, alpha_c)
            if self.stop:
                moves, rule = self.stop.update(rule, z_adv.detach(), y)
                stepped = torch.where(moves.view((-1,) + (1,) * (x.dim() - 1)), stepped, x_adv.detach())
            x_adv = stepped
        return x_adv.detach()
    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c) -> torch.Tensor:
        """Adversarial examples for ``(x, y)`` within the per-class ball ``eps_c[y]``."""
        with attack_mode(model, self.bn_mode), torch.enable_grad():
            z_nat = None
            if self.objective == "kl":
                with torch.no_grad():
                    z_nat = model(x).detach()
            best = self._run(model, x, y, eps_c, alpha_c, z_nat)
            for _ in range(self.restarts - 1):
                with torch.no_grad():
                    robust = model(best).argmax(1) == y
                cand = self._run(model, x, y, eps_c, alpha_c, z_nat)
                best = torch.where(robust.view((-1,) + (1,) * (x.dim() - 1)), cand, best)
        return best
