"""PreActResNet-18 (He et al. 2016b, identity mappings); CFA's and robust_overfitting's model."""
from torch import nn
import torch.nn.functional as F

from fastfair.models.base import MODELS, pooled
from fastfair.models.resnet import stages


class PreActBlock(nn.Module):
    def __init__(self, cin, cout, stride, norm):
        super().__init__()
        self.bn1 = norm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn2 = norm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Conv2d(cin, cout, 1, stride, bias=False)

    def forward(self, x):
        out = F.relu(self.bn1(x))
        skip = self.shortcut(out) if self.shortcut is not None else x
        out = self.conv1(out)
        return self.conv2(F.relu(self.bn2(out))) + skip


@MODELS.register("preact-resnet18", "PreActResNet-18 (He et al. 2016b); CFA paper's model")
def preact_resnet18(in_channels, norm, width):
    w = width or 64
    widths = [w, 2 * w, 4 * w, 8 * w]
    body = nn.Sequential(
        nn.Conv2d(in_channels, w, 3, 1, 1, bias=False),
        *stages(PreActBlock, widths, [2, 2, 2, 2], norm, w),
        norm(widths[-1]), nn.ReLU(), pooled(),
    )
    return body, widths[-1]
