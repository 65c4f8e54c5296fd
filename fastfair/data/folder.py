"""ImageNet from its folder of JPEGs, streamed: a data set too large to hold in memory as uint8.

The :class:`FolderBundle` holds file *indices* where other bundles hold images (int64 ``x_train`` /
``x_test``, indices into one sorted file list), so the validation split, quick runs, class subsets and
per-rank shards index it as they index images. The ``folder`` loader reads the files those indices
name, on CPU workers, and yields the batches every loader yields: ``(x float32 in [0, 1] on the device,
y int64)``. Augmentation follows Wong et al.'s ImageNet code (fast_adversarial/ImageNet/main_fast.py:
RandomResizedCrop and RandomHorizontalFlip for training); test images are resized and centre-cropped
as in torchvision's ImageNet reference. Every random draw comes from ``(seed, epoch)``, so a run sees
the same batches whatever the number of workers, and a resumed run the same as an unbroken one.
"""
from __future__ import annotations

import functools
import math
import os
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fastfair.data.datasets import DATASETS, DataBundle, DatasetSpec
from fastfair.data.loaders import LOADERS
from fastfair.errors import UserError

LAYOUT = ("the ImageNet folder layout of torchvision's ImageFolder: DIR/train/<wnid>/*.JPEG and "
          "DIR/val/<wnid>/*.JPEG, one folder per class, the same class folders in both")
# torchvision.datasets.folder.IMG_EXTENSIONS: what ImageFolder reads
EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
# The per-channel statistics of ImageNet's training images that torchvision's pretrained models and Wong et al.'s
# configs normalise with (fast_adversarial/ImageNet/configs: TRAIN.mean, TRAIN.std); not recomputed over 1.28M files.
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
RESIZE_RATIO = 256 / 224  # test: shorter side to 256, centre crop 224 (torchvision's ImageNet reference)


@dataclass(frozen=True)
class Listing:
    # train files, then val files, sorted by class folder, then name (ImageFolder's order); encoded paths in one numpy
    # buffer, not 1.3M Python strings whose reference counts would copy their pages into every worker
    # (pytorch/pytorch#13246)
    files: np.ndarray
    labels: np.ndarray  # int64, one per file
    n_train: int
    classes: list[str]


def _class_files(split_dir: Path, what: str) -> dict[str, list[str]]:
    if not split_dir.is_dir():
        raise UserError(f"{split_dir} is not a folder; the imagenet data set needs --data-dir DIR with {LAYOUT}")
    loose = [e.name for e in os.scandir(split_dir) if e.is_file() and e.name.lower().endswith(EXTENSIONS)]
    if loose:  # the validation archive unpacks flat: ImageFolder would see no class
        raise UserError(f"{split_dir} holds images outside class folders ({loose[0]}, ...); it needs {LAYOUT}. The "
                        "flat ILSVRC2012 validation images go into their class folders with PyTorch's valprep.sh "
                        "(https://raw.githubusercontent.com/soumith/imagenetloader.torch/master/valprep.sh)")
    found = {}
    for entry in sorted(os.scandir(split_dir), key=lambda e: e.name):
        if entry.is_dir():
            found[entry.name] = sorted(f.path for f in os.scandir(entry.path)
                                       if f.is_file() and f.name.lower().endswith(EXTENSIONS))
            if not found[entry.name]:
                raise UserError(f"class folder {entry.path} holds no images ({', '.join(EXTENSIONS)}); every "
                                f"class needs {what} images: {LAYOUT}")
    if not found:
        raise UserError(f"{split_dir} holds no class folders; the imagenet data set needs {LAYOUT}")
    return found


def listing(root: str | Path) -> Listing:
    """The sorted file list of an ImageNet folder (one scan per process: loading and every loader share it)."""
    base = Path(root or "").expanduser()
    if not root or not base.is_dir():
        got = f"{root} is not a folder" if root else "none was given"
        raise UserError(f"the imagenet data set needs --data-dir DIR with {LAYOUT}; {got}")
    return _scan(base.resolve())


@functools.lru_cache(maxsize=4)
def _scan(base: Path) -> Listing:
    train, val = _class_files(base / "train", "training"), _class_files(base / "val", "validation")
    if set(train) != set(val):
        only = sorted(set(train) ^ set(val))
        raise UserError(f"{base}: train/ and val/ need the same class folders; {len(only)} are in one only "
                        f"({', '.join(only[:5])}{', ...' if len(only) > 5 else ''}); it needs {LAYOUT}")
    classes = sorted(train)
    files, labels = [], []
    for split in (train, val):
        for c, name in enumerate(classes):
            files += split[name]
            labels += [c] * len(split[name])
    n_train = sum(len(v) for v in train.values())
    return Listing(np.array([os.fsencode(f) for f in files]), np.asarray(labels, dtype=np.int64), n_train, classes)


class FolderBundle(DataBundle):
    """A :class:`DataBundle` whose ``x_train`` / ``x_test`` are int64 indices into :func:`listing`'s files."""

    def mean_std(self) -> tuple[list[float], list[float]]:
        return list(MEAN), list(STD)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (3, 224, 224)  # the standard crop; the loader's side is data.image_size (any side suits the models)


