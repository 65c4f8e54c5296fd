"""Conformance with the authors' code: shared inputs, golden files and the checks' bookkeeping.

Golden values come from running each method's reference implementation (the authors' public code
at a pinned commit, or for methods without code an independent float64 evaluation of the paper's
equations) on the fixed inputs in ``tests/golden/inputs.npz``: a small BatchNorm CNN
(:class:`TinyNet`, defined here so that neither side owns it) briefly trained on the real
CIFAR-10 subset, and one batch of its images. ``tests/golden/make.py`` writes them; the
``conformance_*.py`` modules beside this file compare fastfair with them, one :func:`case` per
method and quantity, and ``test_conformance.py`` runs every case and keeps ``docs/conformance.md``
in step with them.

Each golden file is ``tests/golden/NAME.npz`` (arrays, loaded without pickle) beside
``NAME.json``: where every array came from (repository, commit, file, function) and the settings.

Both sides run in float64 (:func:`precision`: the authors' code when ``make.py`` generates, fastfair when a case
runs), so a check's tolerance is a float64 rounding bound, about 1e-10 relative, the same on every CPU's kernels;
each case also runs once in float32 (fastfair's real dtype path) against the same float64 golden values, at its
float32 bound: the smoke check.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from fastfair.attacks.pgd import attack_mode, descend
from helpers import make_method

GOLDEN = Path(__file__).resolve().parent / "golden"
DTYPES = (torch.float64, torch.float32)  # the check, then the smoke check
_PRECISION = [torch.float32]


@contextlib.contextmanager
def precision(dtype: torch.dtype):
    """Within the block, inputs, models, golden arrays, torch's default dtype (what fastfair's and the authors'
    per-class tensors and random draws are made in) and every tolerance's unit roundoff are ``dtype``'s."""
    saved = torch.get_default_dtype()
    _PRECISION.append(dtype)
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        _PRECISION.pop()
        torch.set_default_dtype(saved)


def working_dtype() -> torch.dtype:
    """The dtype the checks run in now (:func:`precision`)."""
    return _PRECISION[-1]


DOC = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"


class TinyNet(nn.Module):
    """conv 3->8, BN, ReLU, pool; conv 8->16, BN, ReLU, pool; linear 1024->10: BN makes the
    attack's train/eval mode matter, and it is small enough for float64 references."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(16 * 8 * 8, num_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


@dataclass(frozen=True)
class Inputs:
    """The fixed inputs every golden value starts from."""

    state: dict[str, torch.Tensor]  # TinyNet's weights and BN buffers
    x: torch.Tensor  # (N, 3, 32, 32) in [0, 1]: uint8 images / 255, in the dtype of the precision
    y: torch.Tensor  # (N,) int64

    def model(self, mode: str = "train") -> TinyNet:
        """A fresh TinyNet holding the fixed weights, in ``mode`` ('train' or 'eval'), in ``x``'s dtype."""
        net = TinyNet()
        net.load_state_dict(self.state)
        return net.to(self.x.dtype).train(mode == "train")

    def teacher(self) -> TinyNet:
        """A distillation teacher (ABSLD): the fixed TinyNet in eval mode, its head's weights and bias times 3, so
        its soft labels are sharper than the student's own predictions."""
        net = self.model("eval")
        with torch.no_grad():
            net.fc.weight.mul_(3.0)
            net.fc.bias.mul_(3.0)
        return net


def inputs_from(arrays, dtype: torch.dtype = torch.float32) -> Inputs:
    state = {k[len("state."):]: torch.from_numpy(np.array(v)) for k, v in arrays.items() if k.startswith("state.")}
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()}
    x = torch.from_numpy(np.asarray(arrays["x_uint8"])).to(dtype) / 255.0
    return Inputs(state, x, torch.from_numpy(np.asarray(arrays["y"])).long())


def inputs() -> Inputs:
    """The fixed inputs in the dtype of the precision (:func:`precision`)."""
    return _inputs(working_dtype())


@functools.cache
def _inputs(dtype: torch.dtype) -> Inputs:
    with np.load(GOLDEN / "inputs.npz", allow_pickle=False) as f:
        return inputs_from(dict(f), dtype)


@dataclass(frozen=True)
class Golden:
    arrays: dict[str, np.ndarray]
    meta: dict

    def t(self, key: str, dtype=None) -> torch.Tensor:
        """Array ``key`` as a tensor, a floating one in the dtype of the precision unless ``dtype`` says otherwise."""
        out = torch.from_numpy(np.array(self.arrays[key]))
        if dtype is None and out.is_floating_point():
            dtype = working_dtype()
        return out if dtype is None else out.to(dtype)

    def ref(self, quantity: str | None = None) -> str:
        """``owner/name@commit:file::function`` of ``quantity`` (meta ``sources[quantity]``, else the file's)."""
        src = {**self.meta, **self.meta.get("sources", {}).get(quantity or "", {})}
        if "repository" not in src:
            return src["reference"]  # a paper's equation: no code
        return f"{src['repository']}@{src['commit'][:7]}:{src['file']}::{src['function']}"


