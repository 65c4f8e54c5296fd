"""ResNet-18 and ResNet-50 for 32x32 inputs: 3x3 stem, no max-pool (He et al. 2016; CIFAR variant as in the ME paper
and kuangliu/pytorch-cifar); ResNet-50 for ImageNet (torchvision's)."""
from torch import nn
import torch.nn.functional as F

from fastfair.models.base import MODELS, pooled


def shortcut(cin: int, cout: int, stride: int, norm) -> nn.Sequential:
    """The identity, or a strided 1x1 projection + norm where the shape changes (He et al. 2016, option B)."""
    if stride == 1 and cin == cout:
        return nn.Sequential()
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.shortcut = shortcut(cin, cout, stride, norm)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class Bottleneck(nn.Module):
    """1x1 reduce, 3x3 (carrying the stride), 1x1 expand to ``cout`` = 4 x the inner width (He et al. 2016, Fig. 5)."""

    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        planes = cout // 4
        self.conv1 = nn.Conv2d(cin, planes, 1, bias=False)
        self.bn1 = norm(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = norm(planes)
        self.conv3 = nn.Conv2d(planes, cout, 1, bias=False)
        self.bn3 = norm(cout)
        self.shortcut = shortcut(cin, cout, stride, norm)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        return F.relu(self.bn3(self.conv3(out)) + self.shortcut(x))


def stages(block, widths, blocks, norm, cin):
    layers = []
    for i, (w, n) in enumerate(zip(widths, blocks)):
        for j in range(n):
            layers.append(block(cin, w, 2 if (j == 0 and i > 0) else 1, norm))
            cin = w
    return layers


@MODELS.register("resnet18", "ResNet-18, CIFAR variant (He et al. 2016); ME paper's model")
def resnet18(in_channels, norm, width):
    w = width or 64
    widths = [w, 2 * w, 4 * w, 8 * w]
    body = nn.Sequential(
        nn.Conv2d(in_channels, w, 3, 1, 1, bias=False), norm(w), nn.ReLU(),
        *stages(BasicBlock, widths, [2, 2, 2, 2], norm, w), pooled(),
    )
    return body, widths[-1]


@MODELS.register("resnet50-cifar", "ResNet-50, CIFAR variant (He et al. 2016): 3x3 stem, no max-pool, as "
                                   "kuangliu/pytorch-cifar; resnet50 is the ImageNet one")
def resnet50_cifar(in_channels, norm, width):
    """Bottleneck stages [3, 4, 6, 3] of inner width w, 2w, 4w, 8w and output 4x that (He et al. 2016, Table 1)
    on resnet18's 3x3 stem of w = ``width`` (64) channels."""
    w = width or 64
    widths = [4 * w, 8 * w, 16 * w, 32 * w]
    body = nn.Sequential(
        nn.Conv2d(in_channels, w, 3, 1, 1, bias=False), norm(w), nn.ReLU(),
        *stages(Bottleneck, widths, [3, 4, 6, 3], norm, w), pooled(),
    )
    return body, widths[-1]


@MODELS.register("resnet50", "ResNet-50, ImageNet variant (He et al. 2016); torchvision's, as Wong et al. 2020 train")
def resnet50(in_channels, norm, width):
    """torchvision's ResNet-50 (7x7 stem, max-pool, bottlenecks [3, 4, 6, 3]) without its fc layer; ``width`` is the
    bottleneck's width_per_group (64: He et al.'s; 128: Wide ResNet-50-2)."""
    from torchvision.models import resnet50 as tv_resnet50  # here: torchvision.models takes seconds to import

    net = tv_resnet50(norm_layer=norm, width_per_group=width or 64)
    if in_channels != 3:
        net.conv1 = nn.Conv2d(in_channels, 64, 7, 2, 3, bias=False)
    dim = net.fc.in_features
    net.fc = nn.Identity()
    return net, dim
