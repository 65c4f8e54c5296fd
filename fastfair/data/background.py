"""Backgrounds of Tian et al. (KDD 2021, Sec. 6.2): MNIST with a background colour per class (Fig. 5), and a
class's test images with their background replaced by one colour given a foreground mask (Table 4, Fig. 6).

Fig. 5(a), which shows the paper's colours, is an image the text does not describe; the text says only that
the grey digits become three-channel images, that each class gets a background colour, and that 2 and 3 share
one while 2 and 5 do not. :data:`MNIST_PAIRS` is fastfair's reading of that (classes 2k and 2k+1 share a colour);
``--colours`` gives any other assignment, including several colours for a class (each image then draws one,
seeded). The paper's masks were made by hand; :func:`border_masks` is a stated, deterministic approximation.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np

from fastfair.data.datasets import DATASETS, DatasetSpec, load
from fastfair.errors import UserError
from fastfair.rundir import write_npz_atomic

COLOURS = {"white": (255, 255, 255), "black": (0, 0, 0), "red": (230, 25, 25), "green": (30, 160, 50),
           "blue": (30, 70, 220), "yellow": (240, 210, 20), "magenta": (200, 40, 200), "cyan": (20, 200, 210),
           "orange": (245, 130, 20), "purple": (110, 40, 170), "grey": (128, 128, 128)}
COLOUR_FORMAT = "a name (" + ", ".join(COLOURS) + ") or R,G,B in 0..255 (e.g. 255,255,255) or #rrggbb"
# fastfair's default for Fig. 5: pairs of classes share a colour (2 and 3 do, 2 and 5 do not: Sec. 6.2)
MNIST_PAIRS = "0=red,1=red,2=green,3=green,4=blue,5=blue,6=yellow,7=yellow,8=magenta,9=magenta"


def parse_colour(text: str) -> tuple[int, int, int]:
    """An RGB triple from a colour name, ``R,G,B`` or ``#rrggbb``."""
    t = text.strip().lower()
    if t in COLOURS:
        return COLOURS[t]
    if re.fullmatch(r"#[0-9a-f]{6}", t):
        return tuple(int(t[i:i + 2], 16) for i in (1, 3, 5))
    parts = t.split(",")
    if len(parts) == 3 and all(p.strip().isdigit() and int(p) <= 255 for p in parts):
        return tuple(int(p) for p in parts)
    raise UserError(f"unknown colour {text!r}; a colour is {COLOUR_FORMAT}")


def parse_palette(text: str, classes: list[str]) -> list[list[tuple[int, int, int]]]:
    """``--colours``: ``CLASS=COLOUR[/COLOUR...]`` for every class, comma-separated (R,G,B colours as #rrggbb)."""
    palette: dict[int, list] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, colours = item.partition("=")
        if not sep:
            raise UserError(f"--colours takes CLASS=COLOUR entries such as 0=red,1=#00ff00/blue; got {item!r}")
        palette[class_index(name, classes, "--colours")] = [parse_colour(c) for c in colours.split("/")]
    missing = [classes[c] for c in range(len(classes)) if c not in palette]
    if missing:
        raise UserError(f"--colours gives no colour for class {', '.join(missing)}; name one for every class")
    if any(c == COLOURS["white"] for cs in palette.values() for c in cs):
        raise UserError("--colours: white is the digits' colour; a white background would hide them")
    return [palette[c] for c in range(len(classes))]


def named(name: str) -> str:
    """``class cat``, but ``class 3`` for a data set whose class names are already ``class 3``."""
    return name if name.startswith("class ") else f"class {name}"


def class_index(name: str, classes: list[str], flag: str) -> int:
    """A class given by index or by name (as `fastfair eval` tables print it)."""
    t = name.strip()
    if t in classes:
        return classes.index(t)
    if t.isdigit() and int(t) < len(classes):
        return int(t)
    raise UserError(f"{flag}: unknown class {name!r}; the classes are "
                    + ", ".join(f"{i} {n}" for i, n in enumerate(classes)))


