"""Optional FFCV backend: write splits to ``.beton`` files and read them back as device batches.

FFCV (Leclerc et al., CVPR 2023) is an optional extra: nothing here imports it until a
function needs it, and a missing install raises :class:`UserError` naming the fix.

* :func:`convert` writes ``train.beton`` / ``val.beton`` / ``test.beton`` plus ``meta.json``.
  3-channel images go into an ``RGBImageField`` (raw by default, which round-trips exactly;
  ``jpeg=True`` for large images, lossy); other channel counts (greyscale) go into an
  ``NDArrayField`` of shape (H, W, C), also exact. Labels are an ``IntField``.
* :class:`FFCVLoader` has :class:`fastfair.data.loaders.DeviceLoader`'s interface and output:
  ``(x float32 in [0, 1] on device, y int64)``, ``set_epoch``, ``len`` with drop_last for
  training. FFCV decodes uint8 batches on CPU threads and copies them to the device; the
  shuffle and the augmentation use DeviceLoader's own generator and
  :func:`fastfair.data.loaders.random_crop_flip` on the device, so with the same seed an FFCV run sees
  exactly the batches a device-loader run sees (same order, same crops and flips).
  ``augment="ffcv"`` uses FFCV's CPU ops instead (``RandomTranslate``, ``RandomHorizontalFlip``:
  the same distribution, but numba's per-thread RNG cannot be seeded, so not reproducible).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from fastfair.data.datasets import DATASETS, load
from fastfair.data.datasets import split as split_bundle  # `split` here names a loader's split (train, test)
from fastfair.data.loaders import LOADERS, random_crop_flip
from fastfair.errors import UserError, WriteError
from fastfair.rundir import check_space, file_sha256, notice, read_json, replacing, write_json_atomic

INSTALL_HINT = (
    "the FFCV loader needs the optional extra: on Debian/Ubuntu run "
    "`apt-get install -y libopencv-dev libturbojpeg0-dev pkg-config` (FFCV compiles a C extension "
    "against them), then `pip install 'fastfair[ffcv]'`; see docs/ffcv.md. Or use --loader device"
)
ORDERS = ("random", "quasi_random", "sequential")
AUGMENTS = ("device", "ffcv")
META = "meta.json"
FORMAT_VERSION = 1
FFCV_PAGE = 8 << 20  # DatasetWriter's default page: each worker may leave one partly filled in the file


def _ffcv() -> SimpleNamespace:
    """Import the FFCV pieces lazily; a missing or broken install becomes a UserError."""
    try:
        # used through locals() in the return below, hence the noqa: F401
        from ffcv.fields import IntField, NDArrayField, RGBImageField  # noqa: F401
        from ffcv.fields.basics import IntDecoder  # noqa: F401
        from ffcv.fields.decoders import NDArrayDecoder, SimpleRGBImageDecoder  # noqa: F401
        from ffcv.loader import Loader, OrderOption  # noqa: F401
        from ffcv.reader import Reader  # noqa: F401
        from ffcv.transforms import RandomHorizontalFlip, RandomTranslate, ToDevice, ToTensor  # noqa: F401
        from ffcv.writer import DatasetWriter  # noqa: F401
    except ImportError as err:  # ffcv itself, or cv2 / numba / its C extension's libraries
        raise UserError(f"{INSTALL_HINT} (import failed: {err})") from None
    return SimpleNamespace(**{k: v for k, v in locals().items() if k != "err"})


def available() -> bool:
    try:
        _ffcv()
    except UserError:
        return False
    return True


class _Samples:
    """Indexable (image HxWxC uint8, label) pairs for FFCV's writer (picklable: plain arrays)."""

    def __init__(self, x: np.ndarray, y: np.ndarray):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])


def _to_numpy(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
    y = y.numpy() if isinstance(y, torch.Tensor) else np.asarray(y)
    if x.dtype != np.uint8 or x.ndim != 4:
        raise UserError(f"convert needs uint8 NCHW images, got {x.dtype} of shape {tuple(x.shape)}")
    if len(x) != len(y):
        raise UserError(f"{len(x)} images but {len(y)} labels")
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)), y.astype(np.int64)


