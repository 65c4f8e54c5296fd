"""One L-inf PGD engine for training and evaluation (Madry et al. 2018, Eq. 2-3).

Objectives: ``ce`` (PGD-AT, PGD-k eval), ``kl`` (TRADES-PGD: KL(p(x) || p(x'))), ``cw``
(CW-inf margin), ``ce`` with ``temperature`` (Temperature-PGD, Tian et al.); per sample, a
``toward`` mask instead descends CE to a ``target`` class (TRIX's targeted rows). FGSM is one step
with ``alpha = eps``. ``eps`` and ``alpha`` are per-class ``(C,)`` tensors gathered by label
(per-class budgets of CFA/FRL), so changing them never recompiles. During the attack the
model's parameters are frozen (no weight gradients are computed) and only
``torch.autograd.grad`` w.r.t. the input is taken.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import nn

from fastfair.errors import UserError
from fastfair.ops import REFERENCE, Ops
from fastfair.ops.steps import INITS

OBJECTIVES = ("ce", "kl", "cw")
BN_MODES = ("train", "eval")


@contextlib.contextmanager
def attack_mode(model: nn.Module, bn_mode: str):
    """Freeze parameters and set the BN mode for attack generation; restore both afterwards.

    ``train()`` walks every module, so the mode is switched only when it differs (PGD-AT attacks
    in the training mode the update needs anyway).
    """
    if bn_mode not in BN_MODES:
        raise UserError(f"unknown BN mode {bn_mode!r}; known: {', '.join(BN_MODES)}")
    was_training = model.training
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)
    switch = was_training != (bn_mode == "train")
    if switch:
        model.train(bn_mode == "train")
    try:
        yield
    finally:
        for p in params:
            p.requires_grad_(True)
        if switch:
            model.train(was_training)


def per_class(value, num_classes: int, device) -> torch.Tensor:
    """A float or per-class vector as a float32 ``(C,)`` tensor on ``device``."""
    t = torch.as_tensor(value, dtype=torch.float32, device=device)
    return t.expand(num_classes).contiguous() if t.dim() == 0 else t


class StopRule(Protocol):
    """A per-sample early stop handed to :class:`PGD` (FAT's, :mod:`fastfair.methods.fat`): after each
    step's forward it says which samples still move; the others keep their current point."""

    def start(self, y: torch.Tensor) -> Any:
        """The rule's per-sample state before the first step (device tensors)."""

    def update(self, state: Any, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(bool mask of samples that take this step, the new state), from this step's logits."""


def descend(attack: "PGD", model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c,
            x_adv: torch.Tensor, target: torch.Tensor | None = None,
            toward: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """``attack.steps`` sign-gradient steps from ``x_adv`` (Madry et al. 2018, Eq. 2), in ``attack_mode``.

    With ``target`` and the bool mask ``toward`` (both (N,)), the rows where ``toward`` holds ascend
    -CE(f(x'), target), i.e. step towards the target class (a targeted PGD), and the others ascend
    the attack's objective: one loss, selected per row with ``torch.where``, so no host sync.
    ``noise`` ((K, *x.shape), drawn by the caller) is added to step k before the projection (FAT's omega).

    The whole descent -- the natural forward of the KL objective, K forwards, K input gradients,
    the steps and an early-stop rule -- is one function, so :func:`compile_descent` can capture
    it as one graph (the K forwards then share one cast of the weights under autocast).
    """
    weights = {"ce": {"ce_adv": 1.0}, "kl": {"kl": 1.0}, "cw": {"cw_adv": 1.0}}[attack.objective]
    o = attack.ops
    z_nat = None
    if attack.objective == "kl":
        with torch.no_grad():
            z_nat = model(x).detach()
    rule = attack.stop.start(y) if attack.stop else None
    x_adv = x_adv.detach()
    for k in range(attack.steps):
        x_adv.requires_grad_(True)
        z_adv = model(x_adv)
        rows = o.row_loss(z_nat, z_adv, y, **weights, temperature=attack.temperature, kappa=attack.kappa)
        if toward is not None:
            rows = torch.where(toward, -o.row_loss(None, z_adv, target, ce_adv=1.0), rows)
        (grad,) = torch.autograd.grad(rows.sum(), x_adv)
        base = x_adv.detach() if noise is None else x_adv.detach() + noise[k]
        stepped = o.pgd_step(base, grad, x, y, eps_c, alpha_c)
        if attack.stop:
            moves, rule = attack.stop.update(rule, z_adv.detach(), y)
            stepped = torch.where(moves.view((-1,) + (1,) * (x.dim() - 1)), stepped, x_adv.detach())
        x_adv = stepped
    return x_adv.detach()


def can_compile_descent() -> bool:
    """Dynamo traces ``torch.autograd.grad`` into the graph only with ``trace_autograd_ops`` (torch >= 2.11)."""
    return hasattr(torch._dynamo.config, "trace_autograd_ops")


def compile_descent(compiler: Callable[[Callable], Callable]) -> Callable:
    """:func:`descend` compiled by ``compiler`` (``torch.compile``) into one graph, input gradients included.

    Where Dynamo cannot trace ``autograd.grad`` (torch < 2.11) the eager descent is returned; the
    caller then compiles the model alone.
    """
    if not can_compile_descent():
        return descend
    compiled = compiler(descend)

    def run(*args):
        # set at every call, not once: Dynamo reads it when it traces, which a new shape can trigger
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return compiled(*args)

    return run


@dataclass(frozen=True)
class PGD:
    """L-inf PGD with a chosen objective; FGSM is ``steps=1, init='none', alpha=eps``.

    ``ops`` computes the loss rows, the step and the random start (the PyTorch reference unless
    the trainer hands its backend); ``stop`` is an optional per-sample early stop; ``noise`` > 0 adds
    ``noise`` N(0, I) to every step before the projection (FAT code's omega, ``earlystop.py``)."""

    steps: int = 10
    objective: str = "ce"
    init: str = "uniform"
    restarts: int = 1
    temperature: float = 1.0
    kappa: float = math.inf
    bn_mode: str = "eval"
    ops: Ops = REFERENCE
    stop: StopRule | None = None
    noise: float = 0.0
    descend: Callable = field(default=descend, repr=False, compare=False)  # or compile_descent(...)'s

    def __post_init__(self):
        if self.objective not in OBJECTIVES:
            raise UserError(f"unknown attack objective {self.objective!r}; known: {', '.join(OBJECTIVES)}")
        if self.init not in INITS:
            raise UserError(f"unknown PGD init {self.init!r}; known: {', '.join(INITS)}")

    def _run(self, model, x, y, eps_c, alpha_c, targeting):
        # The random start is drawn here, eagerly, from torch's seeded generator: a compiled
        # descent then sees the same start as an eager one, and --resume stays exact (Inductor
        # draws random numbers its own way).
        # The step noise likewise: all K draws at once, before the descent, one (K, *x.shape) tensor.
        x_start = self.ops.random_start(x, y, eps_c, self.init).detach()
        noise = None
        if self.noise:
            noise = self.noise * torch.randn((self.steps, *x.shape), device=x.device, dtype=x.dtype)
        target, toward = targeting or (None, None)
        return self.descend(self, model, x, y, eps_c, alpha_c, x_start, target, toward, noise)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c,
                 target: torch.Tensor | None = None, toward: torch.Tensor | None = None) -> torch.Tensor:
        """Adversarial examples for ``(x, y)`` within the per-class ball ``eps_c[y]``; rows where the
        bool mask ``toward`` holds step towards ``target`` instead (see :func:`descend`)."""
        if (target is None) != (toward is None):
            raise UserError("a targeted PGD needs both target and toward (or neither)")
        targeting = () if target is None else (target, toward)
        with attack_mode(model, self.bn_mode), torch.enable_grad():
            best = self._run(model, x, y, eps_c, alpha_c, targeting)
            for _ in range(self.restarts - 1):
                with torch.no_grad():
                    robust = model(best).argmax(1) == y
                cand = self._run(model, x, y, eps_c, alpha_c, targeting)
                best = torch.where(robust.view((-1,) + (1,) * (x.dim() - 1)), cand, best)
        return best