def golden(name: str) -> Golden:
    """Golden file ``name``; a float64 check refuses one made in float32 (a generator without ``FLOAT64``)."""
    g = _golden(name)
    if working_dtype() == torch.float64 and g.meta.get("dtype") != "float64":
        raise AssertionError(f"{name} was made in float32: regenerate it with the authors' code in float64 (its "
                             "generator's FLOAT64, tests/golden/README.md)")
    return g


@functools.cache
def _golden(name: str) -> Golden:
    with np.load(GOLDEN / f"{name}.npz", allow_pickle=False) as f:
        arrays = dict(f)
    return Golden(arrays, json.loads((GOLDEN / f"{name}.json").read_text()))


@dataclass(frozen=True)
class Tol:
    """A check's tolerance and, in a few words, how it follows from the quantity and float32 rounding (the
    tolerance column of docs/conformance.md): made by the derivation helpers below, never a bare number."""

    value: float
    how: str

    def __post_init__(self):
        if not self.how:
            raise ValueError("a tolerance says how it was derived")


@dataclass(frozen=True)
class Check:
    """One compared quantity: ``diff`` (max abs difference, or the stated measure) must be <= ``tol.value``."""

    method: str
    quantity: str
    reference: str
    diff: float
    tol: Tol
    measure: str = "max abs diff"
    detail: str = ""  # what the measured column adds (how many sign-noise flips), not checked for staleness

    def __post_init__(self):
        if not isinstance(self.tol, Tol):
            raise TypeError(f"{self.method} / {self.quantity}: a tolerance is a Tol from a derivation helper, "
                            f"not {self.tol!r}")

    @property
    def ok(self) -> bool:
        return bool(self.diff <= self.tol.value)


@dataclass(frozen=True)
class Difference:
    """A deliberate departure from a reference, and the key that switches it."""

    method: str
    what: str
    key: str


CASES: dict[str, Callable[[], list[Check]]] = {}
SETTINGS_ONLY: set[str] = set()  # cases that compare settings, schedules and orders exactly: no arithmetic to round
DIFFERENCES: list[Difference] = []


def case(name: str, arithmetic: bool = True):
    """Register a conformance case: a function returning its :class:`Check` rows (run by :func:`checks`);
    ``arithmetic=False``: its checks compare settings exactly, the same in any precision, so it runs once (in
    fastfair's float32)."""
    def register(fn):
        if name in CASES:
            raise ValueError(f"conformance case {name!r} registered twice")
        CASES[name] = fn
        if not arithmetic:
            SETTINGS_ONLY.add(name)
        return fn
    return register


@functools.cache
def checks(name: str, dtype: torch.dtype) -> list[Check]:
    """Case ``name``'s rows with both sides in ``dtype`` (:func:`precision`), run once."""
    with precision(dtype):
        return CASES[name]()


def differs(method: str, what: str, key: str) -> None:
    """Record a deliberate difference from the reference (listed in docs/conformance.md)."""
    DIFFERENCES.append(Difference(method, what, key))


def load_cases() -> dict[str, Callable[[], list[Check]]]:
    """Import every ``conformance_*.py`` beside this file (each registers its cases)."""
    for path in sorted(Path(__file__).resolve().parent.glob("conformance_*.py")):
        importlib.import_module(path.stem)
    return CASES


def normals(seed: int, shape) -> torch.Tensor:
    """N(0, 1) draws (float32 values, as a float64 tensor) that are the same on every CPU: numpy's PCG64. Made-up
    inputs are drawn so: torch.randn's Box-Muller rounds differently in its vectorised (AVX2, AVX-512) and plain
    kernels (up to 2.4e-6 apart, measured), which a float64 check resolves."""
    draws = np.random.default_rng(seed).standard_normal(tuple(shape), dtype=np.float32)
    return torch.from_numpy(draws).double()


def max_diff(a, b) -> float:
    """max |a - b| in float64 (0 for empty tensors)."""
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float((a - b).abs().max()) if a.numel() else 0.0


def rel_diff(ours, ref) -> float:
    """max |ours - ref| / max |ref| in float64: for gradients, whose scale depends on the inputs."""
    ref = torch.as_tensor(ref).double()
    return max_diff(ours, ref) / max(float(ref.abs().max()), 1e-30)


REL = "max abs diff / max abs ref"

# -- float32 rounding: where the tolerances come from --------------------------------------------------------

U32 = 2.0 ** -24  # float32 unit roundoff
U64 = 2.0 ** -53  # float64 unit roundoff


def unit() -> float:
    """The unit roundoff of the precision the checks run in: every derived tolerance is in it."""
    return U64 if working_dtype() == torch.float64 else U32
# A float32 sum of n terms, in any order the CPU's kernels choose (blocked, vectorised, FMA), differs from the exact
# sum by at most gamma(n) * sum |terms| with probability >= 1 - 2 n exp(-LAMBDA^2 / 2) per sum (Higham & Mary 2019,
# "A new approach to probabilistic rounding error analysis", Thm 3.1: lambda sqrt(n) u); LAMBDA 6 makes that 1e-7.
LAMBDA = 6.0


def gamma(n: int, u: float | None = None) -> float:
    """Probabilistic bound on the relative rounding error of an n-term sum in the precision's :func:`unit`, or in
    ``u`` (a sum that is float64 whatever the precision: numpy's) (Higham & Mary 2019, Thm 3.1)."""
    return LAMBDA * math.sqrt(n) * (unit() if u is None else u)


