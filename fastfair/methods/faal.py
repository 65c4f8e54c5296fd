"""FAAL: Fairness-Aware Adversarial Learning (Zhang et al., CVPR 2024, arXiv 2402.17729).

FAAL fine-tunes a robust model (the authors: 2 epochs at lr 0.01, from a PGD-AT or TRADES model;
``train.init_from``) with class weights that change every batch: the worst class distribution w in
a KL ball around the uniform one, for the batch's per-class adversarial losses L_k (named
class-wise distributionally adversarial weights, CDAW, in summaries of the paper)::

    w* = argmax_{w in simplex} sum_k w_k c_k   s.t.  D(w, u) <= rho

The paper's own text and equations could not be consulted when this module was written; every
choice below was checked against the authors' code (``TrustAI/FAAL``: ``FAAL.py``, ``ft_prn.py``,
``run_prn.py``, ``utils.py``) and names the file. No paper equation numbers are cited.

* The code solves the problem with cvxpy (ECOS, then MOSEK, then SCS) on the host every step. Its
  constraint is ``sum(kl_div(u, w)) <= r``, i.e. KL(u || w) <= rho with the uniform u first
  (``divergence = "reverse"``). The stationarity condition of its Lagrangian gives
  w_k = lam u_k / (nu - c_k) with nu > max_k c_k: one scalar (nu) fixed by the KL constraint.
  ``divergence = "forward"`` is the other ball, KL(w || u) <= rho, whose solution is the
  exponential tilt w_k prop. to exp(c_k / tau). Both are solved here on the device by a fixed number of
  vectorised bracketing rounds over the one scalar in log space (:func:`kl_ball_weights`): no
  host sync, so the step stays compilable.
* c_k (``ft_prn.py``): the per-class mean of the softmax margin max_{j != y} p_j(x') - p_y(x') of
  the training forward on x' (the code's ``cw``), entered once per image of the class, i.e.
  c_k = n_k L_k with n_k the class's count in the batch (``aggregate = "sum"``; cvxpy objective
  ``sum(p[y] * loss[y])``). ``class_loss = "loss"`` uses the method's own loss rows instead;
  ``aggregate = "mean"`` uses the class means over the classes in the batch.
* The weights are constants for the gradient (the code detaches the solver's output), and
  multiply the loss rows: mean_i K w_{y_i} row_i (code: ``(loss * weights[y]).sum() * 10 / len(y)``).
* rho: the code's ``--scale``; ``run_prn.py`` and the README use 0.5 (argparse default 1.0).
"""
from __future__ import annotations

import math

import torch

from fastfair.errors import UserError
from fastfair.methods.at import PGDAT
from fastfair.methods.base import METHODS, Method
from fastfair.methods.trades import TRADES, TRADES_ATTACK
from fastfair.ops.losses import widened
from fastfair.schema import Key, Tune

DIVERGENCES = ("reverse", "forward")
LOG_RANGE = 30.0  # the scalar's log ranges over [-30, 30] relative to the spread of the scores


