"""The per-class PGD step and random start in PyTorch: the reference ``fastfair.kernels`` fuses.

``eps_c`` and ``alpha_c`` are per-class ``(C,)`` tensors gathered by label, so per-class
budgets (CFA's CCM, FRL's remargin) change values, never shapes.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.ops.losses import widened

INITS = ("uniform", "uniform_unclipped", "normal", "normal_clipped", "none")


def pgd_step(x_adv, grad, x, y, eps_c, alpha_c):
    """x' <- clip_[0,1](clip_[x-eps_y, x+eps_y](x' + alpha_y sign(g))) (Madry et al. 2018, Eq. 2)."""
    shape = (-1,) + (1,) * (x.dim() - 1)
    eps = widened(eps_c[y].view(shape))
    alpha = widened(alpha_c[y].view(shape))
    step = widened(x_adv) + alpha * widened(grad).sign()
    x_wide = widened(x)
    out = torch.minimum(torch.maximum(step, x_wide - eps), x_wide + eps).clamp(0.0, 1.0)
    return out.to(x_adv.dtype)


def random_start(x, y, eps_c, kind: str):
    """PGD init: x + U(-eps_y, eps_y) clipped to [0,1] (Madry), the same unclipped (``uniform_unclipped``:
    the PGD-20 evaluation of the TRADES and MART code, whose first gradient is taken there), or
    x + 0.001 N(0, I) (TRADES code), the same clipped to [0,1] (``normal_clipped``: BAT code,
    ``train_mode/stop_to_*.py`` line 21-22)."""
    if kind in ("uniform", "uniform_unclipped"):
        eps = eps_c[y].view((-1,) + (1,) * (x.dim() - 1)).to(x.dtype)
        start = x + (torch.rand_like(x) * 2 - 1) * eps
        return start.clamp(0.0, 1.0) if kind == "uniform" else start
    if kind == "normal":
        return x + 0.001 * torch.randn_like(x)
    if kind == "normal_clipped":
        return (x + 0.001 * torch.randn_like(x)).clamp(0.0, 1.0)
    if kind == "none":
        return x.clone()
    raise UserError(f"unknown PGD init {kind!r}; known: {', '.join(INITS)}")
