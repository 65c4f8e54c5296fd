"""Data sets as uint8 tensors and the CFA validation split.

Every data set loads into one :class:`DataBundle` (uint8 NCHW images, int64 labels, class
names); :func:`split` carves the validation split from train by CFA's rule (the first N images
of each class).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fastfair.errors import UserError
from fastfair.registry import Registry

CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
DIGITS = [str(i) for i in range(10)]
# An .npz without class_names whose file name names one of these data sets (cifar10-subset.npz), with its image
# shape and class count, gets that data set's names: torchvision's for the full set, the same for a part of it.
KNOWN_CLASSES = {"cifar10": ((3, 32, 32), CIFAR10_CLASSES), "svhn": ((3, 32, 32), DIGITS),
                 "mnist": ((1, 28, 28), DIGITS)}


@dataclass
class DataBundle:
    name: str
    x_train: torch.Tensor  # uint8 (N, C, H, W)
    y_train: torch.Tensor  # int64 (N,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    classes: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.x_train.shape[1:])

    def mean_std(self) -> tuple[list[float], list[float]]:
        """Per-channel mean and std of the training images in [0, 1] (used inside the model)."""
        x = self.x_train.float().div_(255)
        return x.mean(dim=(0, 2, 3)).tolist(), x.std(dim=(0, 2, 3)).tolist()


@dataclass(frozen=True)
class DatasetSpec:
    load: Callable[[Path | None], DataBundle]
    val_per_class: int  # CFA: 100 per class on CIFAR-10 (2% of train)
    crop_padding: int  # 0 = no random crop
    flip: bool
    download_hint: str
    # the loader that can read it: "device" holds every image in memory; "folder" streams a data set too large
    # for that (imagenet) from its files
    loader: str = "device"


DATASETS: Registry[DatasetSpec] = Registry("data set")


def _as_nchw(x: np.ndarray) -> torch.Tensor:
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[:, None]
    elif x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.dtype != np.uint8:
        raise UserError(f"images must be uint8 in [0, 255], got {x.dtype}")
    return torch.from_numpy(np.ascontiguousarray(x))


def _labels(y) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y), dtype=torch.int64)


def _torchvision(cls_name: str, train_kw, test_kw, label_attr: str, hint: str, classes=None):
    def load(data_dir: Path | None) -> DataBundle:
        import torchvision.datasets as tvd

        root = Path(data_dir or os.environ.get("FASTFAIR_DATA", "~/.cache/fastfair/data")).expanduser()
        if root.is_file():  # torchvision would try to download into it and fail with an OS error
            raise UserError(f"--data-dir {root} is a file; {cls_name} needs a folder (torchvision's {cls_name} "
                            f"reads its files there, or downloads them from {hint}); a .npz file of your own "
                            f"is read by --dataset npz --data-dir FILE.npz")
        cls = getattr(tvd, cls_name)
        sets = []
        for kw in (train_kw, test_kw):
            try:
                sets.append(cls(str(root), download=False, **kw))
            except (RuntimeError, FileNotFoundError):
                try:
                    sets.append(cls(str(root), download=True, **kw))
                except Exception as err:  # no network, bad mirror, disk full: all need the same fix
                    raise UserError(
                        f"{cls_name} is not under {root} and could not be downloaded ({type(err).__name__}: "
                        f"{str(err)[:120]}). Download it from {hint}, "
                        f"put it under a folder and pass --data-dir FOLDER (or set FASTFAIR_DATA=FOLDER, the "
                        f"folder used without --data-dir); or run the offline demo: "
                        f"fastfair train --config demo"
                    ) from None
        tr, te = sets
        names = (classes or list(getattr(tr, "classes", []))
                 or [str(i) for i in range(int(max(getattr(tr, label_attr))) + 1)])
        return DataBundle(
            cls_name.lower(), _as_nchw(np.asarray(tr.data)), _labels(getattr(tr, label_attr)),
            _as_nchw(np.asarray(te.data)), _labels(getattr(te, label_attr)), names,
        )

    return load


def _register_tv(name, doc, cls_name, train_kw, test_kw, label_attr, val, pad, flip, hint, classes=None):
    load = _torchvision(cls_name, train_kw, test_kw, label_attr, hint, classes)
    DATASETS.register(name, doc)(DatasetSpec(load, val, pad, flip, hint))


_register_tv("cifar10", "CIFAR-10, 50k/10k 32x32 RGB (Krizhevsky 2009); torchvision", "CIFAR10",
             {"train": True}, {"train": False}, "targets", 100, 4, True,
             "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz")
_register_tv("cifar100", "CIFAR-100, 50k/10k 32x32 RGB (Krizhevsky 2009); torchvision", "CIFAR100",
             {"train": True}, {"train": False}, "targets", 10, 4, True,
             "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz")
_register_tv("svhn", "SVHN digits, 73k/26k 32x32 RGB (Netzer et al. 2011); torchvision", "SVHN",
             {"split": "train"}, {"split": "test"}, "labels", 100, 4, False,
             "http://ufldl.stanford.edu/housenumbers/ (train_32x32.mat, test_32x32.mat)",
             classes=DIGITS)
_register_tv("stl10", "STL-10, 5k/8k 96x96 RGB labelled splits (Coates et al. 2011); torchvision", "STL10",
             {"split": "train"}, {"split": "test"}, "labels", 50, 12, True,
             "http://ai.stanford.edu/~acoates/stl10/stl10_binary.tar.gz")
_register_tv("mnist", "MNIST, 60k/10k 28x28 grey (LeCun et al. 1998); torchvision", "MNIST",
             {"train": True}, {"train": False}, "targets", 100, 0, False,
             "https://ossci-datasets.s3.amazonaws.com/mnist/ (the four *-ubyte.gz files)",
             classes=DIGITS)


NPZ_FORMAT = ("arrays x_train, y_train, x_test, y_test: uint8 images (N, H, W), (N, C, H, W) or (N, H, W, C) "
              "with C 1 or 3, integer labels 0..K-1; optional class_names")


def _npz_images(path: Path, name: str, x: np.ndarray) -> torch.Tensor:
    if x.ndim not in (3, 4) or (x.ndim == 4 and 1 not in x.shape[1::2] and 3 not in x.shape[1::2]):
        raise UserError(f"{path}: {name} has shape {x.shape}; the npz data set needs {NPZ_FORMAT}")
    if x.dtype != np.uint8:
        raise UserError(f"{path}: {name} is {x.dtype}; the npz data set needs {NPZ_FORMAT} "
                        "(convert with (x * 255).round().astype(np.uint8) for images in [0, 1])")
    return _as_nchw(x)


def check_labels(name: str, y: np.ndarray, n: int, classes: int | None) -> None:
    """Labels of ``n`` images, one integer each in 0..classes-1: an .npz's arrays and ``fastfair.evaluate``'s ``y``."""
    if y.ndim != 1 or len(y) != n:
        raise UserError(f"{name} has shape {y.shape} for {n} images; it needs one label per image")
    if not np.issubdtype(y.dtype, np.integer):
        raise UserError(f"{name} is {y.dtype}; labels must be integers 0..K-1 (float labels are not truncated "
                        "silently)")
    if n and (y.min() < 0 or (classes is not None and y.max() >= classes)):
        top = f"{classes - 1} ({classes} classes)" if classes is not None else "K-1"
        raise UserError(f"{name} holds labels {int(y.min())}..{int(y.max())}, outside 0..{top}")


def _npz_labels(path: Path, name: str, y: np.ndarray, n: int, classes: int | None) -> torch.Tensor:
    try:
        check_labels(name, y, n, classes)
    except UserError as err:
        raise UserError(f"{path}: {err}") from None
    return _labels(y)


def _load_npz(path: Path | None) -> DataBundle:
    if path is None or not Path(path).is_file():
        got = f"there is no file {path}" if path else "none was given"
        raise UserError(f"the npz data set needs --data-dir FILE.npz ({NPZ_FORMAT}); {got}")
    try:
        f = np.load(path, allow_pickle=False)
    except OSError as err:
        raise UserError(f"{path} is not a readable npz file ({err}); it needs {NPZ_FORMAT}") from None
    except ValueError:  # numpy's message offers allow_pickle, which is never the fix here
        raise UserError(f"{path} is not an .npz file (what np.savez writes: named arrays in a zip); the npz data "
                        f"set needs {NPZ_FORMAT}") from None
    if not isinstance(f, np.lib.npyio.NpzFile):
        raise UserError(f"{path} holds one array (a .npy file), not an .npz of named arrays; the npz data set needs "
                        f"{NPZ_FORMAT} (write it with np.savez(FILE, x_train=..., y_train=..., ...))")
    with f:
        missing = {"x_train", "y_train", "x_test", "y_test"} - set(f.files)
        if missing:
            raise UserError(f"{path} lacks arrays {sorted(missing)}; it needs {NPZ_FORMAT}")
        try:
            arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
            names = [str(c) for c in f["class_names"]] if "class_names" in f.files else None
        except ValueError as err:  # an object array: would need pickle, which is never used
            raise UserError(f"{path}: {err}; it needs {NPZ_FORMAT}") from None
    x_train, x_test = (_npz_images(path, k, arrays[k]) for k in ("x_train", "x_test"))
    if x_train.shape[1:] != x_test.shape[1:]:
        raise UserError(f"{path}: x_train images are {tuple(x_train.shape[1:])} and x_test images "
                        f"{tuple(x_test.shape[1:])}; both splits need one image shape")
    y_train = _npz_labels(path, "y_train", arrays["y_train"], len(x_train), len(names) if names else None)
    count = len(names) if names else int(y_train.max()) + 1 if len(y_train) else 0
    _check_every_class(path, y_train, count)
    # without class_names, tables and figures say "class 3" rather than a bare "3" that reads as a value
    classes = names or _known_names(Path(path), tuple(x_train.shape[1:]), count) or [f"class {i}" for i in range(count)]
    y_test = _npz_labels(path, "y_test", arrays["y_test"], len(x_test), len(classes))
    if not len(y_train) or not len(y_test):
        raise UserError(f"{path}: a split is empty; it needs {NPZ_FORMAT}")
    return DataBundle(Path(path).stem, x_train, y_train, x_test, y_test, classes)


def _check_every_class(path: Path, y_train: torch.Tensor, count: int) -> None:
    """Every class 0..count-1 has training images. Labels {0..8, 12} would build a 13-way model whose classes 9-11 no
    image teaches and whose tables hold three rows of nothing: refused rather than warned, since the one meant use
    of an untaught class (a model that never saw it, Tian et al. KDD 2021 Sec. 6.1) keeps its images in the file and
    names it in data.drop_classes, so that every table says so."""
    missing = sorted(set(range(count)) - set(y_train.unique().tolist()))
    if missing:
        shown = ", ".join(map(str, missing[:8])) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise UserError(f"{path}: y_train has no image of class {shown} of {count} (labels 0..{count - 1}), so "
                        f"{len(missing)} of the model's outputs would be taught by no image; number both splits' "
                        f"labels 0..{count - len(missing) - 1} without gaps, or, to train without a class on purpose, "
                        "keep its images and name it in --set data.drop_classes=[...]")


def _known_names(path: Path, shape: tuple[int, ...], count: int) -> list[str] | None:
    """The class names of the :data:`KNOWN_CLASSES` data set the file is named after, if its images and classes fit."""
    stem = re.sub(r"[-_ ]", "", path.stem.lower())
    for name, (known_shape, names) in KNOWN_CLASSES.items():
        # cifar100 is not cifar10, fashionmnist not mnist
        if re.search(rf"(?<![a-z]){name}(?!\d)", stem) and shape == known_shape and count == len(names):
            return names
    return None


DATASETS.register("npz", "any .npz with uint8 x_train/x_test and int y_train/y_test (--data-dir FILE.npz)")(
    DatasetSpec(_load_npz, 50, 4, True, "your own file")
)


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """(images (1797, 8, 8) of 0..16, labels) of scikit-learn's digits, read as its ``load_digits`` reads them (its
    data/digits.csv.gz: 64 pixels, then the label, a row an image), without importing scikit-learn: that costs a
    process about 2 CPU s, ten times the read. Where the file is not there, ``load_digits`` itself."""
    import gzip
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    path = Path(next(iter(spec.submodule_search_locations or []), "")) / "datasets" / "data" / "digits.csv.gz" \
        if spec else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.images, d.target
    with gzip.open(path, "rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def _load_digits(data_dir: Path | None) -> DataBundle:
    if data_dir is not None:  # a setting that would do nothing (a run's eval --data-dir among them, issue 58)
        raise UserError(f"data set 'digits' ships inside scikit-learn and reads no files: --data-dir {data_dir} "
                        "(data.data_dir) would change nothing; leave it out (a .npz file of your own is "
                        "--dataset npz, to train on)")
    images, target = _digits()
    x = np.round(images * (255.0 / 16.0)).astype(np.uint8)
    y = target.astype(np.int64)
    n_train = 1437  # the first 80% train, the last 360 images test
    return DataBundle("digits", _as_nchw(x[:n_train]), _labels(y[:n_train]), _as_nchw(x[n_train:]),
                      _labels(y[n_train:]), DIGITS)


DATASETS.register("digits",
                  "offline demo: scikit-learn's 1797 8x8 handwritten digits (UCI), ships inside scikit-learn")(
    DatasetSpec(_load_digits, 10, 0, False, "nowhere: it ships inside scikit-learn")
)


def _load_tiny_imagenet(root: Path | None) -> DataBundle:
    from PIL import Image

    root = Path(root or "")
    if not (root / "wnids.txt").is_file():
        raise UserError(
            f"Tiny-ImageNet needs --data-dir pointing at the unpacked tiny-imagenet-200 folder "
            f"(with wnids.txt, train/, val/); {root} has no wnids.txt. Download: "
            f"{DATASETS.get('tiny-imagenet').download_hint}"
        )
    wnids = (root / "wnids.txt").read_text().split()
    index = {w: i for i, w in enumerate(wnids)}

    def read(paths):
        return np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths])

    train = sorted((root / "train").glob("*/images/*.JPEG"))
    y_train = [index[p.parts[-3]] for p in train]
    ann = [line.split("\t")[:2] for line in (root / "val" / "val_annotations.txt").read_text().splitlines()]
    val = [root / "val" / "images" / name for name, _ in ann]
    y_val = [index[w] for _, w in ann]
    return DataBundle("tiny-imagenet", _as_nchw(read(train)), _labels(y_train), _as_nchw(read(val)),
                      _labels(y_val), wnids)


DATASETS.register("tiny-imagenet", "Tiny-ImageNet-200, 100k/10k 64x64 RGB, standard folder layout (Le & Yang 2015)")(
    DatasetSpec(_load_tiny_imagenet, 10, 4, True, "http://cs231n.stanford.edu/tiny-imagenet-200.zip")
)


def load(name: str, data_dir: str | Path | None = None) -> DataBundle:
    return DATASETS.get(name).load(Path(data_dir).expanduser() if data_dir else None)


def subset_note(dataset: str, train_per_class: int, test_per_class: int) -> str:
    """The words every table of a quick run carries ("" for a full run): results on part of a data set
    must never pass for results on all of it."""
    parts = [f"{what} on the first {n}/class" for what, n in (("trained", train_per_class),
                                                              ("tested", test_per_class)) if n]
    return f"quick run: {' and '.join(parts)} of {dataset}" if parts else ""


def _first_per_class(y: torch.Tensor, num_classes: int, n: int) -> torch.Tensor:
    """Mask of the first ``n`` images of each class, in file order (0: every image)."""
    if not n:
        return torch.ones_like(y, dtype=torch.bool)
    keep = torch.zeros_like(y, dtype=torch.bool)
    for c in range(num_classes):
        keep[(y == c).nonzero().flatten()[:n]] = True
    return keep


def split(bundle: DataBundle, val_per_class: int, train_per_class: int = 0,
          test_per_class: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """train / val / test; val = the first ``val_per_class`` training images of each class (CFA, Sec. 5.1).

    A quick run (``data.train_per_class`` / ``data.test_per_class`` above 0) then keeps only the first N
    images of each class of train (after val is taken, so val is the same as in the full run) and of
    test, so its per-class numbers still cover every class evenly."""
    y = bundle.y_train
    is_val = torch.zeros_like(y, dtype=torch.bool)
    for c in range(bundle.num_classes):
        members = (y == c).nonzero().flatten()
        if 0 < len(members) <= val_per_class:
            raise UserError(f"data.val_per_class={val_per_class} takes every training image of class "
                            f"{bundle.classes[c]} ({len(members)} images), leaving none to train on; "
                            f"lower data.val_per_class below {len(members)}")
        is_val[members[:val_per_class]] = True
    x_train, y_train = bundle.x_train[~is_val], y[~is_val]
    for key, flag, n, labels, what in (("data.train_per_class", "--quick", train_per_class, y_train, "training split"),
                                       ("data.test_per_class", "--quick-test/--per-class", test_per_class,
                                        bundle.y_test, "test split")):
        largest = int(torch.bincount(labels, minlength=bundle.num_classes).max()) if len(labels) else 0
        if n and n >= largest:  # a cap that keeps everything does nothing, yet every table would say "quick run"
            raise UserError(f"{key}={n} ({flag} {n}) keeps every image: the {what} of {bundle.name} has at most "
                            f"{largest} images per class; for a quick run pass fewer than {largest}, for the whole "
                            f"split leave {flag} out")
    train = _first_per_class(y_train, bundle.num_classes, train_per_class)
    test = _first_per_class(bundle.y_test, bundle.num_classes, test_per_class)
    return {
        "train": (x_train[train], y_train[train]),
        "val": (bundle.x_train[is_val], y[is_val]),
        "test": (bundle.x_test[test], bundle.y_test[test]),
    }
