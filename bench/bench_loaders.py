"""Loader throughput without a model: images/s of the device loader, FFCV, and a torch DataLoader.

All three yield training batches as fastfair uses them: float32 in [0, 1] on the device, after a
random crop of the 4-pixel zero-padded image and a horizontal flip (p = 0.5).

* ``device``: :class:`fastfair.data.DeviceLoader` (the whole split on the device, augmented there).
* ``ffcv``: :class:`fastfair.data.ffcv.FFCVLoader` (FFCV decodes on CPU threads, augmentation on
  the device: the same batches as ``device``); ``ffcv-cpu-aug``: FFCV's own RandomTranslate and
  RandomHorizontalFlip on the CPU threads (skipped by ``--smoke``: numba compiles them for ~15 s).
* ``torch``: a torchvision-style pipeline: CPU uint8 tensors, ``DataLoader`` workers applying
  ``transforms.v2.RandomCrop(padding=4)`` + ``RandomHorizontalFlip`` per image, pinned memory on CUDA.

One untimed warm-up epoch (FFCV compiles its pipeline then), then ``--epochs`` timed epochs.
Prints a Markdown table and writes JSON under bench/results/. ``--smoke``: tiny sizes, CPU, <30 s.

    python bench/bench_loaders.py                      # 50k synthetic CIFAR-shaped images
    python bench/bench_loaders.py --data ../shared/data/cifar10-subset.npz
    python bench/bench_loaders.py --smoke
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from fastfair import data  # noqa: E402
from fastfair.data import ffcv

RESULTS = Path(__file__).resolve().parent / "results"


class _Augmented(torch.utils.data.Dataset):
    def __init__(self, x, y, padding: int):
        from torchvision.transforms import v2

        self.x, self.y = x, y
        self.tf = v2.Compose([v2.RandomCrop(x.shape[-1], padding=padding), v2.RandomHorizontalFlip()])

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.tf(self.x[i]), self.y[i]


class TorchLoader:
    """The torchvision way: per-image CPU transforms in worker processes, then to the device."""

    def __init__(self, x, y, batch_size, *, device, workers, padding=4, seed=0):
        self.device = torch.device(device)
        self.dl = torch.utils.data.DataLoader(
            _Augmented(x, y, padding), batch_size=batch_size, shuffle=True, drop_last=True,
            num_workers=workers, pin_memory=self.device.type == "cuda", persistent_workers=workers > 0,
            generator=torch.Generator().manual_seed(seed))

    def __len__(self):
        return len(self.dl)

    def __iter__(self):
        for xb, yb in self.dl:
            xb = xb.to(self.device, non_blocking=True).float().div_(255)
            yield xb, yb.to(self.device, non_blocking=True)


def _time(loader, epochs: int, device: torch.device) -> dict:
    def epoch():
        n = 0
        for xb, _ in loader:
            n += len(xb)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return n

    t0 = time.perf_counter()
    epoch()  # warm-up: compilation, worker start-up, page cache
    warm = time.perf_counter() - t0
    t0 = time.perf_counter()
    n = sum(epoch() for _ in range(epochs))
    dt = time.perf_counter() - t0
    return {"images": n, "seconds": dt, "images_per_s": n / dt, "warmup_s": warm}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="synthetic", help="'synthetic' or an npz file (x_train uint8 NCHW)")
    ap.add_argument("--n", type=int, default=50_000, help="images (synthetic, or the first n of the npz)")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--epochs", type=int, default=3, help="timed epochs after one warm-up epoch")
    ap.add_argument("--workers", type=int, default=min(8, os.cpu_count() or 1),
                    help="torch DataLoader workers and FFCV threads")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--loaders", default="device,ffcv,ffcv-cpu-aug,torch")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU (<30 s)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.batch_size, args.epochs, args.device = 1024, 128, 1, "cpu"
        args.workers = min(args.workers, 2)
        args.loaders = ",".join(x for x in args.loaders.split(",") if x != "ffcv-cpu-aug")
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)

    if args.data == "synthetic":
        g = torch.Generator().manual_seed(0)
        x = torch.randint(0, 256, (args.n, 3, 32, 32), generator=g, dtype=torch.uint8)
        y = torch.randint(0, 10, (args.n,), generator=g)
    else:
        b = data.load("npz", args.data)
        x, y = b.x_train[:args.n], b.y_train[:args.n]
    names = [s for s in args.loaders.split(",") if s]
    has_ffcv = ffcv.available()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        beton = None
        if has_ffcv and any(s.startswith("ffcv") for s in names):
            t0 = time.perf_counter()
            beton = ffcv.convert({"train": (x, y)}, tmp, num_workers=args.workers)["train"]
            rows["ffcv convert"] = {"seconds": time.perf_counter() - t0}
        for name in names:
            kw = dict(device=device, train=True, crop_padding=4, flip=True, seed=0)
            if name == "device":
                loader = data.DeviceLoader(x, y, args.batch_size, **kw)
            elif name in ("ffcv", "ffcv-cpu-aug"):
                if not has_ffcv:
                    rows[name] = {"skipped": "ffcv not installed (pip install 'fastfair[ffcv]')"}
                    continue
                loader = ffcv.FFCVLoader(beton, args.batch_size, num_workers=args.workers,
                                                augment="ffcv" if name == "ffcv-cpu-aug" else "device", **kw)
            elif name == "torch":
                loader = TorchLoader(x, y, args.batch_size, device=device, workers=args.workers)
            else:
                raise SystemExit(f"unknown loader {name!r}; known: device, ffcv, ffcv-cpu-aug, torch")
            rows[name] = _time(loader, args.epochs, device)
            del loader

    if device.type == "cuda":
        dev_name = torch.cuda.get_device_name(device)
    else:
        dev_name = platform.processor() or platform.machine()
    env = {"device": f"{device.type}: {dev_name}", "torch": torch.__version__, "cpus": os.cpu_count(),
           "torch_threads": torch.get_num_threads(), "workers": args.workers, "n": len(y),
           "batch_size": args.batch_size, "epochs": args.epochs, "data": args.data, "smoke": args.smoke}
    if has_ffcv:
        from importlib.metadata import version

        env["ffcv"] = version("ffcv")  # ffcv.__version__ says 0.0.3rc1 in the 1.0.2 release
    print(f"\nLoader throughput: {env['device']}, torch {env['torch']}, {env['cpus']} CPUs, "
          f"{env['workers']} workers, {env['n']} images 3x32x32, batch {env['batch_size']}, crop 4 + flip\n")
    print("| loader | images/s | timed s | warm-up s |")
    print("| --- | ---: | ---: | ---: |")
    for name, r in rows.items():
        if "skipped" in r:
            print(f"| {name} | skipped: {r['skipped']} | | |")
        elif "images_per_s" in r:
            print(f"| {name} | {r['images_per_s']:,.0f} | {r['seconds']:.2f} | {r['warmup_s']:.2f} |")
        else:
            print(f"| {name} | (one-off) | {r['seconds']:.2f} | |")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = out / f"loaders-{device.type}-{'smoke-' if args.smoke else ''}{stamp}.json"
    path.write_text(json.dumps({"env": env, "results": rows}, indent=2) + "\n")
    print(f"\nsaved {path}")
    return {"env": env, "results": rows}


if __name__ == "__main__":
    main()
