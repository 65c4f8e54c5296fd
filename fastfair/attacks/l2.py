"""L2 normalised-gradient descent with projection: the optimiser that builds the data sets of Ilyas et al. 2019.

Each step moves every image by ``step_size`` along its own normalised gradient, then projects back
into the L2 ball of radius ``eps`` around its ``center`` and into the image box [0, 1] (Madry et al.
2018, Sec. 2, for the L2 threat model; Ilyas et al. 2019, App. C, who run it through MadryLab's
``robustness`` library, ``constraint='2'``). As in that library (``use_best``), each image keeps the
iterate of lowest loss, the last one included, so more steps never return a worse point. Every choice
is made per row with ``torch.where``: no value is read back to the host inside the loop.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from fastfair.attacks.pgd import attack_mode

_TINY = 1e-10  # guards the division of a zero gradient (the robustness library's constant)


def _row_norm(t: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each row (image) of ``t``, shaped to broadcast against it."""
    return t.flatten(1).norm(dim=1).view((-1,) + (1,) * (t.dim() - 1))


def l2_step(x: torch.Tensor, grad: torch.Tensor, step_size: float) -> torch.Tensor:
    """x - a g / ||g||_2 per image: a normalised-gradient descent step (Madry et al. 2018, L2 PGD step)."""
    return x - step_size * grad / (_row_norm(grad) + _TINY)


def l2_project(x: torch.Tensor, center: torch.Tensor, eps: float) -> torch.Tensor:
    """x projected onto {x' : ||x' - center||_2 <= eps} and then clipped to [0, 1] (Madry et al. 2018, L2 PGD);
    ``eps`` inf keeps only the clip."""
    if math.isinf(eps):
        return x.clamp(0, 1)
    delta = x - center
    scale = torch.clamp(eps / (_row_norm(delta) + _TINY), max=1.0)
    return (center + delta * scale).clamp(0, 1)


def l2_descend(model: torch.nn.Module, loss_rows: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor,
               center: torch.Tensor, *, eps: float, step_size: float, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``steps`` L2 normalised-gradient steps from ``start`` minimising ``loss_rows`` (one loss per image), each
    projected into the ``eps`` ball around ``center`` and [0, 1] (Ilyas et al. 2019, App. C); returns (each image's
    iterate of lowest loss, that loss). ``model`` is put in eval mode with frozen weights for the descent."""
    with attack_mode(model, "eval"), torch.enable_grad():
        x = l2_project(start.detach(), center, eps)
        best, best_loss = x, torch.full((len(x),), math.inf, device=x.device)
        for _ in range(steps):
            x_in = x.detach().requires_grad_(True)
            rows = loss_rows(x_in)
            (grad,) = torch.autograd.grad(rows.sum(), x_in)
            better = rows.detach() < best_loss
            best = torch.where(better.view((-1,) + (1,) * (x.dim() - 1)), x, best)
            best_loss = torch.where(better, rows.detach(), best_loss)
            x = l2_project(l2_step(x, grad, step_size), center, eps)
        with torch.no_grad():
            rows = loss_rows(x)
        better = rows < best_loss
        return torch.where(better.view((-1,) + (1,) * (x.dim() - 1)), x, best), torch.where(better, rows, best_loss)
