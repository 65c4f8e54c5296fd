"""DAFA: Distance-Aware Fair Adversarial Training (Lee et al., ICLR 2024, arXiv 2401.12532).

After ``warmup`` epochs of plain adversarial training (Algorithm 1, lines 1-6: tau epochs), the
class-wise similarity ``p`` is read once: row i is the mean softmax of the model over class i's
training adversarial examples of the last warm-up epoch (the ``softmax_by_class`` statistic, from
the same train-mode forward that fed the loss, as the code's ``memory_dict`` in losses.py).
Algorithm 2 (DAFA_comp) turns it into class weights, starting from W = 1: for every pair i != j,

    p_i(i) < p_j(j)  (i is the harder class):  W_i += lambda * p_i(j) * p_j(j)
    p_i(i) > p_j(j)  (i is the easier class):  W_i -= lambda * p_j(i) * p_i(i)

so a hard class takes weight from the easy classes it is confused with, in proportion to how
similar they are and how easy the other one is. From epoch tau + 1 on (Algorithm 1, lines 9-12)
class k trains with loss weight W_k and with eps_k = W_k eps and alpha_k = W_k alpha (the code's
``class_weights_mask`` times ``epsilon`` and ``pgd_step_size``, losses.py). The weights are computed
once and never again (code: train.py, ``epoch == args.dafa_warmup``).

Where the paper and the authors' code (github.com/rucy74/DAFA) differ, a key chooses:

* ``tie_subtracts``: Algorithm 2 leaves W_i unchanged when p_i(i) == p_j(j); the code's ``else``
  branch (utils.py, ``calculate_class_weights``) subtracts then. Exact ties are rare in floats.
* ``dafa-trades`` ``weight_terms``: the code (losses.py, ``trades_loss``) weights only the natural
  CE term of TRADES and leaves the KL term unweighted; Algorithm 1 writes L(x + delta, y; W_y)
  without saying which TRADES term. ``row`` weights the whole TRADES row instead.
* ``dafa-at`` ``second_step``: the code's PGD-AT attack (losses.py, ``madry_loss``) takes, after
  each class-scaled step and projection, a second unscaled step with the same gradient and
  projects onto the uniform eps ball, so the class-wise eps does not bound the final example.

Neither the paper nor the code bounds W from below: with a large lambda a class weight can go
to zero or below (a negative loss weight ascends that class's loss; a negative eps_k empties the
ball). ``clamp_negative`` floors the weights at 0 (neither paper nor code does).
"""
from __future__ import annotations

import torch

from fastfair import rules
from fastfair.attacks.pgd import attack_mode
from fastfair.errors import UserError
from fastfair.methods.at import PGDAT
from fastfair.methods.base import CODE_PGD10, METHODS, Method
from fastfair.methods.trades import TRADES, TRADES_ATTACK
from fastfair.schema import Epochs, Key, Tune, never_at_0

SIMILARITY = "softmax_by_class"


def dafa_weights(p: torch.Tensor, lam: float, tie_subtracts: bool = True) -> torch.Tensor:
    """Class weights W (C,) from the class-wise similarity p (C, C) (DAFA Algorithm 2, DAFA_comp).

    ``p[i, j]`` is p_i(j), the mean probability of class j on class i's adversarial examples.
    ``tie_subtracts``: on p_i(i) == p_j(j) subtract as the easier class (code) instead of skipping
    the pair (paper)."""
    p = p.double()
    d = p.diagonal()
    off = ~torch.eye(p.shape[0], dtype=torch.bool, device=p.device)
    harder = (d[:, None] < d[None, :]) & off  # [i, j]: class i is harder than class j
    easier = ((d[:, None] >= d[None, :]) if tie_subtracts else (d[:, None] > d[None, :])) & off
    gain = (harder * p * d[None, :]).sum(1)  # sum_j p_i(j) p_j(j) over the easier classes j
    loss = (easier * p.T * d[:, None]).sum(1)  # sum_j p_j(i) p_i(i) over the harder classes j
    return (1.0 + lam * (gain - loss)).to(torch.get_default_dtype())  # float32, float64 in the float64 checks


