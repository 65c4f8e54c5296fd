"""Per-row classification losses: the one place where fastfair's loss maths is written in PyTorch.

Every method and attack builds its objective from :func:`row_loss`, a weighted sum of a few
terms computed from natural and/or adversarial logits. The weights are floats or per-sample
``(N,)`` tensors (per-class vectors gathered by label), which is how CFA's CCR, class-wise
beta, FRL and cost-sensitive training all fit one call. ``fastfair.kernels`` provides a fused
Triton implementation of exactly this function; this module is its reference.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Weight = float | torch.Tensor


def widened(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32 when it is a narrower float (bf16 or fp16 logits under autocast), else as it is: the loss
    maths runs in float32 at least, and a float64 model's (the conformance checks') stays float64."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()


def label_mask(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N, C) bool one-hot of ``y``; unlike ``F.one_hot`` no range check, which reads y on the host (a sync)."""
    return torch.arange(num_classes, device=y.device) == y[:, None]


def cross_entropy(z: torch.Tensor, y: torch.Tensor, smoothing: float = 0.0) -> torch.Tensor:
    """Per-row CE against q = (1 - a) onehot(y) + a / C (Szegedy et al. 2016, Eq. in Sec. 7; ME paper Sec. 3.1)."""
    logp = F.log_softmax(widened(z), dim=1)
    nll = -logp.gather(1, y[:, None]).squeeze(1)
    if smoothing == 0.0:
        return nll
    return (1.0 - smoothing) * nll - smoothing * logp.mean(dim=1)


def entropy(z: torch.Tensor) -> torch.Tensor:
    """Per-row H(p) = -sum_i p_i log p_i of p = softmax(z) (ME paper Sec. 3.2.1, ME learning)."""
    logp = F.log_softmax(widened(z), dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def trades_kl(z_nat: torch.Tensor, z_adv: torch.Tensor) -> torch.Tensor:
    """Per-row KL(p(x) || p(x')) = sum_i p_i(x) (log p_i(x) - log p_i(x')) (TRADES, Zhang et al. 2019, Eq. 5)."""
    logp_nat = F.log_softmax(widened(z_nat), dim=1)
    logp_adv = F.log_softmax(widened(z_adv), dim=1)
    return (logp_nat.exp() * (logp_nat - logp_adv)).sum(dim=1)


def cw_margin(z: torch.Tensor, y: torch.Tensor, kappa: float = math.inf) -> torch.Tensor:
    """Per-row min(max_{j != y} z_j - z_y, kappa), the CW-inf margin (Carlini & Wagner 2017, Eq. f_6)."""
    z = widened(z)
    z_y = z.gather(1, y[:, None]).squeeze(1)
    others = z.masked_fill(label_mask(y, z.shape[1]), -math.inf)
    return (others.amax(dim=1) - z_y).clamp(max=kappa)


@dataclass(frozen=True)
class Term:
    """One weighted term of :func:`row_loss`; the fused kernel takes its bit and weight row from its index in TERMS."""

    name: str  # the keyword of its weight
    reads: tuple[str, ...]  # the logits it needs, "nat" and/or "adv", in the order ``value`` takes them
    sign: int  # +1 added, -1 subtracted (ME-AT/ME-TRADES maximise entropy)
    doc: str  # what it adds to loss_i, for error messages
    value: Callable[..., torch.Tensor]  # (*logits in ``reads`` order, y, smoothing, kappa) -> (N,) fp32


TERMS: tuple[Term, ...] = (
    Term("ce_nat", ("nat",), +1, "CE(u_nat)", lambda z, y, smoothing, kappa: cross_entropy(z, y, smoothing)),
    Term("ce_adv", ("adv",), +1, "CE(u_adv)", lambda z, y, smoothing, kappa: cross_entropy(z, y, smoothing)),
    Term("kl", ("nat", "adv"), +1, "KL(p_nat || p_adv)", lambda zn, za, y, smoothing, kappa: trades_kl(zn, za)),
    Term("ent_nat", ("nat",), -1, "-H(p_nat)", lambda z, y, smoothing, kappa: entropy(z)),
    Term("ent_adv", ("adv",), -1, "-H(p_adv)", lambda z, y, smoothing, kappa: entropy(z)),
    Term("cw_adv", ("adv",), +1, "min(max_{j!=y} u_adv_j - u_adv_y, kappa)",
         lambda z, y, smoothing, kappa: cw_margin(z, y, kappa)),
)
TERM_NAMES: tuple[str, ...] = tuple(t.name for t in TERMS)


def check_weight_names(weights: dict[str, Weight]) -> None:
    """Reject a weight that names no term: a typo must not silently drop a term from the loss."""
    unknown = [name for name in weights if name not in TERM_NAMES]
    if unknown:
        known = ", ".join(f"{t.name} ({t.doc})" for t in TERMS)
        raise TypeError(f"row_loss() got unknown weight(s) {', '.join(unknown)}; known terms: {known}")


def is_active(weight: Weight) -> bool:
    """A term is computed unless its weight is the float 0 (a tensor weight counts even if all zeros)."""
    return isinstance(weight, torch.Tensor) or weight != 0.0


def row_loss(
    z_nat: torch.Tensor | None,
    z_adv: torch.Tensor | None,
    y: torch.Tensor,
    *,
    smoothing: float = 0.0,
    temperature: float = 1.0,
    kappa: float = math.inf,
    **weights: Weight,
) -> torch.Tensor:
    """Per-row weighted sum of the :data:`TERMS`, all on logits / temperature; weights by term name.

    loss_i = ce_nat_i CE(z_nat) + ce_adv_i CE(z_adv) + kl_i KL(p(z_nat) || p(z_adv))
             - ent_nat_i H(p(z_nat)) - ent_adv_i H(p(z_adv)) + cw_adv_i margin(z_adv)

    (the entropy weights are *subtracted*: ME-AT/ME-TRADES maximise entropy). Label smoothing
    applies to both CE terms. Terms whose weight is the float 0 (or not given) are skipped, so an
    unused logits argument may be ``None``. Computed in fp32 at least (:func:`widened`). An unknown
    weight name raises ``TypeError``.
    """
    check_weight_names(weights)
    out = torch.zeros(y.shape[0], device=y.device, dtype=torch.float32)
    if temperature != 1.0:
        z_nat = None if z_nat is None else widened(z_nat) / temperature
        z_adv = None if z_adv is None else widened(z_adv) / temperature
    logits = {"nat": z_nat, "adv": z_adv}
    for term in TERMS:
        weight = weights.get(term.name, 0.0)
        if is_active(weight):
            value = term.value(*(logits[r] for r in term.reads), y, smoothing, kappa)
            out = out + weight * (term.sign * value)
    return out
