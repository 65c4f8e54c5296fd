"""FAT: friendly adversarial training with early-stopped PGD (Zhang et al. 2020, ICML).

Each sample walks PGD steps while its early-stop rule lets it: a budget of ``tau``
misclassified checks, spent on the device. Two rules (``method.stop_rule``):

- ``fat`` (:class:`EarlyStop`, FAT's ``earlystop.py`` and Alg. 1): a sample found misclassified
  with no budget left stops; a misclassified one with budget spends one and steps on, and a
  correctly classified one always steps. tau = 0 stops at the first misclassified check.
- ``cfa`` (:class:`BudgetStop`, CFA's ``attack.py::fat_loss``/``cw_fat_loss``): a sample steps only
  while its budget is positive, a misclassified check spending one; once the budget is spent it
  stops at the next check whatever it predicts. tau = 0 never moves.

The stop is a rule handed to the one PGD engine: a per-sample state on the device, so every
sample runs the same number of steps (stopped ones are simply not moved), with no Python loop
over samples and no host sync. FAT's code also adds ``omega`` N(0, I) to each step before the
projection (``method.omega``; the engine draws it before the descent, :class:`~fastfair.attacks.pgd.PGD`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fastfair import rules
from fastfair.errors import UserError
from fastfair.methods.at import AT_ATTACK, PGDAT
from fastfair.methods.base import METHODS
from fastfair.schema import Epochs, Key, Tune


def tau_at(epoch: int, tau: int, milestones: list[int]) -> int:
    """FAT's dynamic tau: the base tau plus one for every milestone epoch reached (FAT code: 0, 1 at 50, 2 at 90)."""
    return tau + sum(epoch >= m for m in milestones)


@dataclass(frozen=True)
class EarlyStop:
    """FAT's rule: stop sample i at the first misclassified check with no budget left (Zhang et al. 2020,
    Alg. 1; FAT code ``earlystop.py``): tau more steps after its first misclassified check."""

    tau: int

    def start(self, y):
        return torch.full_like(y, self.tau), torch.ones_like(y, dtype=torch.bool)

    def update(self, state, logits, y):
        budget, active = state
        wrong = active & (logits.argmax(1) != y)
        active = active & ~(wrong & (budget == 0))
        budget = budget - (wrong & (budget > 0)).long()
        return active, (budget, active)


@dataclass(frozen=True)
class BudgetStop:
    """CFA's rule: sample i steps only while its budget is positive; a misclassified check spends one
    (CFA code ``attack.py::fat_loss``). Once spent, it stops for good; tau = 0 never moves."""

    tau: int

    def start(self, y):
        return torch.full_like(y, self.tau)

    def update(self, budget, logits, y):
        moves = budget > 0
        budget = budget - (moves & (logits.argmax(1) != y)).long()
        return moves, budget


STOP_RULES = {"fat": EarlyStop, "cfa": BudgetStop}


@METHODS.register("fat", "friendly AT: early-stopped PGD, tau 0 -> 2 (Zhang et al. 2020); CE on the result")
class FAT(PGDAT):
    """CE(f(x~), y) on early-stopped PGD examples x~ (Zhang et al. 2020, Eq. 4-5)."""

    keys = {"tau": Key(0, "FAT tau: misclassified PGD steps a sample may take before it stops (Zhang et al. 2020)",
                       tune=Tune(0, 3, "int", source="no ablation read here; 0 .. 3 around the code's 0 (rising to "
                                                     "2 by tau_milestones)"), valid=rules.at_least(0)),
            "tau_milestones": Key([], "FAT dynamic tau: +1 after each of these epochs, from epoch m + 1 on (FAT code: "
                                      "50, 90)", list[int],
                                  epochs=Epochs("FAT's tau increase")),
            "stop_rule": Key("fat", "early stop: 'fat' = a sample stops at a misclassified check with no budget left "
                                    "(FAT code earlystop.py, Alg. 1); 'cfa' = it steps only while its budget is "
                                    "positive, so tau 0 never moves (CFA code attack.py fat_loss)"),
            "omega": Key(0.001, "std of the N(0, I) noise added to each early-stopped PGD step before the "
                                "projection (FAT code FAT.py --omega 0.001, earlystop.py); CFA's code adds none",
                         valid=rules.at_least(0))}
    # FAT's code attacks in eval mode from a uniform start; CFA's lambda_1 for FAT is 0.7 (Sec. 5.1).
    defaults = {**AT_ATTACK, "attack.bn_mode": "eval", "ccm.lambda_1": 0.7,
                "method.tau": 0, "method.tau_milestones": [50, 90], "method.stop_rule": "fat", "method.omega": 0.001}

    @classmethod
    def check(cls, cfg):
        super().check(cfg)
        m = cfg.method
        if m.stop_rule not in STOP_RULES:
            raise UserError(f"unknown method.stop_rule {m.stop_rule!r}; known: {', '.join(STOP_RULES)}")
        if m.omega < 0:
            raise UserError(f"method.omega is a standard deviation; got {m.omega}")

    def __init__(self, cfg, *args, **kw):
        self.check(cfg)
        super().__init__(cfg, *args, **kw)
        self._stop_at(0)

    def _stop_at(self, epoch: int) -> None:
        m = self.cfg.method
        stop = STOP_RULES[m.stop_rule](tau_at(epoch, m.tau, m.tau_milestones))
        self.attack = dataclasses.replace(self.attack, objective="ce", stop=stop, noise=m.omega)

    def begin_epoch(self, model, epoch):
        super().begin_epoch(model, epoch)
        self._stop_at(epoch)
