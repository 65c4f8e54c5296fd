"""Fused per-row classification loss: one Triton pass computes fastfair.ops.losses.row_loss and its
gradients w.r.t. both logits.

Per row i (u = z / temperature, fp32 whatever the input dtype, log-sum-exp with the row max
subtracted so |z| ~ 1e4 stays finite):

    loss_i = ce_nat CE(u_nat) + ce_adv CE(u_adv) + kl KL(p_nat || p_adv)
             - ent_nat H(p_nat) - ent_adv H(p_adv) + cw_adv min(max_{j!=y} u_adv_j - u_adv_y, kappa)

with the gradients (w.r.t. u; w.r.t. z they are divided by the temperature)

    dCE/du      = p - q,          q = (1 - a) onehot(y) + a / C
    d(-H)/du    = p (log p + H)
    dKL/du_adv  = p_adv - p_nat
    dKL/du_nat  = p_nat (log p_nat - log p_adv - KL)
    dCW/du_adv  = onehot(argmax_{j!=y}) / #ties - onehot(y)   where margin <= kappa, else 0

The terms, their order and the logits each reads come from the table
:data:`fastfair.ops.losses.TERMS` (term k is bit k of the kernel's mask; its weight is a float
argument, or a row of the per-sample weights when it is a tensor); only each term's arithmetic
is written again here, in Triton, and ``tests/test_kernels.py`` checks every table entry against
the reference.

The gradients are written in the same pass and saved by the autograd formula, whose backward
only scales them by ``grad_output`` (each loss row depends on its own logits row only). The
reference (and the fallback on CPU without the Triton interpreter) is
:func:`fastfair.ops.losses.row_loss`. Weights are treated as constants: a weight tensor that
requires grad sends the call to the reference, which differentiates it.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl
from torch.library import triton_op

# The reference ops by name from their module: the fastfair.ops package's triton backend imports this package, so
# reading the package here would close an import cycle (tests/test_imports.py).
from fastfair.ops.losses import TERMS as LOSS_TERMS
from fastfair.ops.losses import Weight, check_weight_names, is_active
from fastfair.ops.losses import row_loss as reference_row_loss

from fastfair.kernels._launch import (can_launch, interpreting, is_fake, kernel_dtype, keep_opaque_when_interpreting,
                                      launcher)

# Everything about the terms comes from the table losses.TERMS (LOSS_TERMS here: the kernel's mask argument is
# named TERMS): term k is bit 1 << k of the kernel's TERMS mask, and the kernel gets k as a constexpr named after the
# term (CE_NAT, ...), with its weight as a float s_<term> or, for a per-sample weight, the row ROW_<TERM> of w_ptr.
# A table entry without a kernel block fails tests/test_kernels.py::test_kernel_implements_every_table_term.
BIT = {t.name: 1 << k for k, t in enumerate(LOSS_TERMS)}
NAT_TERMS = sum(BIT[t.name] for t in LOSS_TERMS if "nat" in t.reads)
ADV_TERMS = sum(BIT[t.name] for t in LOSS_TERMS if "adv" in t.reads)
_TERM_INDEX = {t.name.upper(): k for k, t in enumerate(LOSS_TERMS)}

# Elements of one (rows x BLOCK_C) tile: registers on a GPU; under the interpreter every
# program costs Python overhead, so fewer, bigger tiles are faster there. On a GPU a tile is
# 4 elements per thread and tile array (num_warps in _blocks); see _blocks for why.
_TILE_GPU = 1024
_TILE_INTERPRET = 1 << 16


@triton.jit
def _log_softmax(u, cmask):
    """Row-wise log p and p of a (R, BLOCK_C) tile whose masked columns hold -inf."""
    m = tl.max(u, axis=1)
    shifted = u - m[:, None]
    e = tl.where(cmask, tl.exp(shifted), 0.0)
    s = tl.sum(e, axis=1)
    logp = tl.where(cmask, shifted - tl.log(s)[:, None], 0.0)
    p = e / s[:, None]
    return logp, p


@triton.jit
def _f32(x):
    """A float argument as fp32 (tl.cast: the interpreter passes Python floats, which have no ``.to``)."""
    return tl.cast(x, tl.float32)


@triton.jit
def _weight(w_ptr, stride_w, rows64, rmask, scalar, ROW: tl.constexpr):
    """A term's weight per row: row ``ROW`` of the per-sample weights, or the scalar when ROW < 0."""
    if ROW >= 0:
        return tl.load(w_ptr + ROW * stride_w + rows64, mask=rmask, other=0.0)
    return tl.where(rmask, scalar, 0.0)


