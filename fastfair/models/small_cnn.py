"""Small CNNs: TRADES's 4-conv MNIST model, and a tiny same-padding CNN for 8x8 demo data and tests."""
from torch import nn

from fastfair.models.base import MODELS


@MODELS.register("small-cnn", "4-conv + 3-FC CNN for 28x28 MNIST (TRADES code; Tian et al. MNIST model)")
def small_cnn(in_channels, norm, width):
    w = width or 32
    body = nn.Sequential(
        nn.Conv2d(in_channels, w, 3), nn.ReLU(), nn.Conv2d(w, w, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(w, 2 * w, 3), nn.ReLU(), nn.Conv2d(2 * w, 2 * w, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(2 * w * 4 * 4, 200),  # 28x28 input -> 4x4 maps
        nn.ReLU(), nn.Dropout(0.5), nn.Linear(200, 200), nn.ReLU(),
    )
    return body, 200


@MODELS.register("tiny-cnn", "2-conv same-padding CNN with BN (fastfair's offline demo and tests; any input size)")
def tiny_cnn(in_channels, norm, width):
    w = width or 32
    body = nn.Sequential(
        nn.Conv2d(in_channels, w, 3, padding=1, bias=False), norm(w), nn.ReLU(),
        nn.Conv2d(w, 2 * w, 3, stride=2, padding=1, bias=False), norm(2 * w), nn.ReLU(),
        nn.AdaptiveAvgPool2d(2), nn.Flatten(),
    )
    return body, 8 * w
