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
import re
from dataclasses import dataclass, replace

import torch
from torch import nn

from . import ops
from .errors import UserError

OBJECTIVES = ("ce", "kl", "cw")
INITS = ("uniform", "normal", "none")
BN_MODES = ("train", "eval")


def pgd_step_reference(x_adv, grad, x, y, eps_c, alpha_c):
    """x' <- clip_[0,1](clip_[x-eps_y, x+eps_y](x' + alpha_y sign(g))) (Madry et al. 2018, Eq. 2)."""
    shape = (-1,) + (1,) * (x.dim() - 1)
    eps = eps_c[y].view(shape).float()
    alpha = alpha_c[y].view(shape).float()
    step = x_adv.float() + alpha * grad.float().sign()
    x32 = x.float()
    out = torch.minimum(torch.maximum(step, x32 - eps), x32 + eps).clamp(0.0, 1.0)
    return out.to(x_adv.dtype)


def random_start_reference(x, y, eps_c, kind: str):
    """PGD init: U(-eps_y, eps_y) clipped to [0,1] (Madry), or x + 0.001 N(0, I) (TRADES code)."""
    if kind == "uniform":
        eps = eps_c[y].view((-1,) + (1,) * (x.dim() - 1)).to(x.dtype)
        return (x + (torch.rand_like(x) * 2 - 1) * eps).clamp(0.0, 1.0)
    if kind == "normal":
        return x + 0.001 * torch.randn_like(x)
    if kind == "none":
        return x.clone()
    raise UserError(f"unknown PGD init {kind!r}; known: {', '.join(INITS)}")


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


@dataclass(frozen=True)
class PGD:
    """L-inf PGD with a chosen objective; FGSM is ``steps=1, init='none', alpha=eps``."""

    steps: int = 10
    objective: str = "ce"
    init: str = "uniform"
    restarts: int = 1
    temperature: float = 1.0
    kappa: float = math.inf
    bn_mode: str = "eval"

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown attack objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        if self.init not in INITS:
            raise UserError(f"unknown PGD init {self.init!r}; known: {', '.join(INITS)}")

    def _loss(self, model, z_nat, x_adv, y):
        z_adv = model(x_adv)
        weights = {"ce": {"ce_adv": 1.0}, "kl": {"kl": 1.0}, "cw": {"cw_adv": 1.0}}[self.objective]
        loss = ops.get().row_loss(
            z_nat, z_adv, y, **weights, temperature=self.temperature, kappa=self.kappa
        )
        return loss.sum(), z_adv

    def _run(self, model, x, y, eps_c, alpha_c, z_nat):
        o = ops.get()
        x_adv = o.random_start(x, y, eps_c, self.init).detach()
        for _ in range(self.steps):
            x_adv.requires_grad_(True)
            loss, _ = self._loss(model, z_nat, x_adv, y)
            (grad,) = torch.autograd.grad(loss, x_adv)
            x_adv = o.pgd_step(x_adv.detach(), grad, x, y, eps_c, alpha_c)
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


# ---- evaluation attacks by name -------------------------------------------------------------

_NAME = re.compile(r"^(?P<kind>pgd|cw|fgsm|tpgd)(?P<steps>\d*)(?:x(?P<restarts>\d+))?(?:@t(?P<t>[\d.]+))?$")


@dataclass(frozen=True)
class EvalAttack:
    """An attack a user names on the command line: ``clean``, ``pgd20``, ``pgd20x5`` (5 restarts),
    ``cw20``, ``fgsm``, ``tpgd20@t0.1`` (Temperature-PGD, T = 0.1, i.e. 1/T = 10)."""

    name: str
    pgd: PGD | None  # None means clean accuracy
    step_is_eps: bool = False  # FGSM: one step of size eps

    def __call__(self, model, x, y, eps_c, alpha_c):
        if self.pgd is None:
            return x
        return self.pgd(model, x, y, eps_c, eps_c if self.step_is_eps else alpha_c)


def parse_attack(name: str, cw_kappa: float = 50.0) -> EvalAttack:
    """Parse an evaluation attack name (see :class:`EvalAttack`); bad names list the forms."""
    if name == "clean":
        return EvalAttack(name, None)
    m = _NAME.match(name)
    if not m:
        raise UserError(
            f"unknown attack {name!r}; use clean, fgsm, pgdK, pgdKxR (R restarts), cwK or tpgdK@tT "
            "(for example pgd20, cw20, pgd50x5, tpgd20@t0.1)"
        )
    kind, steps = m["kind"], int(m["steps"] or (1 if m["kind"] == "fgsm" else 20))
    restarts = int(m["restarts"] or 1)
    if kind == "fgsm":
        return EvalAttack(name, PGD(steps=1, objective="ce", init="none"), step_is_eps=True)
    base = PGD(steps=steps, restarts=restarts, objective="ce", init="uniform", bn_mode="eval")
    if kind == "cw":
        base = replace(base, objective="cw", kappa=cw_kappa)
    if kind == "tpgd":
        base = replace(base, temperature=float(m["t"] or 1.0))
    return EvalAttack(name, base)
