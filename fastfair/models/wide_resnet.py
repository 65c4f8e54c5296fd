"""WideResNet-depth-k (Zagoruyko & Komodakis 2016), pre-activation blocks as in the TRADES code."""
from torch import nn

from fastfair.models.base import MODELS, pooled
from fastfair.models.preact_resnet import PreActBlock  # WRN's block is the same pre-activation basic block


def wide_resnet(depth, widen, in_channels, norm, width):
    n = (depth - 4) // 6
    base = width or 16
    widths = [base * widen, 2 * base * widen, 4 * base * widen]
    layers, cin = [nn.Conv2d(in_channels, base, 3, 1, 1, bias=False)], base
    for i, w in enumerate(widths):
        for j in range(n):
            layers.append(PreActBlock(cin, w, 2 if (j == 0 and i > 0) else 1, norm))
            cin = w
    layers += [norm(cin), nn.ReLU(), pooled()]
    return nn.Sequential(*layers), cin


@MODELS.register("wrn-28-10", "WideResNet-28-10 (Zagoruyko & Komodakis 2016)")
def wrn28_10(in_channels, norm, width):
    return wide_resnet(28, 10, in_channels, norm, width)


@MODELS.register("wrn-34-10", "WideResNet-34-10 (Zagoruyko & Komodakis 2016); TRADES/MART/FAT model")
def wrn34_10(in_channels, norm, width):
    return wide_resnet(34, 10, in_channels, norm, width)


@MODELS.register("wrn-32-10", "WideResNet-32-10 as Tian et al. and Madry et al. name it: wrn-34-10's network")
def wrn32_10(in_channels, norm, width):
    """Madry et al.'s CIFAR-10 WideResNet (5 blocks a stage, width 10), named by its weighted layers on the main
    path: 1 + 3 x 5 x 2 convolutions and the linear head = 32. Counted as 6n + 4 (Zagoruyko & Komodakis) with
    n = 5 it is WRN-34-10, the same network TRADES and MART name so; depth 32 fits no 6n + 4."""
    return wide_resnet(34, 10, in_channels, norm, width)
