"""Fused Triton kernels behind ``fastfair.ops.use("triton")``.

Installed as ``fastfair.kernels`` (the top-level folder ``kernels/`` of the repository).
Each kernel lives beside its ``torch.library.triton_op`` wrapper, so ``torch.compile`` traces
into the kernels instead of breaking the graph:

* :mod:`.fused_loss` -- ``fastfair::row_loss``: every term of :func:`fastfair.ops.losses.row_loss`
  and its gradients w.r.t. both logits in one pass; the terms (names, order, logits read) come
  from the table :data:`fastfair.ops.losses.TERMS`.
* :mod:`.pgd` -- ``fastfair::pgd_step`` and ``fastfair::random_start`` with per-class budgets.

On CUDA tensors the kernels run compiled; on CPU tensors they run under the Triton interpreter
when ``TRITON_INTERPRET=1`` was set before this package was imported, and otherwise the public
functions fall back to the PyTorch references.
"""
from __future__ import annotations

from fastfair.kernels.fused_loss import row_loss, row_loss_op
from fastfair.kernels.pgd import pgd_step, pgd_step_op, random_start, random_start_op

__all__ = ["row_loss", "row_loss_op", "pgd_step", "pgd_step_op", "random_start", "random_start_op"]
