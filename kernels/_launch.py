"""When a Triton kernel can be launched on a tensor, and launch-size helpers.

``TRITON_INTERPRET=1`` is read by ``triton.jit`` when a kernel is *decorated* (import time of
the kernel modules), so it must be in the environment before ``fastfair.kernels`` is imported.
"""
from __future__ import annotations

import os

import torch
from torch.library import wrap_triton


def _read_interpret() -> bool:
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # older triton: the environment variable is the switch
        return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Read once, when the kernels are decorated (what triton.jit itself does); a plain constant
# also keeps torch.compile from tracing into triton's C getenv (a graph break).
_INTERPRET = _read_interpret()


def interpreting() -> bool:
    """True when Triton runs kernels in its NumPy interpreter (CPU tensors, no bf16)."""
    return _INTERPRET


def launcher(kernel):
    """``kernel`` as a ``triton_op`` body launches it: ``wrap_triton(kernel)``, or the kernel itself when interpreting.

    Under ``TRITON_INTERPRET=1`` ``triton.jit`` returns an ``InterpretedFunction``; torch 2.13's
    ``wrap_triton`` hands that back unchanged, torch 2.11's rejects it. Returning it here does on
    both what 2.13 does (there is nothing to trace: :func:`keep_opaque_when_interpreting`).
    """
    if interpreting():
        return kernel
    return wrap_triton(kernel)


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


def keep_opaque_when_interpreting(op) -> None:
    """Under the interpreter, make AOT tracing keep a ``triton_op`` as one opaque node.

    ``triton_op`` decomposes itself when traced under ``FunctionalTensorMode`` so Inductor sees
    the kernel; but with ``TRITON_INTERPRET=1`` ``launcher`` returns the raw interpreted
    kernel, which cannot be traced (it would run on fake tensors). Here the op stays a call to
    ``fastfair::...`` in the graph (what ``torch.export`` does too) and runs eagerly at run
    time, so ``torch.compile(..., backend="aot_eager")`` works on CPU for tests.
    """
    if not interpreting():
        return
    from torch._subclasses.functional_tensor import FunctionalTensorMode

    def opaque(mode, func, types, args, kwargs):
        return mode.__torch_dispatch__(func, types, args, kwargs)

    op.register_torch_dispatch(FunctionalTensorMode, opaque)
