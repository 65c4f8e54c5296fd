"""GoogLeNet (Szegedy et al. 2015, Inception-v1) for 32x32 inputs, as kuangliu/pytorch-cifar: a 3x3 stem of 192
channels in place of the ImageNet stem, BN after every convolution, two 3x3 convolutions in place of each 5x5,
no auxiliary classifiers and no dropout."""
import torch
from torch import nn

from fastfair.models.base import MODELS, pooled, scaled

# (1x1, 3x3 reduce, 3x3, 5x5 reduce, 5x5, pool proj) of inception (3a) to (5b) (Szegedy et al. 2015, Table 1);
# None: a 3x3 max-pool of stride 2 between the stages
BLOCKS = [(64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64), None,
          (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
          (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128), None,
          (256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)]


def conv_norm_relu(cin, cout, kernel, norm):
    return [nn.Conv2d(cin, cout, kernel, padding=kernel // 2), norm(cout), nn.ReLU()]


class Inception(nn.Module):
    """Four branches concatenated: 1x1; 1x1-3x3; 1x1-3x3-3x3 (the 5x5 as two 3x3, kuangliu's); 3x3 max-pool-1x1
    (Szegedy et al. 2015, Fig. 2b)."""

    def __init__(self, cin, n1, r3, n3, r5, n5, pool, norm):
        super().__init__()
        self.b1 = nn.Sequential(*conv_norm_relu(cin, n1, 1, norm))
        self.b2 = nn.Sequential(*conv_norm_relu(cin, r3, 1, norm), *conv_norm_relu(r3, n3, 3, norm))
        self.b3 = nn.Sequential(*conv_norm_relu(cin, r5, 1, norm), *conv_norm_relu(r5, n5, 3, norm),
                                *conv_norm_relu(n5, n5, 3, norm))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), *conv_norm_relu(cin, pool, 1, norm))
        self.out_channels = n1 + n3 + n5 + pool

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), self.b4(x)], 1)


@MODELS.register("googlenet", "GoogLeNet / Inception-v1, CIFAR variant (Szegedy et al. 2015; kuangliu/pytorch-cifar)")
def googlenet(in_channels, norm, width):
    """Stem conv 3x3 of ``width`` (192) channels, inception (3a)-(5b) with every branch scaled alike, global
    average pooling to the 1024 features."""
    stem = width or 192
    layers, c = conv_norm_relu(in_channels, stem, 3, norm), stem
    for spec in BLOCKS:
        if spec is None:
            layers.append(nn.MaxPool2d(3, stride=2, padding=1))
        else:
            block = Inception(c, *(scaled(n, width, 192) for n in spec), norm)
            layers.append(block)
            c = block.out_channels
    return nn.Sequential(*layers, pooled()), c
