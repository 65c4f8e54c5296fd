"""VGG-16 and VGG-19 (Simonyan & Zisserman 2015, configurations D and E) for 32x32 inputs, as
kuangliu/pytorch-cifar: BatchNorm after every convolution, one linear layer on the 512 pooled features."""
from torch import nn

from fastfair.models.base import MODELS, pooled, scaled

POOL = "M"
# channels of each 3x3 convolution, M a 2x2 max-pool (Simonyan & Zisserman 2015, Table 1, columns D and E)
LAYERS = {
    16: [64, 64, POOL, 128, 128, POOL, 256, 256, 256, POOL, 512, 512, 512, POOL, 512, 512, 512, POOL],
    19: [64, 64, POOL, 128, 128, POOL, 256, 256, 256, 256, POOL, 512, 512, 512, 512, POOL, 512, 512, 512, 512, POOL],
}


def vgg(depth, in_channels, norm, width):
    """The convolutional part of VGG-``depth`` (conv 3x3 with bias, norm, ReLU; max-pools), pooled: 32x32 inputs
    end at 1x1 (kuangliu's flatten), larger ones are averaged; the paper's three FC layers become the one head."""
    layers, cin = [], in_channels
    for v in LAYERS[depth]:
        if v == POOL:
            layers.append(nn.MaxPool2d(2, 2))
        else:
            c = scaled(v, width, 64)
            layers += [nn.Conv2d(cin, c, 3, padding=1), norm(c), nn.ReLU()]
            cin = c
    return nn.Sequential(*layers, pooled()), cin


@MODELS.register("vgg16", "VGG-16 with BN, CIFAR variant (Simonyan & Zisserman 2015; kuangliu/pytorch-cifar); "
                          "32x32 inputs or larger")
def vgg16(in_channels, norm, width):
    return vgg(16, in_channels, norm, width)


@MODELS.register("vgg19", "VGG-19 with BN, CIFAR variant (Simonyan & Zisserman 2015; kuangliu/pytorch-cifar); "
                          "32x32 inputs or larger")
def vgg19(in_channels, norm, width):
    return vgg(19, in_channels, norm, width)