@triton.jit
def _row_loss_kernel(
    zn_ptr, za_ptr, y_ptr, w_ptr, loss_ptr, gn_ptr, ga_ptr,
    N, C, stride_zn, stride_za, stride_w,
    smoothing, temperature, kappa,
    s_ce_nat, s_ce_adv, s_kl, s_ent_nat, s_ent_adv, s_cw_adv,
    TERMS: tl.constexpr, HAS_NAT: tl.constexpr, HAS_ADV: tl.constexpr,
    CE_NAT: tl.constexpr, CE_ADV: tl.constexpr, KL: tl.constexpr,
    ENT_NAT: tl.constexpr, ENT_ADV: tl.constexpr, CW_ADV: tl.constexpr,
    ROW_CE_NAT: tl.constexpr, ROW_CE_ADV: tl.constexpr, ROW_KL: tl.constexpr,
    ROW_ENT_NAT: tl.constexpr, ROW_ENT_ADV: tl.constexpr, ROW_CW_ADV: tl.constexpr,
    GRAD_NAT: tl.constexpr, GRAD_ADV: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
):
    # Inductor passes Python floats as fp64, an eager launch as fp32: cast, so both compute in fp32.
    smoothing, temperature, kappa = _f32(smoothing), _f32(temperature), _f32(kappa)
    s_ce_nat, s_ce_adv, s_kl = _f32(s_ce_nat), _f32(s_ce_adv), _f32(s_kl)
    s_ent_nat, s_ent_adv, s_cw_adv = _f32(s_ent_nat), _f32(s_ent_adv), _f32(s_cw_adv)
    pid = tl.program_id(0)
    rows = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_C)
    rmask = rows < N
    cmask = (cols < C)[None, :]
    mask = rmask[:, None] & cmask
    rows64 = rows.to(tl.int64)
    y = tl.load(y_ptr + rows64, mask=rmask, other=0).to(tl.int32)
    is_y = cols[None, :] == y[:, None]
    # Label-smoothed target q (smoothing = 0 gives the one-hot).
    q = tl.where(is_y, 1.0 - smoothing, 0.0) + tl.where(cmask, smoothing / C, 0.0)
    loss = tl.zeros((BLOCK_R,), dtype=tl.float32)
    g_nat = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    g_adv = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)

    if HAS_NAT:
        zn = tl.load(zn_ptr + rows64[:, None] * stride_zn + cols[None, :], mask=mask, other=0.0)
        un = tl.where(cmask, zn.to(tl.float32) / temperature, float("-inf"))
        logp_n, p_n = _log_softmax(un, cmask)
    if HAS_ADV:
        za = tl.load(za_ptr + rows64[:, None] * stride_za + cols[None, :], mask=mask, other=0.0)
        ua = tl.where(cmask, za.to(tl.float32) / temperature, float("-inf"))
        logp_a, p_a = _log_softmax(ua, cmask)

    if (TERMS >> CE_NAT) & 1:  # losses.TERMS "ce_nat": +CE(u_nat)
        w = _weight(w_ptr, stride_w, rows64, rmask, s_ce_nat, ROW_CE_NAT)
        nll = -tl.sum(tl.where(is_y, logp_n, 0.0), axis=1)
        mean = tl.sum(logp_n, axis=1) / C
        loss += w * ((1.0 - smoothing) * nll - smoothing * mean)
        g_nat += w[:, None] * (p_n - q)
    if (TERMS >> CE_ADV) & 1:  # losses.TERMS "ce_adv": +CE(u_adv)
        w = _weight(w_ptr, stride_w, rows64, rmask, s_ce_adv, ROW_CE_ADV)
        nll = -tl.sum(tl.where(is_y, logp_a, 0.0), axis=1)
        mean = tl.sum(logp_a, axis=1) / C
        loss += w * ((1.0 - smoothing) * nll - smoothing * mean)
        g_adv += w[:, None] * (p_a - q)
    if (TERMS >> KL) & 1:  # losses.TERMS "kl": +KL(p_nat || p_adv)
        w = _weight(w_ptr, stride_w, rows64, rmask, s_kl, ROW_KL)
        diff = logp_n - logp_a
        kl = tl.sum(p_n * diff, axis=1)
        loss += w * kl
        g_adv += w[:, None] * (p_a - p_n)
        g_nat += w[:, None] * (p_n * (diff - kl[:, None]))
    if (TERMS >> ENT_NAT) & 1:  # losses.TERMS "ent_nat": -H(p_nat)
        w = _weight(w_ptr, stride_w, rows64, rmask, s_ent_nat, ROW_ENT_NAT)
        h = -tl.sum(p_n * logp_n, axis=1)
        loss -= w * h
        g_nat += w[:, None] * (p_n * (logp_n + h[:, None]))
    if (TERMS >> ENT_ADV) & 1:  # losses.TERMS "ent_adv": -H(p_adv)
        w = _weight(w_ptr, stride_w, rows64, rmask, s_ent_adv, ROW_ENT_ADV)
        h = -tl.sum(p_a * logp_a, axis=1)
        loss -= w * h
        g_adv += w[:, None] * (p_a * (logp_a + h[:, None]))
    if (TERMS >> CW_ADV) & 1:  # losses.TERMS "cw_adv": +CW margin of u_adv, clamped at kappa
        w = _weight(w_ptr, stride_w, rows64, rmask, s_cw_adv, ROW_CW_ADV)
        others = tl.where(is_y, float("-inf"), ua)
        top = tl.max(others, axis=1)
        u_y = tl.sum(tl.where(is_y, ua, 0.0), axis=1)
        margin = top - u_y
        loss += w * tl.minimum(margin, kappa)
        # amax spreads its gradient evenly over ties, clamp passes it where margin <= kappa.
        ties = tl.where(cmask & (others == top[:, None]), 1.0, 0.0)
        n_ties = tl.sum(ties, axis=1)
        live = tl.where(margin <= kappa, w, 0.0)
        g_adv += live[:, None] * (ties / n_ties[:, None] - tl.where(is_y, 1.0, 0.0))

    tl.store(loss_ptr + rows64, loss, mask=rmask)
    if GRAD_NAT:
        g = g_nat / temperature
        tl.store(gn_ptr + rows64[:, None] * C + cols[None, :], g.to(gn_ptr.dtype.element_ty), mask=mask)
    if GRAD_ADV:
        g = g_adv / temperature
        tl.store(ga_ptr + rows64[:, None] * C + cols[None, :], g.to(ga_ptr.dtype.element_ty), mask=mask)


