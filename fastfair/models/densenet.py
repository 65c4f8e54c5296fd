"""DenseNet-121 and DenseNet-169 (Huang et al. 2017, DenseNet-BC) for 32x32 inputs, as kuangliu/pytorch-cifar:
a 3x3 stem of 2k channels and no max-pool, then the ImageNet models' four dense blocks."""
import torch
import torch.nn.functional as F
from torch import nn

from fastfair.models.base import MODELS, pooled

REDUCTION = 0.5  # the transitions' compression theta (Huang et al. 2017, Sec. 3: DenseNet-BC)


class DenseLayer(nn.Module):
    """BN-ReLU-Conv(1x1, 4k)-BN-ReLU-Conv(3x3, k), its k new maps concatenated before its input (Huang et al. 2017,
    Eq. 2 and 'Bottleneck layers'; the order of kuangliu's torch.cat([out, x]))."""

    def __init__(self, cin, growth, norm):
        super().__init__()
        self.bn1 = norm(cin)
        self.conv1 = nn.Conv2d(cin, 4 * growth, 1, bias=False)
        self.bn2 = norm(4 * growth)
        self.conv2 = nn.Conv2d(4 * growth, growth, 3, padding=1, bias=False)

    def forward(self, x):
        out = self.conv1(F.relu(self.bn1(x)))
        out = self.conv2(F.relu(self.bn2(out)))
        return torch.cat([out, x], 1)


class Transition(nn.Module):
    """BN-ReLU-Conv(1x1)-AvgPool(2x2) between dense blocks (Huang et al. 2017, Sec. 3 'Pooling layers')."""

    def __init__(self, cin, cout, norm):
        super().__init__()
        self.bn = norm(cin)
        self.conv = nn.Conv2d(cin, cout, 1, bias=False)

    def forward(self, x):
        return F.avg_pool2d(self.conv(F.relu(self.bn(x))), 2)


def densenet(blocks, in_channels, norm, width):
    """Stem conv of ``width`` = 2k channels (k = 32 the growth rate), dense blocks of ``blocks`` layers with
    transitions halving the channels, then BN-ReLU and global average pooling (Huang et al. 2017, Table 1)."""
    stem = width or 64
    growth = max(1, stem // 2)
    layers, c = [nn.Conv2d(in_channels, stem, 3, padding=1, bias=False)], stem
    for i, n in enumerate(blocks):
        layers.append(nn.Sequential(*(DenseLayer(c + j * growth, growth, norm) for j in range(n))))
        c += n * growth
        if i < len(blocks) - 1:
            layers.append(Transition(c, int(c * REDUCTION), norm))
            c = int(c * REDUCTION)
    return nn.Sequential(*layers, norm(c), nn.ReLU(), pooled()), c


@MODELS.register("densenet121", "DenseNet-121 (BC, k=32), CIFAR variant (Huang et al. 2017; kuangliu/pytorch-cifar)")
def densenet121(in_channels, norm, width):
    return densenet([6, 12, 24, 16], in_channels, norm, width)


@MODELS.register("densenet169", "DenseNet-169 (BC, k=32), CIFAR variant (Huang et al. 2017; kuangliu/pytorch-cifar)")
def densenet169(in_channels, norm, width):
    return densenet([6, 12, 32, 32], in_channels, norm, width)
