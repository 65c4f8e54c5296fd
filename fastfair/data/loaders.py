"""Batches for training and evaluation: the device-resident loader (default) and the loader registry.

:class:`DeviceLoader` keeps a whole split on the device as uint8, shuffles it there and applies
random crop with zero padding and horizontal flip per batch there (no workers, no host copies).
Other loaders (FFCV, :mod:`fastfair.data.ffcv`) register in :data:`LOADERS`.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from fastfair.data.sampling import ClassIndex, draw
from fastfair.registry import Registry


def _reflect(i: torch.Tensor, n: int) -> torch.Tensor:
    """Indices of a row (column) of a padded image, -p..n-1+p, mirrored into 0..n-1 without repeating the edge."""
    i = i.abs()
    return (n - 1) - ((n - 1) - i).abs()


def random_crop_flip(x: torch.Tensor, padding: int, flip: bool, gen: torch.Generator,
                     mode: str = "zeros") -> torch.Tensor:
    """Per-image random crop of a padded batch (``mode`` zeros, or reflect as torchvision's
    ``padding_mode='reflect'``) and random horizontal flip (p = 0.5), on x's device."""
    b, _, h, w = x.shape
    if padding:
        dy = torch.randint(0, 2 * padding + 1, (b,), device=x.device, generator=gen)
        dx = torch.randint(0, 2 * padding + 1, (b,), device=x.device, generator=gen)
        rows = (dy[:, None] + torch.arange(h, device=x.device))[:, :, None]
        cols = (dx[:, None] + torch.arange(w, device=x.device))[:, None, :]
        if mode == "reflect":  # the same draws, read from the mirrored image instead of the zero border
            padded, rows, cols = x, _reflect(rows - padding, h), _reflect(cols - padding, w)
        else:
            padded = F.pad(x, (padding,) * 4)
        x = padded[torch.arange(b, device=x.device)[:, None, None], :, rows, cols].permute(0, 3, 1, 2)
    if flip:
        mask = torch.rand(b, device=x.device, generator=gen) < 0.5
        x = torch.where(mask[:, None, None, None], x.flip(3), x)
    return x


class DeviceLoader:
    """A whole split as uint8 on ``device``; yields ``(x in [0,1] float32, y)`` batches.

    Training loaders shuffle and augment on the device with a generator reseeded from
    ``(seed, epoch)`` by :meth:`set_epoch`, so a resumed run sees the same batches. After
    :meth:`draw_classes` an epoch is drawn by class instead of shuffled (:mod:`fastfair.data.sampling`).
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, device, train: bool,
                 crop_padding: int = 0, flip: bool = False, seed: int = 0, channels_last: bool = False,
                 crop_mode: str = "zeros"):
        self.x = x.to(device)
        self.y = y.to(device)
        self.batch_size = batch_size
        self.train = train
        self.crop_padding, self.flip, self.crop_mode = crop_padding, flip, crop_mode
        self.seed = seed
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.gen = torch.Generator(device=self.x.device)
        self.class_p: torch.Tensor | None = None  # resampling: class probabilities, read at each epoch's start
        self.classes: ClassIndex | None = None
        self.set_epoch(0)

    def class_counts(self, num_classes: int) -> torch.Tensor:
        """Training images per class, (C,) on the loader's device."""
        return torch.bincount(self.y, minlength=num_classes)

    def draw_classes(self, p: torch.Tensor) -> None:
        """Draw each epoch's images by class with probabilities ``p`` (C,), with replacement, instead of a
        permutation. ``p`` is held, not copied: its owner may change it in place between epochs."""
        self.class_p, self.classes = p, ClassIndex(self.y, len(p))

    def set_epoch(self, epoch: int) -> None:
        self.gen.manual_seed(self.seed * 100_003 + epoch)

    def __len__(self) -> int:
        n = len(self.y)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self):
        n = len(self.y)
        order = None
        if self.train:
            order = (torch.randperm(n, device=self.x.device, generator=self.gen) if self.class_p is None
                     else draw(self.class_p, self.classes, n, self.gen))
        for i in range(len(self)):
            sl = slice(i * self.batch_size, (i + 1) * self.batch_size)
            idx = order[sl] if order is not None else sl
            xb, yb = self.x[idx], self.y[idx]
            if self.train:
                xb = random_crop_flip(xb, self.crop_padding, self.flip, self.gen, self.crop_mode)
            xb = xb.float().div_(255).contiguous(memory_format=self.memory_format)
            yield xb, yb


LOADERS: Registry[Callable] = Registry("loader")


@LOADERS.register("device", "the whole split on the device; shuffle, crop and flip there (default)")
def _device_loader(split: str, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, device, train: bool,
                   crop_padding: int = 0, flip: bool = False, seed: int = 0, channels_last: bool = False,
                   crop_mode: str = "zeros", **_):
    return DeviceLoader(x, y, batch_size, device=device, train=train, crop_padding=crop_padding, flip=flip,
                        seed=seed, channels_last=channels_last, crop_mode=crop_mode)