def head_bound(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A bound on |float32 logits - exact logits| of a :class:`TinyNet` ``model`` (in its own mode) at ``x``, per
    element: the head's sum of 1024 + 1 terms errs by at most gamma(1025) of its sum of |terms| (Higham & Mary 2019,
    Thm 3.1), on either side (2x); the features it sums carry the same relative error (:func:`routing_ties`)
    that the head's |W| sums no larger. A model whose head is a cosine head (``.head``, HE: s cos(W_k, h)) under
    TinyNet's features: a cosine is a dot product of two unit vectors, within gamma(n) of its sum of |terms|, after
    two normalisations, each a norm of n squares (within gamma(n) / 2 relative, the square root halving it) that
    moves the cosine by that fraction of itself: s (gamma(n) sum|h_i w_i| + gamma(n) |cos|), 2x as above."""
    net = copy.deepcopy(model).double()
    with torch.no_grad():
        h = net.features(x.detach().double()).flatten(1)
        head = net.fc if hasattr(net, "fc") else net.head
        if isinstance(head, nn.Linear):
            bias = head.bias.abs() if head.bias is not None else 0.0
            return 2 * gamma(head.in_features + 1) * (h.abs() @ head.weight.abs().t() + bias)
        hn, wn = F.normalize(h, dim=1), F.normalize(head.weight, dim=1)
        n = head.weight.shape[1]
        return 2 * float(head.scale) * gamma(n) * (hn.abs() @ wn.abs().t() + (hn @ wn.t()).abs())


def routing_ties(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Input elements (bool, ``x``'s shape) whose gradient may pass through a ReLU or a max-pool on either side of
    its decision: where the exact (float64) ReLU input lies within float32's error of 0, or a max-pool window's top
    two within twice it of each other, two correct float32 implementations may route the gradient differently, so
    each may step such an element the other way whatever the size of its gradient. Every element of such a unit's
    receptive field is marked. ``model``: a :class:`TinyNet` in the attack's BN mode (a train-mode tie in one image
    moves the others' gradients through the batch statistics only by ~1/(N H W)); any other model marks none.

    A value's float32 error is taken as gamma(fan-in of the conv before it) of its layer's largest magnitude in the
    sample: the last sum's rounding (BN re-normalises what earlier layers carried in at the same relative size).
    Measured, float32 against float64: 2.5e-7, 3e-7, 2.7e-7 and 4.3e-7 of that scale after conv1, BN1, conv2, BN2,
    against gamma(28) = 1.9e-6 and gamma(73) = 3.1e-6."""
    if not isinstance(model, TinyNet):
        return torch.zeros_like(x, dtype=torch.bool)
    net = copy.deepcopy(model).double()
    h, fan_in = x.detach().double(), 1
    marked = torch.zeros(x.shape, dtype=torch.bool)
    with torch.no_grad():
        for i, layer in enumerate(net.features):
            if isinstance(layer, nn.Conv2d):
                fan_in = layer.weight[0].numel() + 1
            err = gamma(fan_in) * h.flatten(1).abs().amax(1).view(-1, 1, 1, 1)
            tie = None
            if isinstance(layer, nn.ReLU):
                tie = h.abs() <= err
            elif isinstance(layer, nn.MaxPool2d):
                n, c, hh, ww = h.shape
                win = h.view(n, c, hh // 2, 2, ww // 2, 2).permute(0, 1, 2, 4, 3, 5).reshape(n, c, hh // 2, ww // 2, 4)
                top = win.topk(2, dim=-1).values
                near = (top[..., 0] > 0) & (top[..., 0] - top[..., 1] <= 2 * err.view(-1, 1, 1, 1))
                tie = near.repeat_interleave(2, 2).repeat_interleave(2, 3)
            if tie is not None:
                marked |= _receptive_field(net.features[:i], tie.any(1, keepdim=True), x.shape[1])
            h = layer(h)
    return marked


def _receptive_field(layers, mask: torch.Tensor, channels: int) -> torch.Tensor:
    """The input elements (every channel) on which the units ``mask`` ((N, 1, H, W) after ``layers``) depend."""
    m = mask.double()
    for layer in reversed(list(layers)):
        if isinstance(layer, nn.Conv2d):
            k = layer.kernel_size[0]
            m = F.max_pool2d(m, k, stride=1, padding=k // 2)
        elif isinstance(layer, nn.MaxPool2d):
            m = m.repeat_interleave(2, 2).repeat_interleave(2, 3)
    return (m > 0).expand(-1, channels, -1, -1)


# A float32 input-gradient element whose magnitude is below this fraction of its sample's largest has no sure sign.
# Its backward pass chains four sums (the head's 1024 terms, BN's batch sums of N H W = 16,384, the two convs' 72
# and 27): each errs by at most gamma(n) of its sum of |terms| (gamma(16,384) = 4.6e-5, the largest), and the terms'
# sum is of the order of the sample's largest gradient, so 1e-4 bounds the error of every element. (Measured: the
# float32 input gradients here are within 4.5e-7 of the sample's max of the float64 ones, on AVX2 and AVX-512.)
# Two correct implementations may disagree on such an element's sign; a step that differs elsewhere, outside the
# receptive field of a routing tie (:func:`routing_ties`), is a real difference.
SIGN_NOISE = 1e-4


def sign_noise() -> float:
    """:data:`SIGN_NOISE` in the precision's unit: the same four sums, gamma(16,384) = 8.5e-14 in float64."""
    return SIGN_NOISE * unit() / U32


def kl_grad(model: nn.Module, x: torch.Tensor, x_k: torch.Tensor, coded: torch.Tensor) -> torch.Tensor:
    """A gradient for :func:`step_flips` of the ``kl`` objective KL(p(x) || p(x_k)) at ``x_k`` (``model`` a
    :class:`TinyNet` in the attack's BN mode): ``coded`` (the code's signs, its noise elements below SIGN_NOISE)
    where it marks noise, else the exact (float64) gradient, zeroed where it lies within float32's error of 0.
    That error is not SIGN_NOISE of the sample's largest element here: the gradient is first order in
    z(x_k) - z(x), while each side's logits err by :func:`head_bound`, so the upstream softmax difference carries
    their ratio as relative error (at the first step from x + 0.001 N(0, I): ~5e-3 against ~7e-4, 14 %)."""
    net = copy.deepcopy(model).double()
    x64 = x.detach().double()
    xk = x_k.detach().double().requires_grad_()
    with torch.enable_grad():
        z_nat = net(x64).detach()
        z = net(xk)
        kl = F.kl_div(F.log_softmax(z, 1), F.log_softmax(z_nat, 1), reduction="sum", log_target=True)
        grad, = torch.autograd.grad(kl, xk)
    with torch.no_grad():
        ratio = (head_bound(model, x_k) + head_bound(model, x)).amax(1) / (z.detach() - z_nat).abs().amax(1)
    grad = grad / grad.flatten(1).abs().amax(1).view(-1, 1, 1, 1)  # each sample's largest 1, as ``coded``'s
    exact = torch.where(grad.abs() <= (sign_noise() + ratio).view(-1, 1, 1, 1), torch.zeros_like(grad), grad)
    return torch.where(coded.abs() <= sign_noise() * coded.flatten(1).abs().amax(1).view(-1, 1, 1, 1), coded.double(),
                       exact)


def step_flips(ours: torch.Tensor, theirs: torch.Tensor, grad: torch.Tensor, alpha,
               routed: torch.Tensor | None = None) -> tuple[int, int]:
    """(elements where one PGD step from the same point differs, of those the ones NOT explained by
    a sign flip of a gradient element within float32 noise of zero (:data:`SIGN_NOISE`) or, where ``routed``
    (:func:`routing_ties`) marks it, reached through a ReLU or max-pool float32 may decide either way)."""
    ours, theirs, grad = ours.double(), theirs.double(), grad.double()
    differ = (ours - theirs).abs() > 1e-6
    scale = grad.flatten(1).abs().amax(1).view((-1,) + (1,) * (grad.dim() - 1))
    noise = grad.abs() <= sign_noise() * scale
    if routed is not None:
        noise = noise | routed
    # a sign flip moves the element by at most 2 alpha (both sides then clip to the same ball)
    a = torch.as_tensor(alpha, dtype=torch.float64)
    a = a.view((-1,) + (1,) * (grad.dim() - 1)) if a.dim() else a
    within = (ours - theirs).abs() <= 2 * a + 1e-6
    return int(differ.sum()), int((differ & ~(noise & within)).sum())


STEPS = "elements not explained by sign noise"
# The K-step results run free from the code's start: a float32-noise sign flip (step_flips) sends one element
# the other way and its later gradients with it, and how far that spreads depends on the CPU's kernels.
# This bound is measured, not derived, and must be: rounding bounds how large a gradient element's error is
# (SIGN_NOISE, routing_ties), so they bound which elements of ONE step may go the other way (the exact one-step
# checks above); but once one element moves by 2 alpha, the next step starts from a different point, and every
# element whose gradient that 2 alpha moves across zero (through the whole network, not within rounding) may
# flip too. How many do is the attack's own sensitivity to its start, a property of the model and images with no
# float32 bound: a chaotic map run 10 or 20 times. So K_TOL is the measured spread with a margin, and the
# measured wrong variants show it still separates them. Measured, fraction of elements differing: on an
# AMX/AVX-512 Xeon (the golden files): TRADES 1.4 %, fastfair with oneDNN off against on 2.2 %; on an AVX2-only
# AMD EPYC (docs/conformance.md, regenerated there): at most 1.3 % (TRADES), then 0.89 % (FRL reweight), 0.75 %
# (CFA TRADES), none above. A real difference moves far more: a step 10 % smaller 35 %, one step fewer 30 %, the
# other BN mode 59 %. The one-step checks above are the exact ones.
K_TOL = 5e-2
FRACTION = "fraction of elements differing"


# -- tolerances of compared values, derived from float32 rounding -------------------------------------------

ONE_STEP = Tol(0.0, "0 beyond sign noise (SIGN_NOISE, routing_ties)")
K_STEP = Tol(K_TOL, "measured spread (K_TOL)")


def exact(why: str) -> Tol:
    """0: the quantity is a count, a decision or a copy, equal on both sides whatever the rounding (``why``)."""
    return Tol(0.0, why)


def rounded(ref, roundings: int, what: str) -> Tol:
    """``roundings`` float32 roundings of values up to ``ref``'s largest magnitude, each within u of it (IEEE 754
    round to nearest): ``what`` says which roundings."""
    return Tol(roundings * unit() * float(torch.as_tensor(ref).double().abs().max()), f"{roundings}u·max|ref|: {what}")


def ce_sums_tol(z: torch.Tensor, y: torch.Tensor, classes: int = 10) -> Tol:
    """Per-class sums of CE(z, y) over a class's rows, from the same float32 logits ``z`` on both sides: each sum
    within gamma(n_c) of its (non-negative) value (Higham & Mary 2019, Thm 3.1), each term's log-softmax
    normalisation within gamma(C) max|z| of its row, which moves CE by at most twice that (|dCE/dz|_1 <= 2);
    independent, so in root sum of squares, sqrt(2) for ours and the reference."""
    z = z.detach().double()
    ce = F.cross_entropy(z, y, reduction="none")
    norm = 2 * gamma(z.shape[1]) * z.abs().amax(1)
    worst = 0.0
    for c in range(classes):
        rows = y == c
        if rows.any():
            worst = max(worst, math.hypot(gamma(int(rows.sum())) * float(ce[rows].sum()),
                                          float(norm[rows].norm())))
    return Tol(math.sqrt(2) * worst, "√2 ‖gamma(n_c)·Σ CE, 2 gamma(C)·max|z| per row‖")


def worst_of(tols) -> Tol:
    """The loosest of several tolerances of one check that compares its worst case (a max over epochs, parts)."""
    return max(tols, key=lambda t: t.value)


class Logged(nn.Module):
    """A float64 copy of a :class:`TinyNet` that keeps each forward's input and logits (for :func:`logit_tol`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.net = copy.deepcopy(model).double()
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, x):
        with torch.enable_grad():
            z = self.net(x.double())
        self.seen.append((x.detach(), z))
        return z

    def __getattr__(self, name):  # what a method reads of its model (HE's margin: model.head.scale) is the copy's
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.net, name)


def logit_error(model: nn.Module, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """One side's float32 error of each logit of ``model`` at ``x`` as a loss reads it: :func:`head_bound`, plus
    the row's log-softmax normalisation (a C-term sum: gamma(C) of the row's largest |z|), which moves a row's
    log-probabilities as an error of that size in its logits would."""
    return head_bound(model, x) + gamma(z.shape[1]) * z.detach().abs().amax(1, keepdim=True)


def logit_bounds(quantity: Callable[[nn.Module], torch.Tensor], model: nn.Module, sides: int = 2) -> torch.Tensor:
    """Both sides' float32 error of each element of ``quantity(model)``: a mean (or sum) of non-negative per-row
    terms, or a vector of such, evaluated through ``model`` (a :class:`TinyNet`) in float64 to take its derivative
    w.r.t. every logit it reads. To first order the error is a linear combination of independent rounding errors:
    the mean's (gamma(rows)|Q|, rows all the rows of every forward it made, the terms' sum of |terms| being their
    sum) and each logit's (:func:`logit_error`) times |dQ/dz|; Higham & Mary's model (2019, Thm 3.1: independent,
    mean zero, bounded) bounds such a combination by the root sum of squares of its parts at the same lambda, and
    ours and the reference err independently: sqrt(``sides``) times that (1 against a float64 reference)."""
    logged = Logged(model)
    with torch.enable_grad():
        q = torch.as_tensor(quantity(logged)).double().flatten()
    values = q.detach()
    zs = [z for _, z in logged.seen]
    rows = sum(len(z) for z in zs)
    errs = [logit_error(model, x, z) for x, z in logged.seen]
    bounds = torch.zeros(q.numel(), dtype=torch.float64)
    for k in range(q.numel()):
        grads = torch.autograd.grad(q[k], zs, retain_graph=True, allow_unused=True)
        carried = sum(float((g * e).square().sum()) for g, e in zip(grads, errs) if g is not None)
        bounds[k] = math.sqrt(sides) * math.sqrt((gamma(rows) * float(values[k])) ** 2 + carried)
    return bounds


def logit_tol(quantity: Callable[[nn.Module], torch.Tensor], model: nn.Module, sides: int = 2) -> Tol:
    """:func:`logit_bounds` of the worst element of ``quantity``."""
    rows = []

    def counted(net):
        out = quantity(net)
        rows.append(sum(len(z) for _, z in net.seen))
        return out

    worst = float(logit_bounds(counted, model, sides).max())
    return Tol(worst, f"{_sides(sides)}‖gamma({rows[0]})|Q|, dQ/dz·logit error‖")


def _sides(sides: int) -> str:
    return "√2 " if sides == 2 else ""


def relative(tol: Tol, ref) -> Tol:
    """``tol`` as a fraction of max|``ref``| (for the measure :data:`REL`)."""
    return Tol(tol.value / float(torch.as_tensor(ref).double().abs().max()), f"{tol.how} / max|ref|")


def softmax_tol(model: nn.Module, x: torch.Tensor) -> Tol:
    """Both sides' float32 error of softmax(``model``(``x``)) (a :class:`TinyNet` in its own mode), per element:
    a logit error e (:func:`logit_error`) moves p_i by at most p_i (e_i + sum_j p_j e_j) to first order, and the
    softmax's exponentials and division round within 3u of p_i, its C-term sum within gamma(C) of it; sqrt(2)
    for ours and the reference. The bound of the worst element."""
    net = copy.deepcopy(model).double()
    with torch.no_grad():
        z = net(x.detach().double())
    e, p = logit_error(model, x, z), z.softmax(1)
    bound = p * (e + (p * e).sum(1, keepdim=True)) + (gamma(z.shape[1]) + 3 * unit()) * p
    return Tol(math.sqrt(2) * float(bound.max()), "√2 p·(e + Σ p e) + (gamma(C) + 3u) p")


def weight_grad_tol(quantity: Callable[[nn.Module], torch.Tensor], model: nn.Module, sides: int = 2) -> Tol:
    """Both sides' float32 error of the weight gradient of ``quantity(model)`` (a :class:`TinyNet`), relative to
    its largest element (the measure :data:`REL`). Each parameter's gradient element is a float32 sum over the
    batch (and positions) of n products: within gamma(n) of its sum of |terms| (Higham & Mary 2019, Thm 3.1),
    computed here in float64 from each layer's input and output gradient; the products' factors carry in the
    relative error of the longest sum the forward and backward chain (BN's batch sums of N H W, as for
    :data:`SIGN_NOISE`), gamma(that). Independent errors add in root sum of squares under the same model, and
    ours and the reference err independently: sqrt(``sides``) times that (1 against a float64 reference)."""
    net = copy.deepcopy(model).double()
    seen: list[tuple[nn.Module, list]] = []

    def keep(module, args, out):
        if out.requires_grad:
            record = [args[0].detach()]
            seen.append((module, record))
            out.register_hook(lambda g: record.append(g.detach()))

    handles = [mod.register_forward_hook(keep) for mod in net.modules()
               if isinstance(mod, (nn.Conv2d, nn.Linear, nn.BatchNorm2d)) or hasattr(mod, "unit_weight")]
    logged = Logged(model)
    logged.net = net
    with torch.enable_grad():
        q = torch.as_tensor(quantity(logged)).double().sum()
        grad = torch.autograd.grad(q, [p for p in net.parameters()])
    for h in handles:
        h.remove()
    sums: dict[tuple[nn.Module, str], list] = {}  # (layer, weight or bias) -> [terms, sum of |terms|]

    def add(key, n, s):
        n0, s0 = sums.get(key, (0, 0.0))
        sums[key] = (n0 + n, s0 + s)

    for mod, record in seen:
        if len(record) < 2:
            continue  # a forward the quantity does not depend on
        inp, gout = record
        if isinstance(mod, nn.Conv2d):
            n = gout[:, 0].numel()
            add((mod, "w"), n, torch.nn.grad.conv2d_weight(inp.abs(), mod.weight.shape, gout.abs(), mod.stride,
                                                          mod.padding))
            add((mod, "b"), n, gout.abs().sum((0, 2, 3)))
        elif isinstance(mod, nn.Linear):
            n = gout.shape[0]
            add((mod, "w"), n, gout.abs().t() @ inp.abs())
            add((mod, "b"), n, gout.abs().sum(0))
        elif hasattr(mod, "unit_weight"):  # a cosine head: s sum_n g_n h_n / |h_n|, through W / |W| (graph)
            n = gout.shape[0]
            terms = float(mod.scale) * gout.abs().t() @ F.normalize(inp, dim=1).abs()
            if mod.weight_norm == "graph":  # (I - w w^T) / |W|: at most twice the terms over the row's norm
                terms = 2 * terms / mod.weight.detach().norm(dim=1, keepdim=True)
            add((mod, "w"), n, terms)
        else:
            n = gout[:, 0].numel()
            dims = (0, 2, 3)
            if mod.training:
                mean, var = inp.mean(dims, keepdim=True), inp.var(dims, unbiased=False, keepdim=True)
            else:
                mean, var = mod.running_mean.view(1, -1, 1, 1), mod.running_var.view(1, -1, 1, 1)
            xhat = (inp - mean) / (var + mod.eps).sqrt()
            add((mod, "w"), n, (gout * xhat).abs().sum(dims))
            add((mod, "b"), n, gout.abs().sum(dims))
    longest = max(n for n, _ in sums.values())
    worst = max(float((math.hypot(gamma(n), gamma(longest)) * s).max()) for n, s in sums.values())
    scale = max(float(g.abs().max()) for g in grad)
    return Tol(math.sqrt(sides) * worst / scale,
               f"{_sides(sides)}‖gamma(n), gamma({longest})‖·Σ|terms| / max|grad|")


def one_steps(model_fn, one, x, y, eps_c, alpha_c, alpha, its, grads, reference=None) -> tuple[int, str]:
    """(unexplained elements, what the measured column adds) of one fastfair step (the attack ``one``, in its
    BN mode, on a fresh ``model_fn()``) from each of the code's iterates ``its[k]`` of the first ``len(its[0])``
    images, compared with ``its[k + 1]`` under :func:`step_flips` with the code's gradients ``grads[k]``;
    ``reference``: the kl objective's logits of those images (a teacher's), as :func:`descend` takes them.
    A kl step's noise elements are those of :func:`kl_grad` (the model's own clean logits; a teacher's reference
    or a model without TinyNet's features keeps the code's)."""
    n = its.shape[1]
    worst = flips = 0
    for k in range(len(grads)):
        model = model_fn()
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            ours = descend(one, model, x[:n], y[:n], eps_c, alpha_c, its[k],
                           reference=None if reference is None else reference[:n])
            routed = routing_ties(model, its[k])
            grad = grads[k]
            if one.objective == "kl" and reference is None and hasattr(model, "features"):
                grad = kl_grad(model, x[:n], its[k], grad)
        f, unexplained = step_flips(ours, its[k + 1], grad, alpha, routed)
        flips, worst = flips + f, max(worst, unexplained)
    return worst, f"{flips} noise flips in {len(grads)} steps"


def steps_from_code(g, model_fn, one, x, y, eps_c, alpha_c, alpha, reference=None):
    """:func:`one_steps` from a golden file kept by ``record.steps_record`` (iterates, each step's gradient over its
    image's largest magnitude)."""
    return one_steps(model_fn, one, x, y, eps_c, alpha_c, alpha, g.t("step_iterates"), g.t("step_grad"), reference)


def differing(a, b) -> float:
    return float((a - b).abs().gt(1e-6).double().mean())


@contextlib.contextmanager
def fixed_start(method, x_start: torch.Tensor):
    """Within the block, ``method``'s attack starts from ``x_start`` instead of drawing its random start."""
    attack = method.attack
    ops = dataclasses.replace(attack.ops, random_start=lambda x, y, eps_c, kind: x_start.clone())
    method.attack = dataclasses.replace(attack, ops=ops)
    try:
        yield method
    finally:
        method.attack = attack


def method(name: str, *sets: str):
    """(fastfair method ``name`` resolved for CIFAR-10 with ``sets`` applied, its 10-class ClassState), on the CPU."""
    return make_method(name, *sets, classes=10, dataset="cifar10")


class Recorder(nn.Module):
    """Wraps a model and records every input that requires grad (a PGD iterate) and the gradient
    autograd computes for it: how a generator sees each step of an authors' attack loop."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.iterates: list[torch.Tensor] = []
        self.grads: list[torch.Tensor] = []
        self.inputs: list[torch.Tensor] = []

    def forward(self, x):
        self.inputs.append(x.detach().clone())
        if x.requires_grad:
            self.iterates.append(x.detach().clone())
            x.register_hook(lambda g: self.grads.append(g.detach().clone()))
        return self.model(x)


def weight_grad(model: nn.Module, loss: torch.Tensor) -> torch.Tensor:
    """The gradient of ``loss`` w.r.t. every parameter of ``model``, flattened into one vector."""
    grads = torch.autograd.grad(loss, [p for p in model.parameters()])
    return torch.cat([g.flatten() for g in grads])


# -- docs/conformance.md -------------------------------------------------------------------------

HEADER = """# Conformance with the authors' code

Written by `python tests/golden/make.py doc` from the checks in `tests/conformance_*.py`, one table per case;
`tests/test_conformance.py` runs every check on each CI run and fails when this page no longer
lists exactly those checks with these references and tolerances (the measured columns are from the
last regeneration: {measured_on}). Golden values: `python tests/golden/make.py golden --authors DIR`
(DIR holds a checkout of each repository named below, as `owner+name` or `name`; see
`tests/golden/README.md`).

A reference `owner/name@commit:file::function` is the authors' code, run on the fixed inputs in
`tests/golden/inputs.npz` (a small BatchNorm CNN trained briefly on the real CIFAR-10 subset, one
batch of its images); a reference naming a paper and equation is an independent float64
evaluation of that equation, sharing no code with fastfair.

Each check runs twice. **float64**: the golden values were made with the authors' code in float64 (model and
inputs `.double()`, their float32 casts patched; each golden file's JSON lists the patches), and fastfair runs in
float64 too, so a tolerance is a float64 rounding bound (u = 2^-53), about 1e-10 of the quantity or less, the same
whatever a CPU's kernels (AVX2, AVX-512, plain) do with it: a KL weight 0.1 % off fails. **float32 smoke**:
fastfair in float32, its real dtype path, against the same float64 golden values at its float32 bound
(u = 2^-24). The `setup-*` cases compare settings, schedules and orders exactly, the same in any precision: they
run once, and both columns show that run.

An attack is checked exactly one step at a time, from each of the code's iterates (0 elements unexplained
by a gradient sign within rounding noise of zero in the precision). The K-step result, run free from the code's
start, may differ in a few elements, because one such sign flip carries through the later steps and the CPU's
kernels decide which flip: its tolerance is 5 % of the elements, against 1.4 % measured for TRADES in float32 and
2.2 % between fastfair with and without oneDNN (0 in float64, where a flip needs a gradient element within 2e-13
of its image's largest), while a step 10 % smaller moves 35 %, one step fewer 30 % and the other BN mode 59 %.

Tolerances follow from the quantity's magnitude and the precision's rounding, not from one machine's result, and
the tolerance columns say how: a sum of n terms, in whatever order a CPU's kernels choose, is within
gamma(n) = 6 sqrt(n) u of its sum of \\|terms\\| (u = 2^-53 in float64, 2^-24 in float32; Higham & Mary 2019,
Thm 3.1). Each check's bound is computed from its own inputs in float64 (`tests/conformance.py`, "tolerances of
compared values"):

- `logit_tol` (losses, per-class sums): the mean's rounding gamma(rows)·\\|Q\\| and each logit's error
  (`head_bound`, the head's 1024-term sum, plus the row's log-softmax normalisation) carried by the float64
  derivative dQ/dz, combined as Higham & Mary's model combines independent roundings (root sum of squares at the
  same lambda); √2 where ours and the reference both round.