def convert(splits: dict, out_dir: str | Path, *, jpeg: bool = False, jpeg_quality: int = 90,
            num_workers: int | None = None, meta: dict | None = None) -> dict[str, Path]:
    """Write each ``name -> (x uint8 NCHW, y)`` split to ``out_dir/name.beton``; returns the paths.

    Raw storage (the default) reads back bit-identical images and labels in the source order.
    ``jpeg=True`` stores RGB images as JPEG at ``jpeg_quality`` (smaller files for large images;
    lossy, so not for 32x32 data). ``meta`` (data set name, classes, ...) goes into meta.json
    next to the files, with the image shape and storage format.
    """
    f = _ffcv()
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    workers = num_workers or min(8, os.cpu_count() or 1)
    if not jpeg:  # a write failing in FFCV's worker processes hangs its writer: a disk too small is said first
        raw = sum(np.asarray(x).size for x, _ in splits.values())  # uint8: a byte a value
        check_space(out, raw + len(splits) * (workers + 1) * FFCV_PAGE, "the .beton files")
    paths, info, shape = {}, {}, None
    with contextlib.ExitStack() as written:  # each file replaces its old one once every split is written
        for name, (x, y) in splits.items():
            xs, ys = _to_numpy(x, y)
            h, w, c = xs.shape[1:]
            if shape is not None and shape != (c, h, w):
                raise UserError(f"split {name} has images of shape {(c, h, w)}, others {shape}")
            shape = (c, h, w)
            if len(ys) == 0:  # e.g. val_per_class = 0: nothing to write, FFCV cannot hold an empty file
                info[name] = {"file": None, "n": 0}
                continue
            if c == 3:
                image = f.RGBImageField(write_mode="jpg" if jpeg else "raw", jpeg_quality=jpeg_quality)
            elif jpeg:
                raise UserError(f"--jpeg needs 3-channel (RGB) images; these have {c} channel(s). Store them raw")
            else:
                image = f.NDArrayField(np.dtype("uint8"), (h, w, c))
            path = out / f"{name}.beton"
            # FFCV writes a file of its own: to a temporary one, so a full disk is one line and the old file stays
            tmp = written.enter_context(replacing(path))
            writer = f.DatasetWriter(str(tmp), {"image": image, "label": f.IntField()}, num_workers=workers)
            writer.from_indexed_dataset(_Samples(xs, ys))
            paths[name] = path
            info[name] = {"file": path.name, "n": int(len(ys)), "sha256": file_sha256(tmp)}
        # meta.json names each file's SHA-256 (a .beton is FFCV's format, with no room for it), so it goes before
        # the files are replaced and comes back after: a crash between leaves no meta.json, which says to convert
        # again, rather than a meta.json whose checksums make good files look damaged
        (out / META).unlink(missing_ok=True)
    record = {
        "format": FORMAT_VERSION,
        "shape": list(shape) if shape else None,
        "image_field": "rgb" if shape and shape[0] == 3 else "ndarray",
        "jpeg": bool(jpeg),
        "jpeg_quality": int(jpeg_quality) if jpeg else None,
        "splits": info,
        **(meta or {}),
    }
    write_json_atomic(record, out / META, indent=2)
    for name, path in paths.items():  # hashed as they were written: their first open need not read them again
        _record_verified(path, info[name]["sha256"], _stamp(path))
    return paths


