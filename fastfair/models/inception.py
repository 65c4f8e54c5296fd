"""Inception-v3 (Szegedy et al. 2016) for 32x32 inputs, as weiaicunzai/pytorch-cifar100: a stride-1 stem
without max-pools (32 -> 30), then the paper's modules 5b-7c at 30x30, 14x14 and 6x6; no auxiliary classifier."""
from functools import partial

import torch
from torch import nn

from fastfair.models.base import MODELS, pooled, scaled

DROPOUT = 0.5  # before the classifier, as the reference (and torchvision's Inception-v3)


class BasicConv2d(nn.Module):
    """Conv (no bias) - norm - ReLU, the unit every Inception-v3 module is made of."""

    def __init__(self, cin, cout, norm, **conv):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **conv)
        self.bn = norm(cout)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


class InceptionA(nn.Module):
    """35x35-grid module (Szegedy et al. 2016, Fig. 5): 1x1; 1x1-5x5; 1x1-3x3-3x3; avg-pool-3x3 (the reference's
    pool branch is a 3x3 convolution, torchvision's a 1x1)."""

    def __init__(self, cin, pool_features, norm, s):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, s(64), norm, kernel_size=1)
        self.branch5x5 = nn.Sequential(BasicConv2d(cin, s(48), norm, kernel_size=1),
                                       BasicConv2d(s(48), s(64), norm, kernel_size=5, padding=2))
        self.branch3x3 = nn.Sequential(BasicConv2d(cin, s(64), norm, kernel_size=1),
                                       BasicConv2d(s(64), s(96), norm, kernel_size=3, padding=1),
                                       BasicConv2d(s(96), s(96), norm, kernel_size=3, padding=1))
        self.branchpool = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1),
                                        BasicConv2d(cin, s(pool_features), norm, kernel_size=3, padding=1))
        self.out_channels = s(64) + s(64) + s(96) + s(pool_features)

    def forward(self, x):
        return torch.cat([self.branch1x1(x), self.branch5x5(x), self.branch3x3(x), self.branchpool(x)], 1)


class InceptionB(nn.Module):
    """Grid reduction (Szegedy et al. 2016, Fig. 10): 3x3 stride 2; 1x1-3x3-3x3 stride 2; 3x3 max-pool stride 2."""

    def __init__(self, cin, norm, s):
        super().__init__()
        self.branch3x3 = BasicConv2d(cin, s(384), norm, kernel_size=3, stride=2)
        self.branch3x3stack = nn.Sequential(BasicConv2d(cin, s(64), norm, kernel_size=1),
                                            BasicConv2d(s(64), s(96), norm, kernel_size=3, padding=1),
                                            BasicConv2d(s(96), s(96), norm, kernel_size=3, stride=2))
        self.branchpool = nn.MaxPool2d(3, stride=2)
        self.out_channels = s(384) + s(96) + cin

    def forward(self, x):
        return torch.cat([self.branch3x3(x), self.branch3x3stack(x), self.branchpool(x)], 1)


class InceptionC(nn.Module):
    """17x17-grid module with factorised 7x7s (Szegedy et al. 2016, Fig. 6, n = 7): 1x1; 1x1-7x1-1x7;
    1x1-7x1-1x7-7x1-1x7; avg-pool-1x1."""

    def __init__(self, cin, c7, norm, s):
        super().__init__()
        c7 = s(c7)
        self.branch1x1 = BasicConv2d(cin, s(192), norm, kernel_size=1)
        self.branch7x7 = nn.Sequential(BasicConv2d(cin, c7, norm, kernel_size=1),
                                       BasicConv2d(c7, c7, norm, kernel_size=(7, 1), padding=(3, 0)),
                                       BasicConv2d(c7, s(192), norm, kernel_size=(1, 7), padding=(0, 3)))
        self.branch7x7stack = nn.Sequential(BasicConv2d(cin, c7, norm, kernel_size=1),
                                            BasicConv2d(c7, c7, norm, kernel_size=(7, 1), padding=(3, 0)),
                                            BasicConv2d(c7, c7, norm, kernel_size=(1, 7), padding=(0, 3)),
                                            BasicConv2d(c7, c7, norm, kernel_size=(7, 1), padding=(3, 0)),
                                            BasicConv2d(c7, s(192), norm, kernel_size=(1, 7), padding=(0, 3)))
        self.branch_pool = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1),
                                         BasicConv2d(cin, s(192), norm, kernel_size=1))
        self.out_channels = 4 * s(192)

    def forward(self, x):
        return torch.cat([self.branch1x1(x), self.branch7x7(x), self.branch7x7stack(x), self.branch_pool(x)], 1)


