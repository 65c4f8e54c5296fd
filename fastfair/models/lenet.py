"""LeNet-5 (LeCun et al. 1998), as kuangliu/pytorch-cifar trains it: ReLU and max-pooling in place of the
paper's scaled tanh and trainable sub-sampling, and no normalisation layer."""
import torch.nn.functional as F
from torch import nn

from fastfair.models.base import MODELS, scaled

FIELD = 32  # LeNet-5's input field; MNIST's 28x28 digits sit centred in it


class FieldConv(nn.Conv2d):
    """C1: a convolution over the 32x32 field; a smaller image (MNIST's 28x28) is zero-padded into its centre."""

    def forward(self, x):
        h, w = x.shape[-2:]  # static shapes: no host sync, one compiled graph per input size
        if h < FIELD or w < FIELD:
            top, left = (FIELD - h) // 2, (FIELD - w) // 2
            x = F.pad(x, (left, FIELD - w - left, top, FIELD - h - top))
        return super().forward(x)


@MODELS.register("lenet", "LeNet-5 (LeCun et al. 1998), ReLU/max-pool as kuangliu/pytorch-cifar; 28x28 padded to "
                          "32x32; no norm layer (model.norm does not apply)")
def lenet(in_channels, norm, width):
    """C1 (6 maps, 5x5), pool, C3 (16 maps, 5x5), pool, F5 120, F6 84 (LeCun et al. 1998, Sec. II.B, Fig. 2);
    ``width`` scales every layer from C1's 6 maps. ``norm`` is not used: LeNet has no normalisation layer."""
    c1 = width or 6
    c3, f5, f6 = scaled(16, width, 6), scaled(120, width, 6), scaled(84, width, 6)
    body = nn.Sequential(
        FieldConv(in_channels, c1, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c3, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c3 * 5 * 5, f5), nn.ReLU(), nn.Linear(f5, f6), nn.ReLU(),
    )
    return body, f6
