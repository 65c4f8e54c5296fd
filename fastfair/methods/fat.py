"""FAT: friendly adversarial training with early-stopped PGD (Zhang et al. 2020, ICML).

Each sample walks PGD steps until it has been found misclassified ``tau`` times and then once
more; from then on it keeps its current point. The stop is a per-sample mask and a per-sample
budget on the device: every sample runs the same number of steps (stopped ones are simply not
moved), so there is no Python loop over samples and no host sync.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fastfair import ops
from fastfair.attacks import attack_mode
from fastfair.methods.at import AT_ATTACK, PGDAT
from fastfair.methods.base import METHODS


def tau_at(epoch: int, tau: int, milestones: list[int]) -> int:
    """FAT's dynamic tau: the base tau plus one for every milestone epoch reached (FAT code: 0, 1 at 50, 2 at 90)."""
    return tau + sum(epoch >= m for m in milestones)


@dataclass(frozen=True)
class EarlyStopPGD:
    """PGD-CE that stops sample i at the first misclassified check with no budget left (Zhang et al. 2020, Alg. 1)."""

    steps: int = 10
    init: str = "uniform"
    bn_mode: str = "eval"

    def __call__(self, model, x, y, eps_c, alpha_c, tau: int) -> torch.Tensor:
        o = ops.get()
        with attack_mode(model, self.bn_mode), torch.enable_grad():
            x_adv = o.random_start(x, y, eps_c, self.init).detach()
            budget = torch.full_like(y, tau)
            active = torch.ones_like(y, dtype=torch.bool)
            shape = (-1,) + (1,) * (x.dim() - 1)
            for _ in range(self.steps):
                x_adv.requires_grad_(True)
                z = model(x_adv)
                (grad,) = torch.autograd.grad(o.row_loss(None, z, y, ce_adv=1.0).sum(), x_adv)
                wrong = active & (z.argmax(1) != y)
                active = active & ~(wrong & (budget == 0))
                budget = budget - (wrong & (budget > 0)).long()
                x_adv = torch.where(active.view(shape), o.pgd_step(x_adv.detach(), grad, x, y, eps_c, alpha_c),
                                    x_adv.detach())
        return x_adv.detach()


@METHODS.register("fat", "friendly AT: early-stopped PGD, tau 0 -> 2 (Zhang et al. 2020); CE on the result")
class FAT(PGDAT):
    """CE(f(x~), y) on early-stopped PGD examples x~ (Zhang et al. 2020, Eq. 4-5)."""

    # FAT's code attacks in eval mode from a uniform start; CFA's lambda_1 for FAT is 0.7 (Sec. 5.1).
    defaults = {**AT_ATTACK, "attack.bn_mode": "eval", "method.ccm_lambda": 0.7,
                "method.fat_tau": 0, "method.fat_tau_milestones": [50, 90]}

    def __init__(self, cfg):
        super().__init__(cfg)
        a = cfg.attack
        self.attack = EarlyStopPGD(steps=a.steps, init=a.init, bn_mode=a.bn_mode)
        self.tau = cfg.method.fat_tau

    def begin_epoch(self, model, epoch):
        super().begin_epoch(model, epoch)
        self.tau = tau_at(epoch, self.cfg.method.fat_tau, self.cfg.method.fat_tau_milestones)

    def perturb(self, model, x, y, state):
        return self.attack(model, x, y, state["eps"], state["alpha"], self.tau)
