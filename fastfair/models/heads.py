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


WEIGHT_NORMS = ("graph", "data")


class CosineHead(nn.Module):
    """s * cos(W_hat_k, z_hat): L2-normalised features and class weights, no bias (Pang et al. 2020, Eq. 4: FN + WN).

    ``weight_norm`` says how the class weights are normalised (HE's ``he.weight_norm`` sets it): ``graph``
    divides by their norms inside the forward, so their gradient goes through the normalisation; ``data``
    uses the same values but passes the gradient to the weights unchanged, and the HE option writes the
    normalised rows back into ``weight`` (:meth:`renormalize_`) after each optimiser step, as Pang et al.'s
    code does by overwriting ``fc.weight.data`` in its forward.
    """

    def __init__(self, feature_dim: int, num_classes: int, scale: float):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_classes, feature_dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's init
        self.register_buffer("scale", torch.tensor(float(scale)))
        self.weight_norm = "graph"

    def unit_weight(self) -> torch.Tensor:
        w = self.weight
        if self.weight_norm == "data":  # the value of W / norm(W), the gradient of W itself
            return w + (F.normalize(w, dim=1) - w).detach()
        return F.normalize(w, dim=1)

    @torch.no_grad()
    def renormalize_(self) -> None:
        """Write the row-normalised class weights into ``weight`` (outside any graph)."""
        self.weight.copy_(F.normalize(self.weight, dim=1))

    def cosine(self, z: torch.Tensor) -> torch.Tensor:
        return F.linear(F.normalize(z, dim=1), self.unit_weight())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.scale * self.cosine(z)


HEADS.register("linear", "fully connected layer with bias (every paper's default)")(
    lambda feature_dim, num_classes, scale: nn.Linear(feature_dim, num_classes))
HEADS.register("linear-nobias", "fully connected layer without bias: classes told apart by the angle of the "
               "features alone (ME paper App. A.1, with model.feature_dim = 2)")(
    lambda feature_dim, num_classes, scale: nn.Linear(feature_dim, num_classes, bias=False))
HEADS.register("cosine", "HE: s * cos(class weight, feature), both L2-normalised, no bias (Pang et al. 2020)")(
    CosineHead)