def _load_imagenet(root: Path | None) -> FolderBundle:
    found = listing(root)
    index, y = torch.arange(len(found.files)), torch.from_numpy(found.labels)
    n = found.n_train
    return FolderBundle("imagenet", index[:n], y[:n], index[n:], y[n:], list(found.classes))


DATASETS.register("imagenet", "ImageNet ILSVRC-2012, 1.28M/50k RGB, ImageFolder layout, streamed from its JPEGs "
                              "(Deng et al. 2009; --data-dir DIR with train/ and val/)")(
    DatasetSpec(_load_imagenet, 10, 0, True, "https://image-net.org/download (ILSVRC2012 train and val)",
                loader="folder")
)


def resized_crop_box(width: int, height: int, rng: random.Random, scale=(0.08, 1.0),
                     ratio=(3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """(top, left, h, w) of a random crop of 8-100 % of the area and aspect 3/4-4/3 (Szegedy et al. 2015's
    augmentation; torchvision's RandomResizedCrop.get_params, drawn from ``rng`` instead of torch's global RNG)."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return rng.randint(0, height - h), rng.randint(0, width - w), h, w
    aspect = width / height  # ten misses: the largest centred crop within the aspect range (torchvision's fallback)
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class _Images(torch.utils.data.Dataset):
    """Position k of the epoch -> (uint8 CHW image, label); :meth:`FolderLoader.__iter__` sets the epoch's order,
    labels (the split's, relabelled by a class subset) and draws."""

    def __init__(self, files, size: int, train: bool, flip: bool):
        self.files, self.size, self.train, self.flip = files, size, train, flip
        self.order = self.labels = self.seeds = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k: int):
        import torchvision.transforms.functional as TF  # here: imported by the processes that decode, when they do
        from PIL import Image

        with Image.open(os.fsdecode(self.files[self.order[k]])) as f:
            img = f.convert("RGB")
        if self.train:
            rng = random.Random(int(self.seeds[k]))
            top, left, h, w = resized_crop_box(img.width, img.height, rng)
            img = TF.resized_crop(img, top, left, h, w, [self.size, self.size])
            if self.flip and rng.random() < 0.5:
                img = TF.hflip(img)
        else:
            img = TF.center_crop(TF.resize(img, round(self.size * RESIZE_RATIO)), [self.size, self.size])
        return torch.from_numpy(np.asarray(img).copy()).permute(2, 0, 1), int(self.labels[k])


class FolderLoader:
    """Index tensors of a :class:`FolderBundle` split -> ``(x in [0,1] float32 on device, y)`` batches, with
    :class:`fastfair.data.loaders.DeviceLoader`'s interface: ``set_epoch``, ``len`` (drop_last when training)."""

    def __init__(self, found: Listing, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, device, train: bool,
                 flip: bool, seed: int, channels_last: bool, image_size: int, workers: int, phases=()):
        self.index, self.y = x.numpy(), y.numpy()
        self.batch_size, self.train, self.seed, self.device = batch_size, train, seed, torch.device(device)
        self.images = _Images(found.files, image_size, train, flip)
        # (first 0-based epoch, image size, batch size) of each resolution phase (Wong et al. 2020); training only
        self.phases = list(phases) if train else []
        self.workers = workers
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.gen = torch.Generator()
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.gen.manual_seed(self.seed * 100_003 + epoch)  # DeviceLoader's seeding
        for first, size, batch in self.phases:
            if first <= epoch:
                self.images.size, self.batch_size = size, batch

    def __len__(self) -> int:
        n = len(self.index)
        return n // self.batch_size if self.train else -(-n // self.batch_size)

    def __iter__(self):
        order = torch.randperm(len(self.index), generator=self.gen).numpy() if self.train else slice(None)
        self.images.order, self.images.labels = self.index[order], self.y[order]
        if self.train:  # one seed per image of the epoch: its crop and flip, whichever worker decodes it
            self.images.seeds = torch.randint(2**62, (len(self.index),), generator=self.gen).numpy()
        batches = torch.utils.data.DataLoader(
            self.images, batch_size=self.batch_size, drop_last=self.train, num_workers=self.workers,
            pin_memory=self.device.type == "cuda", persistent_workers=False)
        for xb, yb in batches:
            xb = xb.to(self.device, non_blocking=True).float().div_(255)
            yield xb.contiguous(memory_format=self.memory_format), yb.to(self.device, non_blocking=True)


@LOADERS.register("folder", "image files read by CPU workers (the imagenet data set; data.workers, data.image_size)")
def _folder_loader(split: str, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, device, train: bool,
                   flip: bool = False, seed: int = 0, channels_last: bool = False, data_dir: str = "",
                   image_size: int = 224, workers: int = 0, phases=(), **_):
    return FolderLoader(listing(data_dir), x, y, batch_size, device=device, train=train, flip=flip, seed=seed,
                        channels_last=channels_last, image_size=image_size, workers=workers, phases=phases)