def convert_dataset(name: str, data_dir: str | Path | None, out_dir: str | Path, *,
                    val_per_class: int | None = None, jpeg: bool = False, jpeg_quality: int = 90,
                    num_workers: int | None = None) -> dict[str, Path]:
    """Load a registered data set, carve CFA's validation split and write all three splits."""
    spec = DATASETS.get(name)
    if spec.loader == "folder":  # its bundle holds file indices, not images, and 1.28M raw images would not fit
        raise UserError(f"{name} is streamed from its image files by the folder loader (its default); "
                        "fastfair data convert writes data sets that fit in memory. Train without --loader ffcv")
    vpc = spec.val_per_class if val_per_class is None else val_per_class
    bundle = load(name, data_dir)
    mean, std = bundle.mean_std()
    meta = {"dataset": name, "source": bundle.name, "val_per_class": vpc, "classes": list(bundle.classes),
            "mean": mean, "std": std}
    return convert(split_bundle(bundle, vpc), out_dir, jpeg=jpeg, jpeg_quality=jpeg_quality,
                   num_workers=num_workers, meta=meta)


def read_meta(beton_dir: str | Path) -> dict:
    path = Path(beton_dir).expanduser() / META
    if not path.is_file():
        raise UserError(f"{path} not found: make the .beton files with "
                        f"`fastfair data convert --dataset D --out {beton_dir}`")
    return read_json(path, f"convert again: fastfair data convert --dataset D --out {beton_dir}")


def verify_beton(path: Path, full: bool = False) -> None:
    """Refuse a ``.beton`` whose bytes are not those :func:`convert` wrote: its SHA-256 against the one ``meta.json``
    beside it names. Files converted before meta.json held checksums (or without a meta.json) are not checked.

    Hashing reads the whole file (minutes for an ImageNet .beton), so it is done once: the file's size, mtime,
    inode and device when its hash matched go into a checksummed sidecar (``train.beton.verified.json``), and an
    open that finds them unchanged does not read the file. What this trades: bytes changed in place without a
    change of size or mtime (a disk's silent corruption, a writer that restores the mtime) are not seen at open;
    ``full`` (``fastfair data verify``) hashes the file whatever the sidecar says, and finds them. A copy or a new
    conversion is a new inode, hashed again."""
    if not (path.parent / META).is_file():
        return
    meta = read_meta(path.parent)
    want = {s.get("file"): s.get("sha256") for s in meta.get("splits", {}).values()}.get(path.name)
    if not want:
        return
    stamp = _stamp(path)  # before hashing: a file changed while it is read does not match it afterwards
    if not full and _verified(path) == {"file": path.name, "sha256": want, **stamp}:
        return
    if file_sha256(path) != want:
        raise UserError(f"{path} is damaged: its SHA-256 is not the one {path.parent / META} names (bytes changed "
                        f"after fastfair data convert wrote it); convert again: fastfair data convert --dataset "
                        f"{meta.get('dataset', 'D')} --out {path.parent}")
    _record_verified(path, want, stamp)


def _verified_file(path: Path) -> Path:
    return path.with_name(path.name + ".verified.json")


def _stamp(path: Path) -> dict:
    """What changes when a file is rewritten, replaced or copied: size, mtime, inode and device."""
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "device": st.st_dev}


def _verified(path: Path) -> dict | None:
    """The sidecar's record of the file's last full check; None when there is none or it is damaged (then the file
    is hashed again, which is all a damaged sidecar costs)."""
    sidecar = _verified_file(path)
    if not sidecar.is_file():
        return None
    try:
        return read_json(sidecar)
    except UserError as err:
        notice(f"{err}; {path.name} is hashed again")
        return None


def _record_verified(path: Path, sha256: str, stamp: dict) -> None:
    """Write the sidecar of a file whose hash matched; a folder that cannot take it (read-only data) costs a full
    hash at every open, said once per open."""
    try:
        write_json_atomic({"file": path.name, "sha256": sha256, **stamp}, _verified_file(path))
    except WriteError as err:
        notice(f"{err}; so {path.name} is hashed in full at every open")


