"""FFCV backend: exact round trips, DeviceLoader equivalence, augmentation statistics, len semantics.

Skipped without the ``ffcv`` extra (CI installs it). Numba compiles each FFCV pipeline once per
process (a few seconds each), so the tests share a handful of small .beton files.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fastfair import data
from fastfair.data import ffcv as fl  # imports the ffcv package lazily, so it needs no importorskip
from fastfair.errors import UserError
from helpers import needs_extra

needs_extra("ffcv")
# numba's dispatcher finaliser raises a harmless KeyError when FFCV's generated pipelines are freed
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

from scipy.stats import chisquare  # noqa: E402

from helpers import real_data as _shared  # noqa: E402  (located once for every test)


@pytest.fixture(scope="module")
def cifar():
    """A few hundred real CIFAR-10 images: 300 train, 60 val, 100 test."""
    b = data.load("npz", _shared("cifar10-subset.npz"))
    return {"train": (b.x_train[:300], b.y_train[:300]), "val": (b.x_train[300:360], b.y_train[300:360]),
            "test": (b.x_test[:100], b.y_test[:100])}


@pytest.fixture(scope="module")
def cifar_betons(cifar, tmp_path_factory):
    out = tmp_path_factory.mktemp("betons")
    return fl.convert(cifar, out, num_workers=1, meta={"dataset": "npz", "val_per_class": 6})


def _read_all(path, batch_size=64, **kw):
    loader = fl.FFCVLoader(path, batch_size, device="cpu", train=False, num_workers=1, **kw)
    xs, ys = zip(*loader)
    return torch.cat(xs), torch.cat(ys)


def _as_uint8(x: torch.Tensor) -> torch.Tensor:
    return x.mul(255).round_().to(torch.uint8)


def test_round_trip_exact_rgb(cifar, cifar_betons):
    assert set(cifar_betons) == {"train", "val", "test"}
    for name, (x, y) in cifar.items():
        xb, yb = _read_all(cifar_betons[name])
        assert xb.dtype == torch.float32 and yb.dtype == torch.int64
        assert xb.shape == x.shape
        assert torch.equal(_as_uint8(xb), x), name  # every pixel, in the source order
        assert torch.equal(xb, x.float().div(255)), name  # and the same floats DeviceLoader makes
        assert torch.equal(yb, y), name
    meta = fl.read_meta(Path(cifar_betons["train"]).parent)
    assert meta["shape"] == [3, 32, 32] and meta["image_field"] == "rgb" and meta["jpeg"] is False
    assert {k: v["n"] for k, v in meta["splits"].items()} == {"train": 300, "val": 60, "test": 100}
    assert meta["dataset"] == "npz"


def test_round_trip_exact_greyscale(tmp_path):
    """1-channel images go into an NDArrayField (not replicated to RGB) and come back unchanged."""
    b = data.load("npz", _shared("mnist-subset.npz"))
    x, y = b.x_train[:150], b.y_train[:150]
    assert x.shape[1:] == (1, 28, 28)
    paths = fl.convert({"train": (x, y)}, tmp_path, num_workers=1)
    assert fl.read_meta(tmp_path)["image_field"] == "ndarray"
    xb, yb = _read_all(paths["train"])
    assert xb.shape == x.shape and torch.equal(_as_uint8(xb), x) and torch.equal(yb, y)
    with pytest.raises(UserError, match="3-channel"):
        fl.convert({"train": (x, y)}, tmp_path / "jpeg", jpeg=True, num_workers=1)


def test_jpeg_is_close_and_labels_exact(cifar, tmp_path):
    x, y = cifar["test"]
    paths = fl.convert({"test": (x, y)}, tmp_path, jpeg=True, jpeg_quality=95, num_workers=1)
    meta = fl.read_meta(tmp_path)
    assert meta["jpeg"] is True and meta["jpeg_quality"] == 95
    xb, yb = _read_all(paths["test"])
    assert torch.equal(yb, y)
    err = (_as_uint8(xb).float() - x.float()).abs().mean().item()
    assert 0 < err < 4, err  # lossy, but close (mean absolute error in 0..255 units)


def test_same_batches_as_device_loader(cifar, cifar_betons):
    """Same seed: the FFCV loader yields DeviceLoader's batches bit for bit (order, crops, flips)."""
    x, y = cifar["train"]
    kw = dict(device="cpu", train=True, crop_padding=4, flip=True, seed=7, channels_last=True)
    dev = data.DeviceLoader(x, y, 64, **kw)
    ffc = fl.FFCVLoader(cifar_betons["train"], 64, num_workers=1, **kw)
    assert len(dev) == len(ffc) == 300 // 64
    threads = torch.get_num_threads()
    epochs = []
    for epoch in (0, 1, 0):
        dev.set_epoch(epoch)
        ffc.set_epoch(epoch)
        a, b = list(dev), list(ffc)
        assert len(a) == len(b) == len(ffc)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert xb.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(xa, xb) and torch.equal(ya, yb)
        epochs.append(torch.cat([yb for _, yb in b]))
    assert torch.equal(epochs[0], epochs[2]) and not torch.equal(epochs[0], epochs[1])
    assert torch.get_num_threads() == threads  # FFCV's thread setting does not leak into torch


