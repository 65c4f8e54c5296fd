"""HE (Pang et al. 2020) and its temperature schedules LIS and CMP (Tian et al., ICLR sub., App. G).

The cosine head itself is ``model.head = "cosine"`` (:mod:`fastfair.models.heads`). This option
subtracts the margin m from the logits of the method's CE terms (its ``ce_logits`` hook) and
moves the head's scale s = 1/T once per epoch, before the epoch's first step.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from fastfair import rules
from fastfair.errors import UserError
from fastfair.ops.losses import label_mask, widened
from fastfair.registry import Registry
from fastfair.methods.options import Option, register
from fastfair.models.heads import WEIGHT_NORMS
from fastfair.schema import Epochs, Key

SCHEDULES: Registry = Registry("HE scale schedule")


def lis_scale(epoch: int, epochs: int, start: float, end: float) -> float:
    """1/T_n = 1/T_0 + (n / n_FI)(1/T_FI - 1/T_0), n_FI = total epochs (Tian et al. App. G, Eq. 5)."""
    return start + epoch / epochs * (end - start)


def cmp_target(epoch: int, p_start: float, p_end: float, until: int) -> float:
    """P^max_n = P^max_0 + (n / n_FI)(P^max_FI - P^max_0) for n < n_FI, then P^max_FI (Tian et al. App. G, Eq. 6)."""
    return p_start + min(epoch, until) / until * (p_end - p_start)


def max_probability(scale: float, gram: np.ndarray) -> float:
    """fastfair's reading of Tian et al.'s "maximum probability": a feature on class l's weight direction
    has cosines gram[l] (Eq. 3 with FN + WN); the max over l of its class-l probability. (Not the
    supremum over all unit features, which is a little higher: moving the feature away from the other
    classes' weights gains more than it loses on class l.)"""
    z = scale * gram
    z = z - z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return float((np.diag(p) / p.sum(axis=1)).max())


def cmp_scale(target: float, gram: np.ndarray) -> float:
    """s with max_probability(s) = target, solved with MINPACK's hybrid Powell method (Tian et al.: Powell's dogleg).

    Solved on log-odds in log s, which is well scaled from p near 1/C to p near 1, starting from
    the closed form for orthogonal class weights, s = log(p (C - 1) / (1 - p)). A probability of
    exactly 1 needs s = infinity: targets are capped at 1 - 1e-6 (s about 16 for ten orthogonal
    classes, close to HE's fixed s = 15).
    """
    c = gram.shape[0]
    target = min(max(target, 1.0 / c + 1e-3), 1.0 - 1e-6)
    goal = math.log(target) - math.log1p(-target)

    def gap(t):
        p = max_probability(math.exp(t[0]), gram)
        return [math.log(p) - math.log1p(-p) - goal]

    from scipy.optimize import root  # here, not at the top: importing scipy slows every `fastfair` command

    sol = root(gap, [math.log(math.log(target * (c - 1) / (1 - target)))], method="hybr")
    if not sol.success:
        raise RuntimeError(f"HE-CMP: no scale reaches max probability {target:.6f} ({sol.message})")
    return math.exp(sol.x[0])


@SCHEDULES.register("fixed", "HE's constant s = model.head_scale (Pang et al. 2020: 15 TRADES-HE, 10 PGD-HE)")
def _fixed(cfg, epoch, head):
    return cfg.model.head_scale


@SCHEDULES.register("lis", "Linear Interpolation Schedule: s from model.head_scale to he.scale_end (Tian: 1 -> 75)")
def _lis(cfg, epoch, head):
    return lis_scale(epoch, cfg.train.epochs, cfg.model.head_scale, cfg.he.scale_end)


@SCHEDULES.register("cmp",
                    "Control Maximum Probability: s solved each epoch so max prob follows 0.2 -> 1 by epoch 90 (Tian)")
def _cmp(cfg, epoch, head):
    m = cfg.he
    with torch.no_grad():
        w = torch.nn.functional.normalize(widened(head.weight), dim=1)
        gram = (w @ w.T).cpu().numpy().astype(np.float64)  # once per epoch, outside the step
    return cmp_scale(cmp_target(epoch, m.pmax_start, m.pmax_end, m.pmax_epoch), gram)


@register("he", "HE: cosine head with scale s and margin m (Pang et al. 2020); LIS/CMP schedules for s (Tian et al.)")
class HE(Option):
    keys = {
        "margin": Key(0.0, "HE angular margin m on the CE terms (Pang et al. 2020: 0.2); needs model.head = cosine",
                      valid=rules.at_least(0)),
        "schedule": Key("fixed", "HE scale schedule: fixed | lis | cmp (Tian et al., ICLR sub., App. G)"),
        "scale_end": Key(75.0, "LIS: 1/T at the last epoch (Tian: 1 -> 75)", valid=rules.ABOVE_0),
        "pmax_start": Key(0.2, "CMP: controlled maximum probability in epoch 1 (Tian: 0.2)", valid=rules.within(0, 1)),
        "pmax_end": Key(1.0, "CMP: ... reached in epoch pmax_epoch + 1 (Tian: 1)", valid=rules.within(0, 1)),
        "pmax_epoch": Key(90, "CMP: epochs of the interpolation; pmax_end from epoch pmax_epoch + 1 on (Tian: 90 of "
                              "100)", epochs=Epochs("HE-CMP's rise of the maximum probability to he.pmax_end",
                                                    switch="he.schedule", active=lambda cfg: cfg.he.schedule == "cmp",
                                                    cut_short=True), valid=rules.at_least(1)),
        "weight_norm": Key("graph", "WN of the class weights: graph = W / norm(W) in the forward, gradient through it "
                                    "(Pang et al. 2020, Eq. 4); data = gradient at the unit rows, rows renormalised "
                                    "after each step (their code: models/wideresnet.py overwrites fc.weight.data)"),
    }

    @classmethod
    def enabled(cls, cfg) -> bool:
        return (cfg.model.head == "cosine" or cfg.he.margin != 0.0 or cfg.he.schedule != "fixed"
                or cfg.he.weight_norm != "graph")

    @classmethod
    def check(cls, cfg) -> None:
        SCHEDULES.get(cfg.he.schedule)
        if cfg.he.weight_norm not in WEIGHT_NORMS:
            raise UserError(f"he.weight_norm={cfg.he.weight_norm!r}; known: {', '.join(WEIGHT_NORMS)}")
        if cfg.model.head != "cosine":
            raise UserError("he.margin, he.schedule and he.weight_norm need the HE head: --set model.head=cosine")

    def __init__(self, cfg, method):
        super().__init__(cfg, method)
        self.schedule = SCHEDULES.get(self.own.schedule)
        if self.own.margin and not method.uses_ce_logits:
            raise UserError(f"method {cfg.method.name} does not apply the HE margin; use pgd-at or trades, "
                            "or set he.margin=0")

    def begin_epoch(self, model, epoch):
        model.head.weight_norm = self.own.weight_norm
        if self.own.weight_norm == "data":
            model.head.renormalize_()  # the code's first forward normalises the initial weights
        model.head.scale.fill_(self.schedule(self.cfg, epoch, model.head))

    def after_step(self, model):
        """he.weight_norm = data: the stepped class weights back onto the unit sphere, as the code's next forward
        does (it overwrites fc.weight.data with F.normalize(fc.weight)), so momentum and weight decay act on
        unit rows in the next step too."""
        if self.own.weight_norm == "data":
            model.head.renormalize_()

    def ce_logits(self, model, z, y):
        """s (cos_y - m) for the true class: subtract s m there (Pang et al. 2020, Eq. 6)."""
        if self.own.margin == 0.0:
            return z
        return z - (model.head.scale * self.own.margin) * label_mask(y, z.shape[1]).to(z.dtype)
