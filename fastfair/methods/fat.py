"""FAT: friendly adversarial training with early-stopped PGD (Zhang et al. 2020, ICML).

Each sample walks PGD steps until it has been found misclassified ``tau`` times and then once
more; from then on it keeps its current point. The stop is a rule handed to the one PGD engine
(:class:`EarlyStop`): a per-sample mask and budget on the device, so every sample runs the same
number of steps (stopped ones are simply not moved), with no Python loop over samples and no
host sync.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fastfair.methods.at import AT_ATTACK, PGDAT
from fastfair.methods.base import METHODS
from fastfair.schema import Key


def tau_at(epoch: int, tau: int, milestones: list[int]) -> int:
    """FAT's dynamic tau: the base tau plus one for every milestone epoch reached (FAT code: 0, 1 at 50, 2 at 90)."""
    return tau + sum(epoch >= m for m in milestones)


@dataclass(frozen=True)
class EarlyStop:
    """Stop sample i at the first misclassified check with no budget left (Zhang et al. 2020, Alg. 1)."""

    tau: int

    def start(self, y):
        return torch.full_like(y, self.tau), torch.ones_like(y, dtype=torch.bool)

    def update(self, state, logits, y):
        budget, active = state
        wrong = active & (logits.argmax(1) != y)
        active = active & ~(wrong & (budget == 0))
        budget = budget - (wrong & (budget > 0)).long()
        return active, (budget, active)


@METHODS.register("fat", "friendly AT: early-stopped PGD, tau 0 -> 2 (Zhang et al. 2020); CE on the result")
class FAT(PGDAT):
    """CE(f(x~), y) on early-stopped PGD examples x~ (Zhang et al. 2020, Eq. 4-5)."""

    keys = {"tau": Key(0, "FAT tau: misclassified PGD steps a sample may take before it stops (Zhang et al. 2020)"),
            "tau_milestones": Key([], "FAT dynamic tau: +1 at each of these epochs (FAT code: 50, 90)", list[int])}
    # FAT's code attacks in eval mode from a uniform start; CFA's lambda_1 for FAT is 0.7 (Sec. 5.1).
    defaults = {**AT_ATTACK, "attack.bn_mode": "eval", "ccm.lambda_1": 0.7,
                "method.tau": 0, "method.tau_milestones": [50, 90]}

    def __init__(self, cfg, *args, **kw):
        super().__init__(cfg, *args, **kw)
        self._stop_at(0)

    def _stop_at(self, epoch: int) -> None:
        m = self.cfg.method
        stop = EarlyStop(tau_at(epoch, m.tau, m.tau_milestones))
        self.attack = dataclasses.replace(self.attack, objective="ce", stop=stop)

    def begin_epoch(self, model, epoch):
        super().begin_epoch(model, epoch)
        self._stop_at(epoch)
