"""The classifier wrapper shared by all models, and the model and norm-layer registries."""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from fastfair.registry import Registry
from fastfair.models.heads import HEADS

MODELS: Registry[Callable[..., tuple[nn.Module, int]]] = Registry("model")
"""name -> builder(in_channels, norm, width) returning (body producing (N, D) features, D)."""

NORMS: Registry[Callable[[int], nn.Module]] = Registry("norm layer")
NORMS.register("bn", "BatchNorm2d (Ioffe & Szegedy 2015)")(nn.BatchNorm2d)
# No normalisation: the output does not depend on the rest of the batch, so a DDP run matches a
# one-process run exactly (tests/test_distributed.py); SyncBatchNorm needs CUDA.
NORMS.register("none", "no normalisation layer (identity)")(lambda channels: nn.Identity())


class Classifier(nn.Module):
    """x in [0, 1] -> normalise -> body -> penultimate features -> linear head -> logits."""

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int, mean, std,
                 head: str = "linear", head_scale: float = 15.0):
        super().__init__()
        c = len(mean)
        self.register_buffer("mean", torch.tensor(mean, dtype=torch.float32).view(1, c, 1, 1))
        self.register_buffer("std", torch.tensor(std, dtype=torch.float32).view(1, c, 1, 1))
        self.body = body
        self.feature_dim = feature_dim
        self.head = HEADS.get(head)(feature_dim, num_classes, head_scale)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x - self.mean) / self.std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.forward_features(x))


def build(name: str, *, num_classes: int, in_channels: int, mean, std, norm: str = "bn",
          width: int = 0, head: str = "linear", head_scale: float = 15.0, feature_dim: int = 0) -> Classifier:
    """Build a registered model; ``width`` 0 keeps the paper's width; ``head`` from :data:`HEADS`; ``feature_dim``
    N > 0 adds a linear layer from the body's features to N (ME paper App. A.1's 512x2 layer), whose output
    ``forward_features`` returns."""
    body, dim = MODELS.get(name)(in_channels=in_channels, norm=NORMS.get(norm), width=width)
    if feature_dim:
        body, dim = nn.Sequential(body, nn.Linear(dim, feature_dim)), feature_dim
    return Classifier(body, dim, num_classes, mean, std, head=head, head_scale=head_scale)


def uses_norm(name: str) -> bool:
    """Whether model ``name`` has a normalisation layer for ``model.norm`` to choose (LeNet and small-cnn have none);
    built on the meta device, so nothing is allocated."""
    calls = []

    def norm(channels: int) -> nn.Module:
        calls.append(channels)
        return nn.Identity()

    with torch.device("meta"):
        MODELS.get(name)(in_channels=3, norm=norm, width=0)
    return bool(calls)


def pooled() -> nn.Sequential:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten())


def scaled(channels: int, width: int, base: int) -> int:
    """``channels`` of a paper's layer when the model's first convolution has ``width`` channels instead of
    ``base`` (``width`` 0: the paper's); every layer keeps at least one channel."""
    return max(1, channels * width // base) if width else channels
