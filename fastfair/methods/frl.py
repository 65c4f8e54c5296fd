"""FRL: Fair Robust Learning (Xu et al. 2021, ICML), fine-tuning a robust model with TRADES.

Before each epoch, on the validation split (PGD-20): class clean error e_k and boundary error
b_k = clean acc - robust acc. Multipliers grow where a class is worse than the average by more
than ``bound``; the reweight multipliers are clipped at 0 and rescaled to sum <= ``lim``; the
reweight rate is halved every ``method.halve_every`` epochs. Update formulas, loss and attack
follow the authors' code (hannxu123/fair_robust): ``frl-rw`` its ``frlrw.py`` + ``utils_frl.py``,
``frl`` its ``frlrmrw.py`` + ``utils_frl2.py``; ``frl-rm`` (no script of its own) is
``frlrmrw.py`` with the reweight step off (``--rate1 0``).
"""
from __future__ import annotations

import torch

from fastfair import rules
from fastfair.errors import UserError
from fastfair.evaluation import measures
from fastfair.methods.base import METHODS, Method
from fastfair.schema import Epochs, Key, Tune

# Both FRL scripts (frlrw.py, frlrmrw.py): SGD lr 0.001, MultiStepLR [40, 80] (not reached in their
# default 40 epochs), TRADES-PGD-10 from x + 0.001 N(0, I) in eval mode, PGD-20 validation.
FRL_DEFAULTS = {"attack.objective": "kl", "attack.init": "normal", "attack.bn_mode": "eval",
                "train.val_attack": "pgd20", "train.lr": 0.001, "train.lr_milestones": [40, 80],
                "train.epochs": 40}


def normalize_multipliers(lam: torch.Tensor, lim: float) -> torch.Tensor:
    """Clip at 0; rescale to sum lim when the sum exceeds it (Xu et al. 2021, Alg. 1; code's normalize_lambda)."""
    lam = lam.clamp(min=0.0)
    total = lam.sum()
    return torch.where(total > lim, lam * (lim / total.clamp(min=1e-12)), lam)


def class_weights(lam: torch.Tensor) -> torch.Tensor:
    """w_k = 1/C + lam_k - (1/C) sum_j lam_j: the Lagrangian's per-class cost.

    Xu et al. 2021, Sec. 4; code's cost_sensitive.
    """
    c = lam.shape[0]
    return 1.0 / c + lam - lam.sum() / c


def margin_factor(lam: torch.Tensor) -> torch.Tensor:
    """eps_k / eps = clamp(exp(2 lam_k), 0.98, 3) (FRL code's remargin, utils_frl2.cost_sensitive; utils_frl's
    bound 2.5 never applies: frlrw.py leaves lam_k at 0)."""
    return torch.exp(2.0 * lam).clamp(0.98, 3.0)


def update_multipliers(lam_nat, lam_bndy, lam_margin, clean_acc, robust_acc, *, bound, rate_weight, rate_margin,
                       lim, reweight: bool, remargin: bool):
    """One multiplier step from per-class validation accuracies in [0, 1] (Xu et al. 2021, Alg. 1 step 3).

    gamma_nat_k = e_k - mean e - bound, gamma_bndy_k = b_k - mean b - bound; the boundary
    multiplier moves at twice the rate of the natural one (code's ``rate1 * 2``). The code's
    average is the error over the whole validation split; fastfair's split holds
    ``data.val_per_class`` images of every class, so the mean of the per-class errors is that error.
    """
    err = 1.0 - clean_acc
    bndy = clean_acc - robust_acc
    gamma_nat = err - err.mean() - bound
    gamma_bndy = bndy - bndy.mean() - bound
    if reweight:
        lam_nat = normalize_multipliers(lam_nat + rate_weight * gamma_nat, lim)
        lam_bndy = normalize_multipliers(lam_bndy + 2 * rate_weight * gamma_bndy, lim)
    if remargin:
        lam_margin = lam_margin + rate_margin * gamma_bndy
    return lam_nat, lam_bndy, lam_margin


