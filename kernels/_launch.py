"""When a Triton kernel can be launched on a tensor, and launch-size helpers.

``TRITON_INTERPRET=1`` is read by ``triton.jit`` when a kernel is *decorated* (import time of
the kernel modules), so it must be in the environment before ``fastfair.kernels`` is imported.
"""
from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when Triton runs kernels in its NumPy interpreter (CPU tensors, no bf16)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # older triton: the environment variable is the switch
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


def can_launch(t: torch.Tensor) -> bool:
    """A Triton kernel can run on ``t``: a CUDA tensor, or a CPU tensor under the interpreter."""
    if t.device.type == "cuda":
        return True
    return t.device.type == "cpu" and interpreting()


def is_fake(t: torch.Tensor) -> bool:
    """A tracing (fake / meta) tensor: shapes only, no kernel must run on it."""
    if t.device.type == "meta":
        return True
    from torch._subclasses.fake_tensor import is_fake as _is_fake

    return _is_fake(t)


def kernel_dtype(t: torch.Tensor) -> torch.Tensor:
    """The interpreter has no bf16 (NumPy has none): compute on an fp32 copy there."""
    if t.dtype == torch.bfloat16 and interpreting() and t.device.type == "cpu":
        return t.float()
    return t