- `weight_grad_tol` (weight gradients, relative to the largest): each gradient element's own sum over the
  batch and positions, gamma(n)·Σ\\|terms\\| computed from every layer's input and output gradient, with the
  relative error its factors carry in (the longest sum of the network, BN's batch sums of N·H·W).
- `softmax_tol`, `ce_sums_tol`, `rounded` (k roundings of the largest value, for quantities that are one or a few
  operations on exact inputs), `exact` (counts, decisions, copies: 0).
- Statistical checks (the code's random draws) use LAMBDA = 6 standard deviations of their sampling law.
- Two tolerances are measured, with the reason they must be: the K-step attack's spread (below) and the C&W
  search's distances.

The teacher's soft-label logits are checked per element against their bound (measure "max abs diff / its
bound", tolerance 1), and a one-step element may also go the other way where the exact (float64) forward
puts a ReLU input or a max-pool's top two within the precision's error of a tie (`conformance.routing_ties`): it
may route the gradient either way there, however large it is; a kl step's gradient elements within rounding
error of 0 are told by `conformance.kl_grad`.
"""


def _tol(c: Check) -> str:
    """A tolerance cell: its value, the measure, and how it was derived (a derivation's ``|`` escaped)."""
    return f"{c.tol.value:.0e} ({c.measure}): {c.tol.how}".replace("|", "\\|")


def _measured(c: Check) -> str:
    return f"{c.diff:.1e}" + (f" ({c.detail})" if c.detail else "")


def case_checks(name: str) -> tuple[list[Check], list[Check]]:
    """(float64 checks, float32 smoke checks) of case ``name``, the two lists row for row the same quantities (one
    list twice for a case of settings: :func:`case`)."""
    smoke = checks(name, torch.float32)
    if name in SETTINGS_ONLY:
        return smoke, smoke
    full = checks(name, torch.float64)
    if [(c.method, c.quantity, c.reference) for c in full] != [(c.method, c.quantity, c.reference) for c in smoke]:
        raise AssertionError(f"case {name}: its float64 and float32 runs compare different quantities")
    return full, smoke


def rows(name: str, checked: tuple[list[Check], list[Check]] | None = None) -> list[tuple[str, str, str, str, str]]:
    """The columns of case ``name``'s table that must not go stale: method, quantity, reference, the float64
    tolerance and the float32 smoke tolerance (each: value, measure, how it was derived). ``checked``: the case's
    :func:`case_checks` where the caller has them already (each run of a case costs seconds to a minute)."""
    full, smoke = checked or case_checks(name)
    return [(c.method, c.quantity, c.reference, _tol(full[i]), _tol(c))
            for i, c in enumerate(smoke)]


def cells(line: str) -> list[str]:
    """The cells of a Markdown table row (split on the pipes not escaped)."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


COLUMNS = ("method", "quantity", "reference", "float64 tolerance", "measured", "float32 smoke tolerance", "measured")


def case_table(name: str) -> list[str]:
    """Case ``name``'s section of docs/conformance.md: a heading naming the case, then its rows."""
    full, smoke = case_checks(name)
    lines = [f"### `{name}`", "", "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for i, (method, quantity, reference, tol64, tol32) in enumerate(rows(name)):
        lines.append(f"| {method} | {quantity} | `{reference}` | {tol64} | {_measured(full[i])} | {tol32} | "
                     f"{_measured(smoke[i])} |")
    return lines + [""]


def doc_sections(doc: str) -> dict[str, list[str]]:
    """Case name -> its section's lines (heading, table, blank line) in the text of docs/conformance.md."""
    out, current = {}, None
    for line in doc.splitlines():
        if line.startswith("## "):
            current = None
        head = re.fullmatch(r"### `(.+)`", line)
        if head:
            current = out.setdefault(head.group(1), [])
        if current is not None:
            current.append(line)
    return out


def render(measured_on: str) -> str:
    lines = [HEADER.format(measured_on=measured_on), "## Checks", ""]
    for name in sorted(load_cases()):
        lines += case_table(name)
    lines += ["## Deliberate differences, and the key that switches each", "",
              "| method | difference | key |", "| --- | --- | --- |"]
    for d in sorted(DIFFERENCES, key=lambda d: (d.method, d.what)):
        lines.append(f"| {d.method} | {d.what} | `{d.key}` |")
    return "\n".join(lines) + "\n"
