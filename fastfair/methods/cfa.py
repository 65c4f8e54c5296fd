"""CFA's class-wise calibration (Wei et al. 2023): CCM for every method that makes training
examples, CCR for the TRADES family. FAWA lives in :mod:`fastfair.training.averaging`.

Both read A_k, the class's robust accuracy on the previous epoch's training adversarial
examples, counted on the device from the same forward pass that fed the loss. Before epoch
``method.calibrate_begin`` both stay at their base values (CFA code's ``--begin 10``).
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.options import OPTIONS, Option, train_robust_fraction


def ccm_factor(train_robust: torch.Tensor, lam: float) -> torch.Tensor:
    """eps_k / eps = lambda_1 + A_k (CFA Eq. 6)."""
    return lam + train_robust


def ccr_weight(train_robust: torch.Tensor, lam: float, beta: torch.Tensor) -> torch.Tensor:
    """beta_k = (lambda_2 + A_k) beta (CFA Eq. 7); beta may itself be a class-wise vector."""
    return (lam + train_robust) * beta


def _calibrating(cfg, epoch: int) -> bool:
    """Whether the epoch after ``epoch`` uses calibrated values."""
    return epoch + 1 >= cfg.method.calibrate_begin


@OPTIONS.register("ccm", "CFA CCM: eps_k = (lambda_1 + A_k) eps from class train robust accuracy (Wei et al. 2023, Eq. 6)")
class CCM(Option):
    eps_factor = "eps_ccm"

    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.method.ccm

    def setup(self, state):
        if self.cfg.method.name == "standard":
            raise UserError("method.ccm calibrates the attack's eps; method standard makes no adversarial examples")
        state.add_vector(self.eps_factor, 1.0)

    def end_epoch(self, state, epoch, stats):
        if _calibrating(self.cfg, epoch):
            state.set(self.eps_factor, ccm_factor(train_robust_fraction(stats, state), self.cfg.method.ccm_lambda))


@OPTIONS.register("ccr", "CFA CCR: TRADES beta_k = (lambda_2 + A_k) beta, loss / (1 + beta_y) (Wei et al. 2023, Eq. 7-8)")
class CCR(Option):
    @staticmethod
    def enabled(cfg) -> bool:
        return cfg.method.ccr

    def setup(self, state):
        if "kl_weight" not in state.vectors:
            raise UserError(f"method.ccr calibrates the TRADES regulariser; method {self.cfg.method.name} has none "
                            "(use trades or me-trades)")
        self.base = state["kl_weight"].clone()

    def end_epoch(self, state, epoch, stats):
        if _calibrating(self.cfg, epoch):
            state.set("kl_weight", ccr_weight(train_robust_fraction(stats, state), self.cfg.method.ccr_lambda, self.base))
