"""ResNet-18 for 32x32 inputs: 3x3 stem, no max-pool (He et al. 2016; CIFAR variant as in the ME paper)."""
from torch import nn
import torch.nn.functional as F

from fastfair.models.base import MODELS, pooled


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


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
