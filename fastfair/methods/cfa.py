"""CFA's class-wise calibration (Wei et al. 2023): CCM for every method that makes training
examples, CCR for the TRADES family. FAWA lives in :mod:`fastfair.training.averaging`.

Both read A_k, the class's robust accuracy on the previous epoch's training adversarial
examples, counted on the device from the same forward pass that fed the loss. Before epoch
``begin`` each stays at its base value (CFA code's ``--begin 10``).
"""
from __future__ import annotations

import torch

from fastfair import rules
from fastfair.methods.options import Option, register, train_robust_fraction
from fastfair.schema import Epochs, Key, Tune


def ccm_factor(train_robust: torch.Tensor, lam: float) -> torch.Tensor:
    """eps_k / eps = lambda_1 + A_k (CFA Eq. 6)."""
    return lam + train_robust


def ccr_factor(train_robust: torch.Tensor, lam: float) -> torch.Tensor:
    """beta_k / beta = lambda_2 + A_k (CFA Eq. 7); beta may itself be a class-wise vector."""
    return lam + train_robust


BEGIN = ("epochs at the base value before A_k is used: from epoch begin + 1 on (at the earliest epoch 2: A_k "
         "comes from a finished epoch; CFA code's --begin 10; the paper gives none)")


def _begin(what: str, switch: str) -> Epochs:
    # end_epoch sets the factor after epoch e (1-based) when e >= begin, so it acts from epoch max(begin, 1) + 1
    return Epochs(what, switch=switch, first=lambda n: max(n, 1) + 1)


class Calibration(Option):
    """A factor on one per-class vector, set to lambda + A_k after each epoch from ``begin`` on."""

    vector: str
    factor: str

    def setup(self, state):
        state.add_factor(self.vector, self.factor, 1.0, owner=f"option {self.name}")

    def end_epoch(self, state, epoch, stats):
        if epoch + 1 >= self.own.begin:
            state.set(self.factor, self.calibrated(train_robust_fraction(stats, state)))

    def calibrated(self, train_robust: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


@register("ccm", "CFA CCM: eps_k = (lambda_1 + A_k) eps from class train robust accuracy (Wei et al. 2023, Eq. 6)")
class CCM(Calibration):
    keys = {"enabled": Key(False, "switch CFA's class-wise calibrated margin on (--ccm)"),
            "lambda_1": Key(0.5, "CFA lambda_1: 0.5 AT, 0.3 TRADES, 0.7 FAT (Wei et al. 2023, Sec. 5.1)",
                            tune=Tune(0.3, 0.7, source="CFA Fig. 5(a): base perturbation budget lambda_1 0.3 to 0.7 "
                                                       "(AT + CCM)"), valid=rules.at_least(0)),
            "begin": Key(10, BEGIN, epochs=_begin("CCM's calibrated eps_k", "ccm.enabled"), valid=rules.at_least(0))}
    vector, factor = "eps", "eps_ccm"

    def calibrated(self, train_robust):
        return ccm_factor(train_robust, self.own.lambda_1)


@register("ccr", "CFA CCR: TRADES beta_k = (lambda_2 + A_k) beta, loss / (1 + beta_y) (Wei et al. 2023, Eq. 7-8)")
class CCR(Calibration):
    keys = {"enabled": Key(False, "switch CFA's class-wise calibrated TRADES regularisation on (--ccr)"),
            "lambda_2": Key(0.5, "CFA lambda_2 (Wei et al. 2023, Sec. 5.1)",
                            tune=Tune(0.3, 0.7, source="CFA Fig. 7(a), App. C.3: base regularisation budget lambda_2 "
                                                       "0.3 to 0.7 (TRADES + CCM + CCR)"), valid=rules.at_least(0)),
            "begin": Key(10, BEGIN, epochs=_begin("CCR's calibrated TRADES beta_k", "ccr.enabled"),
                         valid=rules.at_least(0))}
    defaults = {"method.normalize": True}  # Eq. 8 divides the calibrated loss by (1 + beta_y)
    vector, factor = "kl_weight", "kl_weight_ccr"

    def calibrated(self, train_robust):
        return ccr_factor(train_robust, self.own.lambda_2)
