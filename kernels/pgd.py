"""PGD step and random start as Triton kernels, per-class budgets gathered inside the kernel.

Both treat an image batch as flat memory: for a dense tensor whose batch dimension is the
outermost in memory (contiguous NCHW and channels_last NHWC alike, stride(0) = numel / N),
sample ``b`` owns the memory range ``[b * per, (b + 1) * per)``, so a 2-D grid
(sample, chunk) reads the label, eps and alpha once per program as scalars. Other layouts are
copied into the layout of ``x_adv`` (or made contiguous) first. Maths in fp32, stored in the
dtype of ``x_adv`` / ``x``. References: :func:`fastfair.ops.steps.pgd_step` and
:func:`fastfair.ops.steps.random_start`; they are also the fallback on CPU without the
Triton interpreter.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op

# The reference ops by name from their module: the fastfair.ops package's triton backend imports this package, so
# reading the package here would close an import cycle (tests/test_imports.py).
from fastfair.ops.steps import pgd_step as reference_pgd_step
from fastfair.ops.steps import random_start as reference_random_start

from fastfair.kernels._launch import (can_launch, interpreting, is_fake, kernel_dtype, keep_opaque_when_interpreting,
                                      launcher)

# Launch config, per program: BLOCK elements over WARPS warps, 4 per thread (one 128-bit load per
# thread and tensor in fp32). The register budget is what binds: at N = 512 CIFAR images the grid
# is N x 6 = 3072 programs of 128 threads, 16 per SM (the SM's 2048 threads, A100 and H100 alike),
# and 65536 registers / 2048 threads = 32 per thread (bench/lease/kernels_aot.py's one-wave ceiling).
# At BLOCK 1024 (8 per thread) ptxas used 34 registers for the uniform start (fp32, sm_80) and 39
# for the normal one, above the 32 that grid (1536 programs, 15 per A100 SM) allows, and spilled
# 4 B in the normal start in bf16; at 512 the starts use 30-32 and the step 21-28, no spills, on
# sm_80 and sm_90 with triton 3.6.0 and 3.7.1 (bench/results/kernels-aot-triton*.md). The block
# does not change a draw: Philox is keyed by the element's flat index, not by the program.
_BLOCK = 512
_WARPS = 4


@triton.jit
def _pgd_step_kernel(xa_ptr, g_ptr, x_ptr, y_ptr, eps_ptr, alpha_ptr, out_ptr, PER, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PER
    idx = b.to(tl.int64) * PER + offs
    label = tl.load(y_ptr + b)
    eps = tl.load(eps_ptr + label).to(tl.float32)
    alpha = tl.load(alpha_ptr + label).to(tl.float32)
    xa = tl.load(xa_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    sign = tl.where(g > 0, 1.0, 0.0) - tl.where(g < 0, 1.0, 0.0)
    step = xa + alpha * sign
    out = tl.minimum(tl.maximum(step, x - eps), x + eps)
    out = tl.minimum(tl.maximum(out, 0.0), 1.0)
    tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _random_start_kernel(x_ptr, y_ptr, eps_ptr, seed_ptr, out_ptr, PER, NORMAL: tl.constexpr, BLOCK: tl.constexpr):
    b = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < PER
    idx = b.to(tl.int64) * PER + offs
    seed = tl.load(seed_ptr)
    x = tl.load(x_ptr + idx, mask=mask, other=0.0).to(tl.float32)
    if NORMAL:  # TRADES: x + 0.001 N(0, I), not clipped
        out = x + 0.001 * tl.randn(seed, idx)
    else:  # Madry: U(-eps_y, eps_y) around x, clipped to [0, 1]
        label = tl.load(y_ptr + b)
        eps = tl.load(eps_ptr + label).to(tl.float32)
        out = x + (tl.rand(seed, idx) * 2.0 - 1.0) * eps
        out = tl.minimum(tl.maximum(out, 0.0), 1.0)
    tl.store(out_ptr + idx, out.to(out_ptr.dtype.element_ty), mask=mask)


def _batch_outer_dense(t: torch.Tensor) -> bool:
    """Sample b owns the flat memory range [b * per, (b + 1) * per)."""
    n = t.shape[0]
    if n == 0 or t.numel() == 0:
        return True
    per = t.numel() // n
    if n > 1 and t.stride(0) != per:
        return False
    # The other dims must tile [0, per) exactly: a permutation of a contiguous block.
    dims = sorted((s, d) for s, d in zip(t.stride()[1:], t.shape[1:]) if d != 1)
    expect = 1
    for s, d in dims:
        if s != expect:
            return False
        expect *= d
    return True


def _like(t: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """``t`` with exactly the strides of ``base`` (a copy only when they differ)."""
    if t.stride() == base.stride():
        return t
    return torch.empty_like(base, dtype=t.dtype).copy_(t)


def _grid(x: torch.Tensor):
    n = x.shape[0]
    per = x.numel() // max(n, 1)
    return per, (n, triton.cdiv(per, _BLOCK))


@triton_op("fastfair::pgd_step", mutates_args=())
def pgd_step_op(
    x_adv: torch.Tensor, grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
    eps_c: torch.Tensor, alpha_c: torch.Tensor,
) -> torch.Tensor:
    """One L-inf PGD step with per-class eps / alpha gathered by label (see module doc)."""
    base = x_adv if _batch_outer_dense(x_adv) else x_adv.contiguous()
    out = torch.empty_like(base)
    if x_adv.numel() == 0 or is_fake(x_adv) and interpreting():
        return out
    xa, g, xx = kernel_dtype(base), kernel_dtype(_like(grad, base)), kernel_dtype(_like(x, base))
    res = out if out.dtype != torch.bfloat16 or not interpreting() else torch.empty_like(xa)
    per, grid = _grid(base)
    launcher(_pgd_step_kernel)[grid](xa, g, xx, y, eps_c, alpha_c, res, per, BLOCK=_BLOCK, num_warps=_WARPS)
    if res is not out:
        out.copy_(res)
    return out


@triton_op("fastfair::random_start", mutates_args=())
def random_start_op(x: torch.Tensor, y: torch.Tensor, eps_c: torch.Tensor, seed: torch.Tensor,
                    normal: bool) -> torch.Tensor:
    """PGD init drawn in-kernel (Philox keyed by ``seed``, a 1-element int64 tensor)."""
    base = x if _batch_outer_dense(x) else x.contiguous()
    out = torch.empty_like(base)
    if x.numel() == 0 or is_fake(x) and interpreting():
        return out
    xx = kernel_dtype(base)
    res = out if out.dtype != torch.bfloat16 or not interpreting() else torch.empty_like(xx)
    per, grid = _grid(base)
    launcher(_random_start_kernel)[grid](xx, y, eps_c, seed, res, per, NORMAL=normal, BLOCK=_BLOCK,
                                         num_warps=_WARPS)
    if res is not out:
        out.copy_(res)
    return out


keep_opaque_when_interpreting(pgd_step_op)
keep_opaque_when_interpreting(random_start_op)


def pgd_step(x_adv, grad, x, y, eps_c, alpha_c):
    """Drop-in for :func:`fastfair.ops.steps.pgd_step` (Triton where it can launch)."""
    if not can_launch(x_adv) or x_adv.dim() == 0:
        return reference_pgd_step(x_adv, grad, x, y, eps_c, alpha_c)
    return pgd_step_op(x_adv, grad, x, y, eps_c, alpha_c)


def random_start(x, y, eps_c, kind: str):
    """Drop-in for :func:`fastfair.ops.steps.random_start`: same distributions, drawn in-kernel.

    The Philox seed is drawn from torch's generator on ``x``'s device, so ``torch.manual_seed``
    makes runs reproducible (the numbers differ from the reference's, their law does not).
    """
    if kind not in ("uniform", "normal") or not can_launch(x) or x.dim() == 0:
        return reference_random_start(x, y, eps_c, kind)
    seed = torch.randint(0, 2**62, (1,), device=x.device, dtype=torch.int64)
    return random_start_op(x, y, eps_c, seed, kind == "normal")
