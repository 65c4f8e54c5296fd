"""Classifier heads: the plain linear layer, and HE's cosine head (Pang et al. 2020).

The cosine head keeps its scale ``s`` (1/T in Tian et al.) as a buffer so a temperature
schedule can move it between epochs without touching the graph, and so checkpoints carry it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fastfair.registry import Registry

HEADS: Registry = Registry("classifier head")
"""name -> builder(feature_dim, num_classes, scale) returning the head module."""


class CosineHead(nn.Module):
    """s * cos(W_hat_k, z_hat): L2-normalised features and class weights, no bias (Pang et al. 2020, Eq. 4: FN + WN)."""

    def __init__(self, feature_dim: int, num_classes: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, feature_dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's init
        self.register_buffer("scale", torch.tensor(float(scale)))

    def cosine(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(F.normalize(z, dim=1), F.normalize(self.weight, dim=1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.scale * self.cosine(z)


HEADS.register("linear", "fully connected layer with bias (every paper's default)")(
    lambda feature_dim, num_classes, scale: nn.Linear(feature_dim, num_classes))
HEADS.register("cosine", "HE: s * cos(class weight, feature), both L2-normalised, no bias (Pang et al. 2020)")(
    CosineHead)
