"""Batch-Instance Normalisation (Nam & Kim 2018), the ME paper's BN replacement (ME paper App. A.3)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastfair.models.base import NORMS


@NORMS.register("bin",
                "Batch-Instance Norm, rho BN(x) + (1 - rho) IN(x), learnt rho in [0, 1] (Nam & Kim 2018; ME paper A.3)")
class BatchInstanceNorm2d(nn.Module):
    """y = (rho x_BN + (1 - rho) x_IN) gamma + beta with a per-channel gate rho in [0, 1] (Nam & Kim 2018, Eq. 4-5).

    The paper clips rho into [0, 1] after each update; clamping it in the forward pass gives the
    same values without an optimiser hook. The BN half keeps running statistics for eval mode.
    """

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, eps=eps, momentum=momentum, affine=False)
        self.eps = eps
        self.rho = nn.Parameter(torch.full((channels,), 0.5))
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rho = self.rho.clamp(0.0, 1.0).view(1, -1, 1, 1)
        x_in = F.instance_norm(x, eps=self.eps)
        out = rho * self.bn(x) + (1 - rho) * x_in
        return out * self.weight.view(1, -1, 1, 1) + self.bias.view(1, -1, 1, 1)