def _blocks(n: int, c: int) -> tuple[int, int, int]:
    block_c = triton.next_power_of_2(max(c, 2))
    tile = _TILE_INTERPRET if interpreting() else _TILE_GPU
    block_r = max(1, min(tile // block_c, triton.next_power_of_2(max(n, 1))))
    # 4 fp32 elements per thread and tile array (a dozen arrays live at once). At 8 (tile 2048,
    # the same warps) ptxas spilled 8 B in the CW row (bf16, C = 10, sm_80): each thread held 8
    # rows, each with its own label and row-mask predicates, more than a thread's 7 predicate
    # registers: ptxas moved them to general registers and spilled two. At 4 every term set
    # compiles with no spill and 32-86 registers (was 40-153) on sm_80 and sm_90, triton 3.6.0
    # and 3.7.1; a grid of N <= 512 rows is at most 64 CTAs, one per SM, so registers do not
    # limit occupancy (bench/results/kernels-aot-triton*.md).
    num_warps = max(4, min(16, block_r * block_c // 128))
    return block_r, block_c, num_warps


def _launch_row_loss(z_nat, z_adv, y, rows, scalars, row_of, terms, smoothing, temperature, kappa, grad_nat,
                     grad_adv):
    ref = z_adv if z_adv is not None else z_nat
    n, c = ref.shape
    loss = torch.empty(n, device=ref.device, dtype=torch.float32)
    nat_dtype = ref.dtype if z_nat is None else z_nat.dtype
    g_nat = torch.empty((n, c) if grad_nat else (0,), device=ref.device, dtype=nat_dtype)
    g_adv = torch.empty((n, c) if grad_adv else (0,), device=ref.device, dtype=ref.dtype)
    if n == 0 or is_fake(ref) and interpreting():
        # Under the interpreter launcher() hands back the raw kernel, which cannot run on
        # fake tensors: shapes are all a tracer needs.
        return loss, g_nat, g_adv
    zn = kernel_dtype(z_nat if z_nat is not None else ref)
    za = kernel_dtype(z_adv if z_adv is not None else ref)
    if zn.stride(1) != 1:
        zn = zn.contiguous()
    if za.stride(1) != 1:
        za = za.contiguous()
    gn = g_nat if g_nat.dtype != torch.bfloat16 or not interpreting() else torch.empty_like(g_nat, dtype=torch.float32)
    ga = g_adv if g_adv.dtype != torch.bfloat16 or not interpreting() else torch.empty_like(g_adv, dtype=torch.float32)
    block_r, block_c, num_warps = _blocks(n, c)
    grid = (triton.cdiv(n, block_r),)
    w = loss if rows is None else rows  # no per-sample weights: any pointer (the kernel never reads it)
    launcher(_row_loss_kernel)[grid](
        zn, za, y, w, loss, gn if grad_nat else loss, ga if grad_adv else loss,
        n, c, zn.stride(0), za.stride(0), w.stride(0) if rows is not None else 0,
        float(smoothing), float(temperature), float(kappa),
        *(float(v) for v in scalars),
        TERMS=terms, HAS_NAT=bool(terms & NAT_TERMS), HAS_ADV=bool(terms & ADV_TERMS), **_TERM_INDEX,
        **{f"ROW_{name}": r for name, r in zip(_TERM_INDEX, row_of)},
        GRAD_NAT=grad_nat, GRAD_ADV=grad_adv,
        BLOCK_R=block_r, BLOCK_C=block_c, num_warps=num_warps,
    )
    if gn is not g_nat:
        g_nat.copy_(gn)
    if ga is not g_adv:
        g_adv.copy_(ga)
    return loss, g_nat, g_adv


@triton_op("fastfair::row_loss", mutates_args=())
def row_loss_op(
    z_nat: Optional[torch.Tensor],
    z_adv: Optional[torch.Tensor],
    y: torch.Tensor,
    rows: Optional[torch.Tensor],
    scalars: list[float],
    row_of: list[int],
    terms: int,
    smoothing: float,
    temperature: float,
    kappa: float,
    grad_nat: bool,
    grad_adv: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(loss (N,) fp32, d loss_i / d z_nat_i (N, C) or empty, d loss_i / d z_adv_i (N, C) or empty).

    Term k of ``losses.TERMS`` has weight ``rows[row_of[k]]`` (per sample, fp32) when
    ``row_of[k] >= 0``, else the float ``scalars[k]``; ``terms`` is the mask (:data:`BIT`) of the
    terms to compute (those whose weight is not the float 0).
    """
    return _launch_row_loss(z_nat, z_adv, y, rows, scalars, row_of, terms, smoothing, temperature, kappa,
                            grad_nat, grad_adv)


@row_loss_op.register_kernel("cpu")
def _row_loss_cpu(z_nat, z_adv, y, rows, scalars, row_of, terms, smoothing, temperature, kappa, grad_nat, grad_adv):
    if not interpreting():
        raise RuntimeError(
            "fastfair::row_loss on CPU needs TRITON_INTERPRET=1 set before fastfair.kernels is "
            "imported; fastfair.kernels.row_loss falls back to fastfair.ops.losses.row_loss instead"
        )
    return _launch_row_loss(z_nat, z_adv, y, rows, scalars, row_of, terms, smoothing, temperature, kappa,
                            grad_nat, grad_adv)


def _setup_context(ctx, inputs, output):
    z_nat, z_adv = inputs[0], inputs[1]
    _, g_nat, g_adv = output
    ctx.save_for_backward(g_nat, g_adv)
    ctx.dtypes = (None if z_nat is None else z_nat.dtype, None if z_adv is None else z_adv.dtype)
    ctx.mark_non_differentiable(g_nat, g_adv)


def _backward(ctx, grad_loss, _g_nat, _g_adv):
    g_nat, g_adv = ctx.saved_tensors
    scale = grad_loss.float()[:, None]
    dn = (g_nat.float() * scale).to(ctx.dtypes[0]) if g_nat.numel() else None
    da = (g_adv.float() * scale).to(ctx.dtypes[1]) if g_adv.numel() else None
    return (dn, da) + (None,) * 10


row_loss_op.register_autograd(_backward, setup_context=_setup_context)
keep_opaque_when_interpreting(row_loss_op)


def _needs_grad(z: torch.Tensor | None) -> bool:
    return z is not None and z.requires_grad and torch.is_grad_enabled()


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
    """Drop-in for :func:`fastfair.ops.losses.row_loss` backed by the fused Triton kernel."""
    check_weight_names(weights)
    ref = z_adv if z_adv is not None else z_nat
    weight_grad = any(isinstance(w, torch.Tensor) and w.requires_grad for w in weights.values())
    if ref is None or not can_launch(ref) or weight_grad or ref.dim() != 2:
        return reference_row_loss(z_nat, z_adv, y, smoothing=smoothing, temperature=temperature, kappa=kappa, **weights)
    n = y.shape[0]
    rows, scalars, row_of, terms = kernel_weights(weights, n, ref.device)
    if terms & NAT_TERMS and z_nat is None or terms & ADV_TERMS and z_adv is None:
        raise ValueError("row_loss: a term with a non-zero weight needs logits that were passed as None")
    if not terms:
        return torch.zeros(n, device=ref.device, dtype=torch.float32)
    loss, _, _ = row_loss_op(
        z_nat if terms & NAT_TERMS else None,
        z_adv if terms & ADV_TERMS else None,
        y, rows, scalars, row_of, terms, float(smoothing), float(temperature), float(kappa),
        bool(terms & NAT_TERMS) and _needs_grad(z_nat),
        bool(terms & ADV_TERMS) and _needs_grad(z_adv),
    )
    return loss


def kernel_weights(weights: dict[str, Weight], n: int, device) -> tuple:
    """(rows, scalars, row_of, terms) for :func:`row_loss_op` from ``row_loss``'s keyword weights.

    Float weights travel as kernel arguments; only per-sample tensors become rows of ``rows``
    (a view of the one tensor, or one stack for several), so a call builds no weight tensors.
    """
    scalars, row_of, per_sample, terms = [], [], [], 0
    for term in LOSS_TERMS:
        w = weights.get(term.name, 0.0)
        if is_active(w):
            terms |= BIT[term.name]
        if isinstance(w, torch.Tensor):
            row_of.append(len(per_sample))
            scalars.append(0.0)
            per_sample.append(w.to(device=device, dtype=torch.float32).expand(n))
        else:
            row_of.append(-1)
            scalars.append(float(w))
    if not per_sample:
        rows = None
    elif len(per_sample) == 1:
        rows = per_sample[0].contiguous()[None]  # a view when the weight is already (N,) fp32
    else:
        rows = torch.stack(per_sample)
    return rows, scalars, row_of, terms