def check_meta(beton_dir: str | Path, *, dataset: str | None = None, val_per_class: int | None = None,
               split: str | None = None, n: int | None = None) -> dict:
    """meta.json, after checking the files hold this data set, validation size and split size."""
    meta = read_meta(beton_dir)
    redo = (f"convert again: fastfair data convert --dataset {dataset or meta.get('dataset', 'D')} "
            f"--out {beton_dir}" + (f" --val-per-class {val_per_class}" if val_per_class is not None else ""))
    for key, want in (("dataset", dataset), ("val_per_class", val_per_class)):
        if want is not None and key in meta and meta[key] != want:
            raise UserError(f"{beton_dir} holds {key}={meta[key]!r} but the run asks for {key}={want!r}; {redo}")
    if split is not None and n is not None:
        have = meta.get("splits", {}).get(split, {}).get("n")
        if have != n:
            raise UserError(f"{beton_dir}: the {split} split has {have} images in meta.json but {n} in the "
                            f"data set as the run loads it (another --data-dir?); {redo}")
    return meta


class _FixedOrder:
    """Stands in for FFCV's TraversalOrder: hands the loader the permutation we computed."""

    def __init__(self, n: int):
        self.order = np.arange(n, dtype=np.uint64)

    def sample_order(self, epoch: int) -> np.ndarray:
        return self.order


class FFCVLoader:
    """A ``.beton`` split as ``(x in [0,1] float32 on device, y int64)`` batches, like DeviceLoader.

    ``order``: ``random`` (default for training) draws the permutation from the same generator
    and seed as DeviceLoader; ``quasi_random`` is FFCV's page-local shuffle (reads less from disk
    when the file does not fit in RAM; use with ``os_cache=False``), seeded per epoch;
    ``sequential`` (default for evaluation) keeps the file order. ``os_cache=True`` lets the OS
    page cache hold the file (memory-mapped); False makes FFCV read pages itself.
    Training drops the last partial batch (``len = n // batch_size``); evaluation keeps it.
    """

    def __init__(self, beton_path: str | Path, batch_size: int, *, device, train: bool,
                 crop_padding: int = 0, flip: bool = False, seed: int = 0, channels_last: bool = False,
                 os_cache: bool = True, order: str | None = None, num_workers: int | None = None,
                 augment: str = "device", batches_ahead: int = 3, crop_mode: str = "zeros"):
        f = _ffcv()
        path = Path(beton_path).expanduser()
        if not path.is_file():
            raise UserError(f"{path} not found: make it with `fastfair data convert --dataset D --out {path.parent}`")
        verify_beton(path)
        order = order or ("random" if train else "sequential")
        if order not in ORDERS:
            raise UserError(f"data.order must be one of {', '.join(ORDERS)}; got {order!r}")
        if augment not in AUGMENTS:
            raise UserError(f"augment must be one of {', '.join(AUGMENTS)}; got {augment!r}")
        if train and augment == "ffcv" and crop_padding and crop_mode != "zeros":
            raise UserError(f"data.crop_mode={crop_mode!r} needs augment='device': FFCV's RandomTranslate pads "
                            "with zeros")
        self.path = path
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.train = train
        self.crop_padding, self.flip, self.crop_mode = crop_padding, flip, crop_mode
        self.seed = seed
        self.order = order
        self.augment = augment
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.gen = torch.Generator(device=self.device)

        image_field = f.Reader(str(path)).handlers["image"]
        decoder = f.SimpleRGBImageDecoder() if isinstance(image_field, f.RGBImageField) else f.NDArrayDecoder()
        to_dev = [f.ToDevice(self.device, non_blocking=True)] if self.device.type != "cpu" else []
        image_ops = [decoder]
        if train and augment == "ffcv":
            image_ops += ([f.RandomTranslate(crop_padding)] if crop_padding else []) + \
                         ([f.RandomHorizontalFlip(0.5)] if flip else [])
        pipelines = {"image": image_ops + [f.ToTensor()] + to_dev,
                     "label": [f.IntDecoder(), f.ToTensor()] + to_dev}
        ffcv_order = {"random": f.OrderOption.SEQUENTIAL,  # replaced by _FixedOrder below
                      "quasi_random": f.OrderOption.QUASI_RANDOM,
                      "sequential": f.OrderOption.SEQUENTIAL}[order]
        threads = torch.get_num_threads()  # FFCV sets torch's thread count to its own: put it back
        self.loader = f.Loader(str(path), batch_size=batch_size, num_workers=num_workers or os.cpu_count() or 1,
                               os_cache=os_cache, order=ffcv_order, seed=seed * 100_003, pipelines=pipelines,
                               drop_last=train, batches_ahead=batches_ahead)
        torch.set_num_threads(threads)
        self.n = int(self.loader.reader.num_samples)
        if order == "random":
            self._fixed = _FixedOrder(self.n)
            self.loader.traversal_order = self._fixed
        elif order == "quasi_random":
            # FFCV shuffles its page table in place, so epoch e's order would depend on the epochs
            # before it; restoring the table each epoch makes it a function of (seed, epoch) alone
            self._pages = self.loader.traversal_order.page_to_samples_array.copy()
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.gen.manual_seed(self.seed * 100_003 + epoch)
        self.loader.next_epoch = epoch  # FFCV's quasi-random order is a function of (seed, epoch)

    def __len__(self) -> int:
        return self.n // self.batch_size if self.train else -(-self.n // self.batch_size)

    def __iter__(self):
        if self.order == "random":
            # DeviceLoader's shuffle: same generator, same call, so the same permutation
            perm = torch.randperm(self.n, device=self.device, generator=self.gen)
            self._fixed.order = perm.cpu().numpy().astype(np.uint64)
        elif self.order == "quasi_random":
            self.loader.traversal_order.page_to_samples_array[:] = self._pages
        augment_here = self.train and self.augment == "device"
        threads = torch.get_num_threads()
        batches = iter(self.loader)
        torch.set_num_threads(threads)
        for xb, yb in batches:
            # FFCV hands out views of buffers it reuses a few batches later: every path below copies
            xb = xb.permute(0, 3, 1, 2)  # NHWC uint8 -> NCHW view
            if augment_here:
                xb = random_crop_flip(xb, self.crop_padding, self.flip, self.gen, self.crop_mode)
            xb = xb.float().div_(255).contiguous(memory_format=self.memory_format)
            yield xb, yb.reshape(-1).to(torch.int64, copy=True)


