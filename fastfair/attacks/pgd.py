"""One L-inf PGD engine for training and evaluation (Madry et al. 2018, Eq. 2-3).

Objectives: ``ce`` (PGD-AT, PGD-k eval), ``kl`` (TRADES-PGD: KL(p(x) || p(x'))), ``cw``
(CW-inf margin), ``ce`` with ``temperature`` (Temperature-PGD, Tian et al.); per sample, a
``toward`` mask instead descends CE to a ``target`` class (TRIX's targeted rows). The ``kl`` objective's first
distribution is the model's own on x unless the caller hands ``reference`` logits (a teacher's, ABSLD). FGSM is one step
with ``alpha = eps``. ``eps`` and ``alpha`` are per-class ``(C,)`` tensors gathered by label
(per-class budgets of CFA/FRL), so changing them never recompiles. During the attack the
model's parameters are frozen (no weight gradients are computed) and only
``torch.autograd.grad`` w.r.t. the input is taken.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch
from torch import nn

from fastfair import rules
from fastfair.errors import UserError
from fastfair.ops import REFERENCE, Ops
from fastfair.ops.steps import INITS

OBJECTIVES = ("ce", "kl", "cw")
BN_MODES = ("train", "eval")
STEPS = rules.at_least(1)  # attack.steps: a PGD of no step would be its random start alone
RESTARTS = rules.at_least(1)  # pgdKxR's R: the first run counts


@contextlib.contextmanager
def attack_mode(model: nn.Module, bn_mode: str):
    """Freeze parameters and set the BN mode for attack generation; restore both afterwards.

    ``train()`` walks every module, so the mode is switched only when it differs (PGD-AT attacks
    in the training mode the update needs anyway).
    """
    rules.check_name("attack.bn_mode", bn_mode, BN_MODES)
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


def per_class(value, num_classes: int, device, key: str = "attack.eps") -> torch.Tensor:
    """A radius or step (a float, or one per class) as a ``(C,)`` tensor of torch's default dtype (float32; the
    float64 conformance checks set float64) on ``device``; a value given as
    Python numbers is checked as the config key ``key`` is (attack.eps, attack.alpha, eval.eps: within [0, 1])."""
    if not isinstance(value, torch.Tensor):  # a tensor is the caller's (a training step's vector: no host read)
        value = rules.check(key, value, float, rules.IMAGE_RANGE, per_class=True)
    t = torch.as_tensor(value, dtype=torch.get_default_dtype(), device=device)
    if t.dim() == 0:
        return t.expand(num_classes).contiguous()
    if t.shape != (num_classes,):
        raise UserError(f"a per-class radius or step needs {num_classes} values, one per class; got {list(t.shape)}")
    return t


class StopRule(Protocol):
    """A per-sample early stop handed to :class:`PGD` (FAT's, :mod:`fastfair.methods.fat`): after each
    step's forward it says which samples still move; the others keep their current point."""

    def start(self, y: torch.Tensor) -> Any:
        """The rule's per-sample state before the first step (device tensors)."""

    def update(self, state: Any, logits: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        """(bool mask of samples that take this step, the new state), from this step's logits."""


def steps_back(stop: StopRule | None) -> bool:
    """Whether a sample ``stop`` halts returns to the point its last step left (the last one checked correct: BAT's
    last clean example, :mod:`fastfair.methods.bat`) instead of keeping the checked point; a rule says so with a
    true ``back`` attribute."""
    return bool(getattr(stop, "back", False))


def flag_masked(masked: torch.Tensor | None, grad: torch.Tensor) -> None:
    """Set, in ``masked`` (one bool per image, on the device), the images whose input gradient ``grad`` holds a NaN or
    an inf: the step cannot follow such a gradient, so the attack stalls there and the accuracy it leaves reads as
    robustness (issue 58: ``net(x) + 0 * sqrt(x)``, finite outputs, NaN gradients at the zero pixels). In place, on
    the device: no host sync per step; the caller reads the flags once, after its batch or its whole split."""
    if masked is not None:
        masked |= ~torch.isfinite(grad).flatten(1).all(1)


def descend(attack: "PGD", model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c,
            x_adv: torch.Tensor, target: torch.Tensor | None = None,
            toward: torch.Tensor | None = None, noise: torch.Tensor | None = None,
            reference: torch.Tensor | None = None, origin: torch.Tensor | None = None,
            masked: torch.Tensor | None = None) -> torch.Tensor:
    """``attack.steps`` sign-gradient steps from ``x_adv`` (Madry et al. 2018, Eq. 2), in ``attack_mode``.

    With ``target`` and the bool mask ``toward`` (both (N,)), the rows where ``toward`` holds ascend
    -CE(f(x'), target), i.e. step towards the target class (a targeted PGD), and the others ascend
    the attack's objective: one loss, selected per row with ``torch.where``, so no host sync.
    ``noise`` ((K, *x.shape), drawn by the caller) is added to step k before the projection (FAT's omega).
    ``reference`` ((N, C) logits) replaces the model's clean logits as p in the ``kl`` objective KL(p || p(x'))
    (ABSLD: the teacher's temperature-scaled logits). ``masked`` ((N,) bool) gains every image whose input gradient
    was not finite at some step (:func:`flag_masked`).

    The whole descent -- the natural forward of the KL objective, K forwards, K input gradients,
    the steps and an early-stop rule -- is one function, so :func:`compile_descent` can capture
    it as one graph (the K forwards then share one cast of the weights under autocast).

    Each step differentiates w.r.t. ``x_adv + origin``, ``origin`` a 0-dim zero leaf that requires
    grad (made here unless given): Dynamo 2.11 cannot trace ``x_adv.requires_grad_()`` nor create
    a grad-requiring tensor inside a graph, so :func:`compile_descent` makes ``origin`` outside it.
    Adding 0 changes no value (bar -0 to +0), so the iterates are those of ``requires_grad_``.
    """
    weights = {"ce": {"ce_adv": 1.0}, "kl": {"kl": 1.0}, "cw": {"cw_adv": 1.0}}[attack.objective]
    o = attack.ops
    z_nat = None
    if attack.objective == "kl":
        if reference is not None:
            z_nat = reference.detach()
        else:
            with torch.no_grad():
                z_nat = model(x).detach()
    rule = attack.stop.start(y) if attack.stop else None
    back = steps_back(attack.stop)
    if origin is None:
        origin = grad_origin(x)
    x_adv = x_adv.detach()
    x_from = x_adv  # the point each sample's last step left: where a ``back`` rule returns a sample it halts
    for k in range(attack.steps):
        x_in = x_adv + origin
        z_adv = model(x_in)
        rows = o.row_loss(z_nat, z_adv, y, **weights, temperature=attack.temperature, kappa=attack.kappa)
        if toward is not None:
            rows = torch.where(toward, -o.row_loss(None, z_adv, target, ce_adv=1.0), rows)
        (grad,) = torch.autograd.grad(rows.sum(), x_in)
        flag_masked(masked, grad)
        base = x_adv if noise is None else x_adv + noise[k]
        stepped = o.pgd_step(base, grad, x, y, eps_c, alpha_c)
        if attack.stop:
            moves, rule = attack.stop.update(rule, z_adv.detach(), y)
            moving = moves.view((-1,) + (1,) * (x.dim() - 1))
            stepped = torch.where(moving, stepped, x_from if back else x_adv)
            if back:  # a halted sample's point is now its own start, so it stays there at later checks
                x_from = torch.where(moving, x_adv, stepped)
        x_adv = stepped
    return x_adv


def grad_origin(x: torch.Tensor) -> torch.Tensor:
    """The 0-dim zero leaf that requires grad, through which :func:`descend` differentiates the iterate."""
    return torch.zeros((), device=x.device, dtype=x.dtype, requires_grad=True)


@functools.cache
def descent_capture(descent: Callable = descend) -> str | None:
    """Why Dynamo does not capture ``descent`` as one graph on this torch, or None when it does.

    Traced once per process with a graph-counting backend (no code generated) on a tiny model with BatchNorm
    in train mode and the KL objective (a natural forward under ``no_grad``, then K input
    gradients). The traced function is a renamed copy: Dynamo keys what it remembers about a
    function (shapes seen, recompiles) by name, so the real descent later starts afresh. Dynamo's
    counters are restored, so the probe leaves no trace in them.
    """
    from torch._dynamo.utils import counters

    probe = type(descent)(descent.__code__.replace(co_name=f"{descent.__name__}_probe"), descent.__globals__,
                          f"{descent.__name__}_probe", descent.__defaults__, descent.__closure__)
    graphs: list = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    x, y = torch.rand(2, 1, 4, 4), torch.tensor([0, 2])
    eps = torch.full((3,), 0.1)
    attack = PGD(steps=2, objective="kl", init="none", bn_mode="train",
                 descend=compile_descent(lambda f: torch.compile(f, backend=count), probe))
    saved = {k: collections.Counter(v) for k, v in counters.items()}
    try:
        attack(model, x, y, eps, eps)
        breaks = sum(counters["graph_break"].values()) - sum(saved.get("graph_break", {}).values())
    except Exception as e:  # Dynamo could not trace it at all
        return f"tracing failed ({type(e).__name__}: {e})"
    finally:
        counters.clear()
        counters.update(saved)
    if len(graphs) == 1 and breaks == 0:
        return None
    return f"{len(graphs)} graphs, {breaks} graph breaks"


def can_compile_descent() -> bool:
    """Dynamo captures :func:`descend` as one graph on this torch (found by tracing it: :func:`descent_capture`)."""
    return descent_capture() is None


def compile_descent(compiler: Callable[[Callable], Callable], descent: Callable = descend) -> Callable:
    """``descent`` (:func:`descend`) compiled by ``compiler`` (``torch.compile``), input gradients included.

    One graph where :func:`can_compile_descent`; the caller checks that and otherwise runs the
    eager descent around the compiled model. ``origin`` (see :func:`descend`) is made here,
    outside the graph.
    """
    compiled = compiler(descent)

    def run(attack, model, x, *rest, **masked):
        # set at every call, not once: Dynamo reads it when it traces, which a new shape can trigger
        with torch._dynamo.config.patch(trace_autograd_ops=True):
            return compiled(attack, model, x, *rest, origin=grad_origin(x), **masked)

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
        for name, (key, typ, rule) in CHECKED.items():
            rules.check(key, getattr(self, name), typ, rule)

    def _run(self, model, x, y, eps_c, alpha_c, targeting, reference, masked):
        # The random start is drawn here, eagerly, from torch's seeded generator: a compiled
        # descent then sees the same start as an eager one, and --resume stays exact (Inductor
        # draws random numbers its own way).
        # The step noise likewise: all K draws at once, before the descent, one (K, *x.shape) tensor.
        x_start = self.ops.random_start(x, y, eps_c, self.init).detach()
        noise = None
        if self.noise:
            noise = self.noise * torch.randn((self.steps, *x.shape), device=x.device, dtype=x.dtype)
        target, toward = targeting or (None, None)
        # handed on only when asked for, so the training step's compiled descent keeps its one signature
        flags = {} if masked is None else {"masked": masked}
        return self.descend(self, model, x, y, eps_c, alpha_c, x_start, target, toward, noise, reference, **flags)

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c,
                 target: torch.Tensor | None = None, toward: torch.Tensor | None = None,
                 reference: torch.Tensor | None = None, masked: torch.Tensor | None = None) -> torch.Tensor:
        """Adversarial examples for ``(x, y)`` within the per-class ball ``eps_c[y]``; rows where the
        bool mask ``toward`` holds step towards ``target`` instead; ``reference``: the ``kl`` objective's first
        distribution's logits instead of the model's on x (see :func:`descend`); ``masked`` ((N,) bool, on the
        device) gains the images whose input gradient was not finite at any step of any restart."""
        if (target is None) != (toward is None):
            raise UserError("a targeted PGD needs both target and toward (or neither)")
        if reference is not None and self.objective != "kl":
            raise UserError(f"reference logits are read by the kl objective only; this attack's is {self.objective}")
        targeting = () if target is None else (target, toward)
        with attack_mode(model, self.bn_mode), torch.enable_grad():
            best = self._run(model, x, y, eps_c, alpha_c, targeting, reference, masked)
            for _ in range(self.restarts - 1):
                with torch.no_grad():
                    robust = model(best).argmax(1) == y
                cand = self._run(model, x, y, eps_c, alpha_c, targeting, reference, masked)
                best = torch.where(robust.view((-1,) + (1,) * (x.dim() - 1)), cand, best)
        return best


# PGD's fields that are config keys of the training attack (their rows in fastfair.checks hold these rules), each
# refused as ``--set attack.steps=0`` is, with its message; restarts are pgdKxR's, checked the same way
CHECKED = {"steps": ("attack.steps", int, STEPS), "objective": ("attack.objective", str, OBJECTIVES),
           "init": ("attack.init", str, INITS), "bn_mode": ("attack.bn_mode", str, BN_MODES),
           "restarts": ("restarts", int, RESTARTS)}