def add_backgrounds(x: np.ndarray, y: np.ndarray, palette, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Grey digits (N, 1, H, W) -> RGB (N, 3, H, W): white strokes over their class's colour, blended by the grey level
    (Tian et al., KDD 2021, Sec. 6.2); also each image's colour (N, 3). A class with several colours draws one per
    image from ``rng``."""
    colour = np.empty((len(y), 3), dtype=np.uint8)
    for c, options in enumerate(palette):
        members = np.flatnonzero(y == c)
        pick = rng.integers(0, len(options), len(members)) if len(options) > 1 else np.zeros(len(members), int)
        colour[members] = np.asarray(options, dtype=np.uint8)[pick]
    ink = x.astype(np.float32) / 255.0  # 1: stroke, 0: background
    rgb = ink * 255.0 + (1.0 - ink) * colour[:, :, None, None].astype(np.float32)
    return np.rint(rgb).astype(np.uint8), colour


def write_mnist_background(bundle, out: Path, colours: str, seed: int) -> dict:
    """The Fig. 5 data set of Tian et al. (KDD 2021, Sec. 6.2) as an ``.npz`` fastfair trains on (``--dataset npz``);
    returns the recorded parameters, also stored in the file (``background_params``, JSON)."""
    if bundle.shape[0] != 1:
        raise UserError(f"{bundle.name} has {bundle.shape[0]}-channel images; the background data set colours grey "
                        "digits (MNIST)")
    palette = parse_palette(colours, bundle.classes)
    rng = np.random.default_rng(seed)
    x_train, c_train = add_backgrounds(bundle.x_train.numpy(), bundle.y_train.numpy(), palette, rng)
    x_test, c_test = add_backgrounds(bundle.x_test.numpy(), bundle.y_test.numpy(), palette, rng)
    params = {"paper": "Tian et al., KDD 2021, Sec. 6.2, Fig. 5", "source": bundle.name, "seed": seed,
              "colours": {name: [list(c) for c in palette[i]] for i, name in enumerate(bundle.classes)},
              "blend": "white strokes over the class colour, weighted by the grey level"}
    write_npz_atomic({"x_train": x_train, "y_train": bundle.y_train.numpy(), "x_test": x_test,
                      "y_test": bundle.y_test.numpy(), "class_names": np.array(bundle.classes),
                      "background_train": c_train, "background_test": c_test,
                      "background_params": json.dumps(params)}, out, compressed=True)
    return params


DATA_FILE = "mnist-background.npz"  # what ``mnist-background`` reads in a data folder


def data_path(data_dir: str | Path | None) -> Path:
    """The coloured MNIST a run of ``mnist-background`` reads: ``data_dir`` when it is a file, else
    ``mnist-background.npz`` in it (default ``$FASTFAIR_DATA``, else ``~/.cache/fastfair/data``, as torchvision's
    MNIST the file is made from)."""
    root = Path(data_dir or os.environ.get("FASTFAIR_DATA", "~/.cache/fastfair/data")).expanduser()
    return root if root.suffix == ".npz" else root / DATA_FILE


def _load_mnist_background(data_dir: Path | None):
    path = data_path(data_dir)
    make = f"fastfair data background --out {path} (add --data-dir FOLDER_OR_FILE.npz for your grey MNIST)"
    if not path.is_file():
        raise UserError(f"mnist-background needs the coloured MNIST of Tian et al. KDD Fig. 5, {path}, which is "
                        f"not there; write it with: {make}; or pass --data-dir FILE.npz where it is")
    with np.load(path, allow_pickle=False) as f:
        coloured = "background_params" in f.files
    if not coloured:
        raise UserError(f"{path} has no background_params, so it is not the coloured MNIST fastfair data "
                        f"background writes; write one with: {make}")
    return dataclasses.replace(load("npz", path), name="mnist-background")


# MNIST's own defaults (no crop, no flip: TRADES's MNIST code, which Tian et al. follow, augments nothing)
DATASETS.register("mnist-background", "MNIST with a background colour per class (Tian et al. KDD 2021 Fig. 5), "
                                      "the .npz fastfair data background writes")(
    DatasetSpec(_load_mnist_background, 100, 0, False, "fastfair data background (from torchvision's MNIST)"))


# ---- masks and replacement at inference (Table 4, Fig. 6) -----------------------------------------------

MASK_FORMAT = ("an .npz with masks: bool (N, H, W), True on the foreground, one per test image of the class in the "
               "test set's order (fastfair data masks writes one)")


def border_masks(x: np.ndarray, threshold: float) -> np.ndarray:
    """Foreground masks (N, H, W): background is every pixel within ``threshold`` (max over channels, [0, 1] scale)
    of the median colour of the image's one-pixel border and connected to the border; an approximation of the
    hand-made masks of Tian et al. (KDD 2021, Sec. 6.2)."""
    from scipy import ndimage

    n, _, h, w = x.shape
    xf = x.astype(np.float32) / 255.0
    edge = np.ones((h, w), dtype=bool)
    edge[1:-1, 1:-1] = False
    masks = np.empty((n, h, w), dtype=bool)
    for i in range(n):
        border = np.median(xf[i][:, edge], axis=1)
        near = np.abs(xf[i] - border[:, None, None]).max(axis=0) <= threshold
        labels, _ = ndimage.label(near)  # 4-connected regions of pixels near the border colour
        touching = np.setdiff1d(np.unique(labels[edge & near]), [0])
        masks[i] = ~np.isin(labels, touching)
    return masks


def read_masks(path: str, count: int, shape: tuple[int, int], cls: int, classes: list[str]) -> tuple[np.ndarray, str]:
    """(the first ``count`` masks of ``path``, its sha256); a file that cannot be the class's masks is a UserError."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--mask {path}: no such file; it needs {MASK_FORMAT}")
    try:
        with np.load(p, allow_pickle=False) as f:
            if "masks" not in f.files:
                raise UserError(f"--mask {path} has no array 'masks' (it has {', '.join(f.files)}); it needs "
                                f"{MASK_FORMAT}")
            masks, made_for = f["masks"], (int(f["class_index"]) if "class_index" in f.files else None)
    except (OSError, ValueError, AttributeError):
        raise UserError(f"--mask {path} is not an .npz file; it needs {MASK_FORMAT}") from None
    if made_for is not None and made_for != cls:
        raise UserError(f"--mask {path} was made for class {classes[made_for]}, not {classes[cls]}")
    if masks.ndim != 3 or tuple(masks.shape[1:]) != shape or len(masks) < count:
        raise UserError(f"--mask {path} holds masks of shape {masks.shape}; the test set has {count} images of class "
                        f"{classes[cls]} of {shape[0]}x{shape[1]} pixels: it needs ({count}, {shape[0]}, {shape[1]})")
    if masks.dtype != bool and not np.isin(masks, (0, 1)).all():
        raise UserError(f"--mask {path}: masks are {masks.dtype} with values other than 0 and 1; they must be "
                        "boolean, True on the foreground")
    return masks[:count].astype(bool), hashlib.sha256(p.read_bytes()).hexdigest()


def replace_background(x: np.ndarray, masks: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    """Images (N, C, H, W) with every pixel outside the foreground mask set to ``colour`` (Tian et al., KDD 2021,
    Sec. 6.2, Table 4)."""
    fill = np.asarray(colour, dtype=x.dtype)[: x.shape[1], None, None]
    return np.where(masks[:, None], x, fill)