def loader_for(beton_dir: str | Path, split: str, batch_size: int, *, device, train: bool,
               crop_padding: int = 0, flip: bool = False, seed: int = 0, channels_last: bool = False,
               os_cache: bool = True, order: str | None = None, num_workers: int | None = None,
               augment: str = "device", crop_mode: str = "zeros") -> FFCVLoader:
    """The loader for ``beton_dir/<split>.beton`` (what a loader registry calls for ``--loader ffcv``)."""
    path = Path(beton_dir).expanduser() / f"{split}.beton"
    if not path.is_file():
        raise UserError(f"{path} not found: make the .beton files with "
                        f"`fastfair data convert --dataset D --out {beton_dir}`")
    return FFCVLoader(path, batch_size, device=device, train=train, crop_padding=crop_padding, flip=flip,
                      seed=seed, channels_last=channels_last, os_cache=os_cache, order=order,
                      num_workers=num_workers, augment=augment, crop_mode=crop_mode)


@LOADERS.register("ffcv", "FFCV .beton files (fastfair data convert); same batches as device; needs fastfair[ffcv]")
def _ffcv_loader(split: str, x: torch.Tensor, y: torch.Tensor, batch_size: int, *, beton_dir: str = "",
                 dataset: str | None = None, val_per_class: int | None = None, **kw):
    if not beton_dir:
        raise UserError("--loader ffcv needs --beton-dir DIR (data.beton_dir), made by "
                        "`fastfair data convert --dataset D --out DIR`")
    check_meta(beton_dir, dataset=dataset, val_per_class=val_per_class, split=split, n=len(y))
    return loader_for(beton_dir, split, batch_size, **kw)