def _family(gaps: torch.Tensor, mask: torch.Tensor, n: torch.Tensor, t: torch.Tensor,
            divergence: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(w (M, K), D (M,)) of the solution family at M values of its scalar t (> 0), gaps a_k = (max c - c_k) / spread.

    reverse: w_k prop. to 1 / (t + a_k), D = KL(u || w) (code FAAL.py: cp.kl_div(Pemp, p)); forward:
    w_k prop. to exp(-a_k / t), D = KL(w || u). u is uniform over the classes in ``mask``."""
    t = t[:, None]
    if divergence == "reverse":
        logits = -torch.log(t + gaps)
    else:
        logits = -gaps / t
    logits = logits.masked_fill(~mask, -math.inf)
    logw = logits - torch.logsumexp(logits, dim=1, keepdim=True)
    w = logw.exp()
    if divergence == "reverse":  # sum_k u_k log(u_k / w_k) over the classes in the mask
        d = -torch.log(n) - torch.where(mask, logw, torch.zeros_like(logw)).sum(1) / n
    else:  # sum_k w_k log(w_k / u_k)
        d = torch.where(mask, w * (logw + torch.log(n)), torch.zeros_like(w)).sum(1)
    return w, d


def kl_ball_weights(scores: torch.Tensor, rho: float, present: torch.Tensor | None = None,
                    divergence: str = "reverse", rounds: int = 6, points: int = 24) -> torch.Tensor:
    """argmax_w sum_k w_k c_k over the simplex with D(w, u) <= rho: FAAL's class weights (CDAW).

    ``scores`` c (K,); ``present`` (K,) bool: classes outside it get weight 0 and u is uniform over
    it (default: every class). The solution is a one-scalar family (:func:`_family`) whose
    divergence falls as the scalar grows; ``rounds`` rounds of ``points`` candidates each narrow
    the bracket of the scalar in log space around the ball's edge, and the returned w is the
    feasible end (D <= rho; the uniform weights where even that end is not). No host sync;
    detached; float64 inside, out in the scores' dtype (float32 at least: :func:`widened`)."""
    if divergence not in DIVERGENCES:
        raise UserError(f"method.divergence must be one of {', '.join(DIVERGENCES)}; got {divergence!r}")
    out = widened(scores.detach()).dtype
    c = scores.detach().double()
    mask = torch.ones_like(c, dtype=torch.bool) if present is None else present.bool()
    n = mask.sum().clamp(min=1).double()
    uniform = mask.double() / n
    if rho <= 0:
        return uniform.to(out)
    top = torch.where(mask, c, torch.full_like(c, -math.inf)).amax()
    bottom = torch.where(mask, c, torch.full_like(c, math.inf)).amin()
    spread = (top - bottom).clamp(min=1e-30)
    gaps = torch.where(mask, (top - c) / spread, torch.zeros_like(c))  # in [0, 1]; 0 at the worst class
    lo = torch.full((1,), -LOG_RANGE, dtype=torch.float64, device=c.device)
    hi = torch.full((1,), LOG_RANGE, dtype=torch.float64, device=c.device)
    steps = torch.linspace(0.0, 1.0, points, dtype=torch.float64, device=c.device)
    for _ in range(rounds):
        grid = lo + (hi - lo) * steps
        _, d = _family(gaps, mask, n, grid.exp(), divergence)
        first = (d > rho).sum().clamp(1, points - 1).reshape(1)  # D falls along the grid: the first feasible point
        lo, hi = grid.index_select(0, first - 1), grid.index_select(0, first)  # tensor indices: no host read
    w, d = _family(gaps, mask, n, hi.exp(), divergence)
    return torch.where(d[0] <= rho, w[0], uniform).to(out)


def softmax_margin(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """max_{j != y} p_j - p_y on softmax probabilities, per row (FAAL code ``cw`` in ft_prn.py, utils.py)."""
    p = widened(z.detach()).softmax(1)
    p_y = p.gather(1, y[:, None]).squeeze(1)
    others = p.scatter(1, y[:, None], -math.inf).amax(1)
    return others - p_y


def batch_weights(values: torch.Tensor, y: torch.Tensor, num_classes: int, rho: float, divergence: str,
                  aggregate: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(w (K,), per-row factor (N,)) for one batch's per-sample values (the margins or the loss rows).

    sum: c_k = sum of class k's values = n_k L_k, u over all K classes, factor K w_{y_i} (code
    ft_prn.py); mean: c_k = L_k over the classes in the batch, factor w_{y_i} N / n_{y_i}, so the
    mean of the weighted rows is sum_k w_k (class k's mean row)."""
    v = widened(values.detach())
    counts = torch.zeros(num_classes, dtype=v.dtype, device=v.device).index_add_(0, y, torch.ones_like(v))
    sums = torch.zeros(num_classes, dtype=v.dtype, device=v.device).index_add_(0, y, v)
    if aggregate == "sum":
        w = kl_ball_weights(sums, rho, None, divergence)
        return w, num_classes * w[y]
    present = counts > 0
    w = kl_ball_weights(sums / counts.clamp(min=1), rho, present, divergence)
    return w, w[y] * y.shape[0] / counts[y].clamp(min=1)


class FAAL(Method):
    """Shared part of :class:`FAALAT` and :class:`FAALTrades`: the keys and the per-batch weighting of the rows."""

    keys = {
        "rho": Key(0.5, "FAAL KL-ball radius around the uniform class distribution (code --scale; run_prn.py and "
                        "README: 0.5)",
                   tune=Tune(0.125, 2.0, "log", source="no ablation read here; x/4 .. 4x around the code's 0.5")),
        "divergence": Key("reverse", "FAAL ball: reverse = KL(u || w) <= rho (code FAAL.py, cp.kl_div(Pemp, p)) | "
                                     "forward = KL(w || u) <= rho (w prop. to exp(c / tau))"),
        "class_loss": Key("margin", "FAAL per-class adversarial loss L_k: margin = mean of max_{j != y} p_j(x') - "
                                    "p_y(x') (code ft_prn.py cw) | loss = mean of the method's loss rows"),
        "aggregate": Key("sum", "FAAL scores: sum = n_k L_k over all K classes, rows times K w_y (code ft_prn.py) | "
                                "mean = L_k over the classes in the batch, sum_k w_k mean row_k"),
    }

    def setup(self, state):
        m = self.cfg.method
        for key, allowed in (("divergence", DIVERGENCES), ("class_loss", ("margin", "loss")),
                             ("aggregate", ("sum", "mean"))):
            if getattr(m, key) not in allowed:
                raise UserError(f"method.{key} must be one of {', '.join(allowed)}; got {getattr(m, key)!r}")
        if not m.rho >= 0:
            raise UserError(f"method.rho must be a radius >= 0; got {m.rho}")
        super().setup(state)

    def loss(self, model, x, x_adv, y, state):
        m = self.cfg.method
        rows, z_adv = super().loss(model, x, x_adv, y, state)
        values = softmax_margin(z_adv, y) if m.class_loss == "margin" else rows
        _, factor = batch_weights(values, y, state.num_classes, m.rho, m.divergence, m.aggregate)
        return rows * factor, z_adv


@METHODS.register("faal-at", "PGD-AT + FAAL: per-batch worst class weights in a KL ball (rho 0.5) around uniform; "
                             "fine-tunes a robust model (Zhang et al. 2024, CVPR; code TrustAI/FAAL)")
class FAALAT(FAAL, PGDAT):
    """CE(f(x'), y) rows times K w_y, w the FAAL weights of the batch (code ft_prn.py, --loss AT).

    Attack of the code's ``pgd_attack``: uniform start, CE, BN in eval mode (``model.eval()``)."""

    defaults = {"attack.objective": "ce", "attack.init": "uniform", "attack.bn_mode": "eval", "ccm.lambda_1": 0.5,
                "method.entropy_weight": 0.0}


@METHODS.register("faal-trades", "TRADES + FAAL: TRADES rows (beta 6) times per-batch worst class weights in a KL "
                                 "ball (Zhang et al. 2024, CVPR; code --loss TRADES)")
class FAALTrades(FAAL, TRADES):
    """(CE(f(x), y) + 6 KL(p(x) || p(x'))) rows times K w_y (code ft_prn.py, --loss TRADES; attack_trade)."""

    defaults = {**TRADES_ATTACK, "method.kl_weight": 6.0, "method.entropy_weight": 0.0}