def test_len_and_drop_last(cifar, cifar_betons):
    train = fl.FFCVLoader(cifar_betons["train"], 128, device="cpu", train=True, num_workers=1)
    sizes = [len(yb) for _, yb in train]
    assert len(train) == 2 and sizes == [128, 128]  # 300 // 128; the last 44 dropped
    ev = fl.FFCVLoader(cifar_betons["train"], 128, device="cpu", train=False, num_workers=1)
    sizes = [len(yb) for _, yb in ev]
    assert len(ev) == 3 and sizes == [128, 128, 44]
    exact = fl.FFCVLoader(cifar_betons["val"], 20, device="cpu", train=True, num_workers=1)
    assert len(exact) == 3 and [len(yb) for _, yb in exact] == [20, 20, 20]


def _rows(x: torch.Tensor) -> list[bytes]:
    return [hashlib.sha1(_as_uint8(im).numpy().tobytes()).digest() for im in x]


def test_quasi_random_order_is_a_seeded_permutation(cifar, cifar_betons):
    x, _ = cifar["train"]
    src = {h: i for i, h in enumerate(_rows(x.float().div(255)))}
    loader = fl.FFCVLoader(cifar_betons["train"], 50, device="cpu", train=True, order="quasi_random",
                           os_cache=False, seed=3, num_workers=1)
    seen = []
    for epoch in (0, 1, 0):
        loader.set_epoch(epoch)
        idx = [src[h] for h in _rows(torch.cat([xb for xb, _ in loader]))]  # KeyError: not a source image
        assert len(idx) == 300 and len(set(idx)) == 300
        seen.append(idx)
    assert seen[0] == seen[2] and seen[0] != seen[1] and seen[0] != sorted(seen[0])