class FRLBase(Method):
    """sum_i w_nat_y CE(f(x_i)) / sum_i w_nat_y + beta sum_i w_bndy_y KL(p(x_i)||p(x'_i)) / sum_i w_bndy_y
    (FRL code's train_model: each term over its own summed weights), x' from TRADES-PGD in the
    ball eps * margin_y with step max_i(eps * margin_y_i) / 4 under remargin (utils_frl2.trades_adv).

    Key defaults are frlrmrw.py's (``frl``, ``frl-rm``); ``frl-rw`` overrides them with frlrw.py's."""

    keys = {
        "kl_weight": Key(1.5, "TRADES beta of the fine-tuning loss (FRL code: beta 1.5 in frlrw.py and frlrmrw.py)",
                         tune=Tune(0.375, 6.0, "log", source="no ablation read here; x/4 .. 4x around the code's 1.5"),
                         valid=rules.at_least(0)),
        "bound": Key(0.07, "FRL tolerance tau of a class's error above the average "
                           "(code: bound0 = bound1 = 0.07 in frlrmrw.py, 0.1 in frlrw.py)",
                     tune=Tune(0.02, 0.3, "log", source="no ablation read here; 0.02 .. 0.3 around the code's "
                                                        "0.07 and 0.1"), valid=rules.at_least(0)),
        "rate_weight": Key(0.05, "FRL multiplier step of the reweight terms (code: rate1 0.05)",
                           tune=Tune(0.0125, 0.2, "log", source="no ablation read here; x/4 .. 4x around the code's "
                                                                "0.05"), valid=rules.at_least(0)),
        "rate_margin": Key(0.2, "FRL multiplier step of the remargin term (code: rate2 0.2 in frlrmrw.py)",
                           tune=Tune(0.05, 0.8, "log", source="no ablation read here; x/4 .. 4x around the code's "
                                                              "0.2"), valid=rules.at_least(0)),
        "lim": Key(0.5, "FRL: reweight multipliers are rescaled to sum <= lim (code's normalize_lambda; lim 0.5)",
                   valid=rules.ABOVE_0),
        "halve_every": Key(40, "FRL code halves rate1 in each epoch whose number (from 1) this divides (0: never)",
                           epochs=Epochs("FRL's halving of rate_weight", active=lambda cfg: cfg.method.halve_every != 0,
                                         first=lambda n: n)),
        "step_from_eps": Key(True, "FRL attack step max over the batch of eps_y / 4 (code's utils_frl2.trades_adv, "
                                   "remargin); false: attack.alpha (utils_frl.trades_adv, reweight only)"),
    }
    reweight: bool = True
    remargin: bool = True
    needs_initial_validation = True
    defaults = FRL_DEFAULTS

    def __init__(self, cfg, *args, **kw):
        super().__init__(cfg, *args, **kw)
        if not cfg.train.init_from:
            raise UserError(f"{cfg.method.name} fine-tunes a robust model: pass --init-from CHECKPOINT.pt "
                            "(for example a pgd-at or trades run's checkpoints/best_pgd.pt)")

    def setup(self, state):
        for name in ("frl_lam_nat", "frl_lam_bndy", "frl_lam_margin"):
            state.add_vector(name, 0.0)
        state.add_vector("frl_w_nat", 1.0 / state.num_classes)
        state.add_vector("frl_w_bndy", 1.0 / state.num_classes)
        super().setup(state)
        state.add_factor("eps", "eps_frl", 1.0, owner=self.cfg.method.name)

    def _update(self, state, val: dict, next_epoch: int) -> None:
        """Multipliers for 0-based epoch ``next_epoch`` from a validation of the current model."""
        m = self.cfg.method
        absent = measures.absent_classes(val["clean"]["per_class"], [str(k) for k in range(state.num_classes)])
        if absent:  # FRL reweights every class by its validation accuracy; a class without images has none
            raise UserError(f"{self.cfg.method.name} reweights each class by its validation accuracy, and class(es) "
                            f"{', '.join(absent)} have no validation images; train on every class (data.drop_classes "
                            "= []) or give the validation split images of each class (data.val_per_class)")
        clean = torch.tensor(val["clean"]["per_class"], device=state.device) / 100.0
        robust = torch.tensor(val[self.cfg.train.val_attack]["per_class"], device=state.device) / 100.0
        # FRL code: rate1 halves before each 1-based epoch divisible by frl_halve_every.
        halving = 0.5 ** ((next_epoch + 1) // m.halve_every) if m.halve_every else 1.0
        lams = update_multipliers(state["frl_lam_nat"], state["frl_lam_bndy"], state["frl_lam_margin"], clean, robust,
                                  bound=m.bound, rate_weight=m.rate_weight * halving,
                                  rate_margin=m.rate_margin, lim=m.lim,
                                  reweight=self.reweight, remargin=self.remargin)
        for name, lam in zip(("frl_lam_nat", "frl_lam_bndy", "frl_lam_margin"), lams):
            state.set(name, lam)
        state.set("frl_w_nat", class_weights(lams[0]))
        state.set("frl_w_bndy", class_weights(lams[1]))
        state.set("eps_frl", margin_factor(lams[2]))

    def before_training(self, state, val):
        self._update(state, val, 0)

    def end_epoch(self, state, epoch, stats):
        self._update(state, stats["val"], epoch + 1)
        super().end_epoch(state, epoch, stats)

    def step_sizes(self, y, state) -> torch.Tensor:
        """The attack's per-class step vector: every entry max_i eps_{y_i} / 4 over the batch (FRL code's
        utils_frl2.trades_adv, one step for the batch; a device reduction, no sync), or attack.alpha."""
        if not self.cfg.method.step_from_eps:
            return state["alpha"]
        eps = state["eps"]
        return (eps[y].amax() / 4).expand_as(eps)

    def perturb(self, model, x, y, state):
        return self.attack(model, x, y, state["eps"], self.step_sizes(y, state))

    def loss(self, model, x, x_adv, y, state):
        z_nat, z_adv = model(x), model(x_adv)
        w_nat, w_bndy = state["frl_w_nat"][y], state["frl_w_bndy"][y]
        # Each term over the batch mean of its own weights: the rows' mean is the code's
        # sum(w_nat CE) / sum(w_nat) + beta sum(w_bndy KL) / sum(w_bndy) (train_model).
        rows = self.ops.row_loss(z_nat, z_adv, y, ce_nat=w_nat / w_nat.mean(),
                                 kl=self.cfg.method.kl_weight * w_bndy / w_bndy.mean())
        return rows, z_adv


@METHODS.register("frl-rw", "FRL reweight: TRADES fine-tuning with per-class loss multipliers, beta 1.5, bound 0.1 "
                            "(Xu et al. 2021; code's frlrw.py)")
class FRLReweight(FRLBase):
    remargin = False
    # frlrw.py: bound0 = bound1 = 0.1, rate1 0.05 (its rate2 0.1 is never used), fixed step attack.alpha
    defaults = {**FRL_DEFAULTS, "method.bound": 0.1, "method.step_from_eps": False}


@METHODS.register("frl-rm", "FRL remargin: TRADES fine-tuning with per-class eps multipliers, beta 1.5, bound 0.07 "
                            "(Xu et al. 2021; code's frlrmrw.py with rate1 0)")
class FRLRemargin(FRLBase):
    """No script of its own in the FRL code: frlrmrw.py (utils_frl2, the only remargin code) with the
    reweight step off, so its defaults are frlrmrw.py's (bound 0.07, rate2 0.2, beta 1.5)."""

    reweight = False


@METHODS.register("frl", "FRL reweight + remargin, beta 1.5, bound 0.07, rates 0.05 / 0.2, lim 0.5 "
                         "(Xu et al. 2021; code's frlrmrw.py)")
class FRLBoth(FRLBase):
    pass