class DAFA(Method):
    """Shared part of :class:`DAFATrades` and :class:`DAFAAT`: the keys, the vectors, the epoch-end update."""

    keys = {
        "dafa_lambda": Key(1.0, "DAFA scale lambda of Algorithm 2 (code --dafa_lambda: CIFAR-10 1.0, "
                                "CIFAR-100 and STL-10 1.5)",
                           tune=Tune(0.25, 4.0, "log", source="no ablation read here; x/4 .. 4x around the code's "
                                                              "1.0 (CIFAR-10), 1.5 beside it"),
                           valid=rules.at_least(0)),
        "warmup": Key(70, "DAFA tau: epochs of plain training; W comes from epoch tau's training adversarial "
                          "examples and is used from epoch tau + 1 on (Algorithm 1; code --dafa_warmup 70)",
                   epochs=Epochs("DAFA's class weights", switch="method.name", first=never_at_0)),
        "tie_subtracts": Key(True, "on p_i(i) == p_j(j) subtract as the easier class (code utils.py); false: skip "
                                   "the pair (paper Algorithm 2)"),
        "clamp_negative": Key(False, "floor the DAFA class weights at 0 (neither the paper nor the code does)"),
    }
    statistics = (SIMILARITY,)

    def weighted_factors(self) -> tuple[tuple[str, str], ...]:
        """(vector, factor) pairs set to W: eps_k and alpha_k (code losses.py), plus the loss where it is a factor."""
        return (("eps", "eps_dafa"), ("alpha", "alpha_dafa"))

    @classmethod
    def check(cls, cfg):
        warmup = cfg.method.warmup  # past train.epochs: checks.check_epochs (Epochs above)
        if warmup < 1:
            raise UserError(f"method.warmup must be at least 1 (DAFA computes its weights after the warm-up epoch "
                            f"tau); got {warmup}")

    def setup(self, state):
        super().setup(state)
        state.add_vector("dafa_weight", 1.0)  # W itself, as the checkpoint and metrics.jsonl show it
        for vector, factor in self.weighted_factors():
            state.add_factor(vector, factor, 1.0, owner="method " + self.cfg.method.name)

    def end_epoch(self, state, epoch, stats):
        super().end_epoch(state, epoch, stats)
        m = self.cfg.method
        if epoch + 1 != m.warmup:  # once, after the last warm-up epoch (code train.py: epoch == dafa_warmup)
            return
        w = dafa_weights(stats["statistics"][SIMILARITY], m.dafa_lambda, m.tie_subtracts)
        if m.clamp_negative:
            w = w.clamp(min=0.0)
        state.set("dafa_weight", w)
        for _, factor in self.weighted_factors():
            state.set(factor, w)


@METHODS.register("dafa-trades", "TRADES + DAFA: class weights W from class similarity scale the CE, eps and "
                                 "step after a 70-epoch warm-up (Lee et al. 2024, Alg. 1-2)")
class DAFATrades(DAFA, TRADES):
    """TRADES (Zhang et al. 2019, Eq. 5) with DAFA's class weights (Lee et al. 2024, Algorithms 1-2)."""

    keys = {"weight_terms": Key("ce", "which TRADES terms W_y weights: ce (the natural CE only, code losses.py) | "
                                      "row (CE and KL)")}
    defaults = {**TRADES_ATTACK, **CODE_PGD10, "method.kl_weight": 6.0, "method.entropy_weight": 0.0}

    def setup(self, state):
        if self.cfg.method.weight_terms not in ("ce", "row"):
            raise UserError(f"method.weight_terms must be ce or row; got {self.cfg.method.weight_terms!r}")
        super().setup(state)

    def weighted_factors(self):
        loss = (("loss_weight", "loss_weight_dafa"),) if self.cfg.method.weight_terms == "row" else ()
        return super().weighted_factors() + loss

    def ce_weight(self, state, y):
        return state["dafa_weight"][y] if self.cfg.method.weight_terms == "ce" else 1.0


def descend_twice(attack, model, x, y, eps_c, alpha_c, eps0_c, alpha0_c, x_adv):
    """The DAFA code's PGD-AT attack (losses.py, ``madry_loss``): each of the K steps is a class-scaled
    step projected onto the eps_y ball, then a second step with the same gradient and the unscaled
    alpha, projected onto the unscaled eps ball and [0, 1]. The code clips to [0, 1] only after the
    second projection; here both steps clip (``pgd_step``), which differs only at the pixel range's ends."""
    o = attack.ops
    x_adv = x_adv.detach()
    for _ in range(attack.steps):
        x_adv.requires_grad_(True)
        loss = o.row_loss(None, model(x_adv), y, ce_adv=1.0).sum()
        (grad,) = torch.autograd.grad(loss, x_adv)
        scaled = o.pgd_step(x_adv.detach(), grad, x, y, eps_c, alpha_c)
        x_adv = o.pgd_step(scaled, grad, x, y, eps0_c, alpha0_c)
    return x_adv.detach()


@METHODS.register("dafa-at", "PGD-AT + DAFA: class weights W from class similarity scale the CE, eps and step "
                             "after a warm-up (Lee et al. 2024, Alg. 1-2; code --loss pgd)")
class DAFAAT(DAFA, PGDAT):
    """PGD-AT (Madry et al. 2018) with DAFA's class weights on the CE row, eps_k and alpha_k.

    Attack settings from the DAFA code's ``madry_loss``: BN in eval mode, start x + 0.001 N(0, I)."""

    keys = {"second_step": Key(True, "after each class-scaled PGD step take a second unscaled step and project onto "
                                     "the uniform eps ball (code losses.py madry_loss); false: the paper's eps_k")}
    defaults = {"attack.objective": "ce", "attack.init": "normal", "attack.bn_mode": "eval", "ccm.lambda_1": 0.5,
                **CODE_PGD10, "method.entropy_weight": 0.0}

    def weighted_factors(self):
        return super().weighted_factors() + (("loss_weight", "loss_weight_dafa"),)

    def perturb(self, model, x, y, state):
        if not self.cfg.method.second_step:
            return super().perturb(model, x, y, state)
        a = self.attack
        with attack_mode(model, a.bn_mode), torch.enable_grad():
            start = a.ops.random_start(x, y, state["eps"], a.init).detach()
            return descend_twice(a, model, x, y, state["eps"], state["alpha"], state.bases["eps"],
                                 state.bases["alpha"], start)