class InceptionD(nn.Module):
    """Grid reduction to 8x8: 1x1-3x3 stride 2; 1x1-1x7-7x1-3x3 stride 2; 3x3 avg-pool stride 2 (the reference's;
    torchvision's pools by max)."""

    def __init__(self, cin, norm, s):
        super().__init__()
        self.branch3x3 = nn.Sequential(BasicConv2d(cin, s(192), norm, kernel_size=1),
                                       BasicConv2d(s(192), s(320), norm, kernel_size=3, stride=2))
        self.branch7x7 = nn.Sequential(BasicConv2d(cin, s(192), norm, kernel_size=1),
                                       BasicConv2d(s(192), s(192), norm, kernel_size=(1, 7), padding=(0, 3)),
                                       BasicConv2d(s(192), s(192), norm, kernel_size=(7, 1), padding=(3, 0)),
                                       BasicConv2d(s(192), s(192), norm, kernel_size=3, stride=2))
        self.branchpool = nn.AvgPool2d(3, stride=2)
        self.out_channels = s(320) + s(192) + cin

    def forward(self, x):
        return torch.cat([self.branch3x3(x), self.branch7x7(x), self.branchpool(x)], 1)


class InceptionE(nn.Module):
    """8x8-grid module with expanded filter banks (Szegedy et al. 2016, Fig. 7): 1x1; 1x1-(1x3, 3x1);
    1x1-3x3-(1x3, 3x1); avg-pool-1x1."""

    def __init__(self, cin, norm, s):
        super().__init__()
        self.branch1x1 = BasicConv2d(cin, s(320), norm, kernel_size=1)
        self.branch3x3_1 = BasicConv2d(cin, s(384), norm, kernel_size=1)
        self.branch3x3_2a = BasicConv2d(s(384), s(384), norm, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3_2b = BasicConv2d(s(384), s(384), norm, kernel_size=(3, 1), padding=(1, 0))
        self.branch3x3stack_1 = BasicConv2d(cin, s(448), norm, kernel_size=1)
        self.branch3x3stack_2 = BasicConv2d(s(448), s(384), norm, kernel_size=3, padding=1)
        self.branch3x3stack_3a = BasicConv2d(s(384), s(384), norm, kernel_size=(1, 3), padding=(0, 1))
        self.branch3x3stack_3b = BasicConv2d(s(384), s(384), norm, kernel_size=(3, 1), padding=(1, 0))
        self.branch_pool = nn.Sequential(nn.AvgPool2d(3, stride=1, padding=1),
                                         BasicConv2d(cin, s(192), norm, kernel_size=1))
        self.out_channels = s(320) + 4 * s(384) + s(192)

    def forward(self, x):
        b3 = self.branch3x3_1(x)
        stack = self.branch3x3stack_2(self.branch3x3stack_1(x))
        return torch.cat([self.branch1x1(x), self.branch3x3_2a(b3), self.branch3x3_2b(b3),
                          self.branch3x3stack_3a(stack), self.branch3x3stack_3b(stack), self.branch_pool(x)], 1)


# the stem: (output channels, kernel, padding), each conv - norm - ReLU at stride 1 (the reference's 32x32 stem)
STEM = [(32, 3, 1), (32, 3, 1), (64, 3, 1), (80, 1, 0), (192, 3, 0)]
# Mixed_5b-5d, 6a, 6b-6e, 7a, 7b-7c: the module and its argument (pool features of A, 7x7 channels of C)
MODULES = [(InceptionA, 32), (InceptionA, 64), (InceptionA, 64), (InceptionB,), (InceptionC, 128), (InceptionC, 160),
           (InceptionC, 160), (InceptionC, 192), (InceptionD,), (InceptionE,), (InceptionE,)]


@MODELS.register("inception-v3", "Inception-v3, CIFAR variant (Szegedy et al. 2016; weiaicunzai/pytorch-cifar100)")
def inception_v3(in_channels, norm, width):
    """Stem of ``width`` (32) channels first, modules 5b-7c, every layer scaled alike; global average pooling to
    the 2048 features and the reference's dropout before the head."""
    s = partial(scaled, width=width, base=32)
    layers, c = [], in_channels
    for cout, kernel, padding in STEM:
        layers += [nn.Conv2d(c, s(cout), kernel, padding=padding, bias=False), norm(s(cout)), nn.ReLU()]
        c = s(cout)
    for module, *args in MODULES:
        layers.append(module(c, *args, norm=norm, s=s))
        c = layers[-1].out_channels
    return nn.Sequential(*layers, pooled(), nn.Dropout(DROPOUT)), c