def _offsets_and_flips(src: torch.Tensor, out: torch.Tensor, p: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each output image, the (dy, dx, flipped) whose crop of the zero-padded source matches it."""
    _, _, h, w = src.shape
    padded = F.pad(src, (p,) * 4)
    dys, dxs, flips = [], [], []
    for s, o in zip(padded, out):
        hits = [(dy, dx, fl_) for dy in range(2 * p + 1) for dx in range(2 * p + 1) for fl_ in (0, 1)
                if torch.equal(s[:, dy:dy + h, dx:dx + w].flip(2) if fl_ else s[:, dy:dy + h, dx:dx + w], o)]
        assert len(hits) == 1, hits  # random images: exactly one candidate matches
        dys.append(hits[0][0])
        dxs.append(hits[0][1])
        flips.append(hits[0][2])
    return np.array(dys), np.array(dxs), np.array(flips)


@pytest.fixture(scope="module")
def noise_beton(tmp_path_factory):
    """1000 random 3x8x8 images: every crop/flip of one is distinguishable from every other."""
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 256, (1000, 3, 8, 8), generator=g, dtype=torch.uint8)
    y = torch.arange(1000) % 10
    out = tmp_path_factory.mktemp("noise")
    return x, fl.convert({"train": (x, y)}, out, num_workers=1)["train"]


def _check_uniform(dys, dxs, flips, p):
    n = len(flips)
    for offsets in (dys, dxs):
        counts = np.bincount(offsets, minlength=2 * p + 1)
        assert len(counts) == 2 * p + 1 and counts.min() > 0
        assert chisquare(counts).pvalue > 1e-4, counts  # uniform over 0..2p
    assert abs(flips.mean() - 0.5) < 4 * (0.25 / n) ** 0.5, flips.mean()


@pytest.mark.parametrize("augment", ["device", pytest.param("ffcv", marks=pytest.mark.slow)])
def test_augmentation_statistics_match_device_loader(noise_beton, augment):
    """Crop offsets uniform on 0..2p in both axes and flip rate 0.5, as DeviceLoader's.

    ``augment="ffcv"`` (FFCV's RandomTranslate + RandomHorizontalFlip) is marked slow: numba
    takes ~15 s of CPU to compile those two ops.
    """
    x, path = noise_beton
    p = 2
    loader = fl.FFCVLoader(path, 100, device="cpu", train=True, crop_padding=p, flip=True, seed=1,
                           order="sequential", num_workers=1, augment=augment)
    out = torch.cat([_as_uint8(xb) for xb, _ in loader])
    assert out.shape == x.shape
    got = _offsets_and_flips(x, out, p)
    _check_uniform(*got, p)
    dev = data.DeviceLoader(x, torch.zeros(len(x), dtype=torch.int64), 100, device="cpu", train=True,
                            crop_padding=p, flip=True, seed=1)
    g = dev.gen
    g.manual_seed(1 * 100_003)
    ref = data.random_crop_flip(x, p, True, g)  # DeviceLoader's augmentation of the same images
    _check_uniform(*_offsets_and_flips(x, ref, p), p)


def test_errors(cifar_betons, tmp_path):
    with pytest.raises(UserError, match="data convert"):
        fl.loader_for(tmp_path, "train", 32, device="cpu", train=True)
    with pytest.raises(UserError, match="data.order"):
        fl.FFCVLoader(cifar_betons["train"], 32, device="cpu", train=True, order="shuffled")
    with pytest.raises(UserError, match="val_per_class"):
        fl.check_meta(Path(cifar_betons["train"]).parent, dataset="npz", val_per_class=100)
    assert fl.check_meta(Path(cifar_betons["train"]).parent, dataset="npz", val_per_class=6)["dataset"] == "npz"
    with pytest.raises(UserError, match="300 images in meta.json but 299"):
        fl.check_meta(Path(cifar_betons["train"]).parent, split="train", n=299)
    with pytest.raises(UserError, match="data convert"):
        fl.read_meta(tmp_path)
    loader = fl.loader_for(Path(cifar_betons["train"]).parent, "val", 32, device="cpu", train=False, num_workers=1)
    assert len(loader) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_device_loader(cifar, cifar_betons):
    x, y = cifar["train"]
    kw = dict(device="cuda", train=True, crop_padding=4, flip=True, seed=2, channels_last=True)
    dev = data.DeviceLoader(x, y, 64, **kw)
    ffc = fl.FFCVLoader(cifar_betons["train"], 64, **kw)
    for (xa, ya), (xb, yb) in zip(dev, ffc):
        assert xb.device.type == "cuda" and yb.device.type == "cuda"
        assert torch.equal(xa, xb) and torch.equal(ya, yb)


@pytest.mark.slow
def test_train_through_ffcv_matches_device_loader(tmp_path):
    """`fastfair data convert` + `fastfair train --loader ffcv`: one epoch on real CIFAR-10 images,
    the same metrics and weights as the same run on the device loader."""
    import json

    from fastfair import cli
    from fastfair.rundir import load_checkpoint

    with np.load(_shared("cifar10-subset.npz")) as f:
        npz = tmp_path / "small.npz"
        np.savez(npz, x_train=f["x_train"][:300], y_train=f["y_train"][:300], x_test=f["x_test"][:100],
                 y_test=f["y_test"][:100])
    betons = tmp_path / "betons"
    assert cli.main(["data", "convert", "--dataset", "npz", "--data-dir", str(npz), "--out", str(betons),
                     "--val-per-class", "5", "--workers", "1"]) == 0
    files = {f"{split}.beton" for split in ("train", "val", "test")}  # each with the sidecar of its verified hash
    assert {p.name for p in betons.iterdir()} == {*files, *(f"{f}.verified.json" for f in files), "meta.json"}
    common = ["train", "--method", "pgd-at", "--dataset", "npz", "--data-dir", str(npz), "--model", "tiny-cnn",
              "--epochs", "1", "--device", "cpu", "--quiet", "--set", "data.val_per_class=5",
              "--set", "data.batch_size=50", "--set", "attack.steps=2", "--set", "train.val_attack=pgd2",
              "--set", "eval.attacks=['clean']"]
    runs = {}
    for loader in ("ffcv", "device"):
        out = tmp_path / loader
        extra = ["--loader", "ffcv", "--beton-dir", str(betons)] if loader == "ffcv" else []
        assert cli.main(common + extra + ["--out", str(out)]) == 0
        runs[loader] = out
    rec = {k: json.loads((v / "metrics.jsonl").read_text().splitlines()[0]) for k, v in runs.items()}
    for key in ("loss", "train_robust_acc_per_class", "val"):
        assert rec["ffcv"][key] == rec["device"][key], key
    wa, wb = (load_checkpoint(v / "checkpoints" / "last.pt")["model"] for v in runs.values())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert "loader = \"ffcv\"" in (runs["ffcv"] / "config.toml").read_text()
    # a beton folder made with another validation size is refused, naming the fix
    assert cli.main(common + ["--loader", "ffcv", "--beton-dir", str(betons), "--out", str(tmp_path / "bad"),
                              "--set", "data.val_per_class=7"]) == 2
