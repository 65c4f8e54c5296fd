"""How many grid runs to put on one GPU: aggregate training images/s for K concurrent runs.

K separate processes (as ``fastfair grid --per-gpu K`` starts them) each build a real
:class:`fastfair.training.trainer.Trainer` (default: ResNet-18, PGD-AT with PGD-10, CIFAR-10-shaped random
data on the device), warm up, wait at a common barrier, then time the same number of training
steps. Aggregate images/s = all images of all K runs / (last end - first start).

    python bench/bench_concurrency.py                   # GPU: K = 1, 2, 4, 8; writes bench/results/
    python bench/bench_concurrency.py --smoke           # CPU check of the harness (tiny CNN, K = 1, 2)
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def synthetic_npz(folder: Path, n: int, size: int) -> Path:
    rng = np.random.default_rng(0)
    path = folder / "synthetic.npz"
    np.savez(path, x_train=rng.integers(0, 256, (n, 3, size, size), dtype=np.uint8),
             y_train=np.arange(n) % 10, x_test=np.zeros((10, 3, size, size), np.uint8), y_test=np.arange(10))
    return path


def worker(args, data: str, barrier, results, rank: int) -> None:
    import torch

    from fastfair import config
    from fastfair.training.trainer import Trainer

    sets = [f'model.name="{args.model}"', f'method.name="{args.method}"',
            f"data.batch_size={args.batch_size}", "data.val_per_class=1", f'train.device="{args.device}"',
            f"model.width={args.width}", f"attack.steps={args.attack_steps}", "train.progress=false"]
    cfg = config.resolve(None, {"data.dataset": "npz", "data.data_dir": data}, sets)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(cfg, out, quiet=True)
        sync = torch.cuda.synchronize if trainer.dev.type == "cuda" else (lambda: None)

        def steps(n):
            done = 0
            while done < n:
                for x, y in trainer.train_loader:
                    trainer.train_step(x, y)
                    done += 1
                    if done == n:
                        break
            sync()

        steps(args.warmup)
        barrier.wait()
        start = time.time()
        steps(args.steps)
        results.put({"rank": rank, "start": start, "end": time.time(), "images": args.steps * args.batch_size})


def measure(args, data: str, k: int) -> dict:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(k), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(args, data, barrier, results, r)) for r in range(k)]
    for p in procs:
        p.start()
    rows = [results.get() for _ in procs]
    for p in procs:
        p.join()
    wall = max(r["end"] for r in rows) - min(r["start"] for r in rows)
    per_run = [r["images"] / (r["end"] - r["start"]) for r in rows]
    return {"k": k, "aggregate_images_per_s": sum(r["images"] for r in rows) / wall,
            "per_run_images_per_s": float(np.mean(per_run)), "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="1,2,4,8")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--method", default="pgd-at")
    p.add_argument("--width", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--attack-steps", type=int, default=10)
    p.add_argument("--steps", type=int, default=50, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", default="cuda")
    p.add_argument("--smoke", action="store_true",
                   help="CPU: tiny CNN, 8x8 images, K = 1, 2, 3 steps; checks the harness")
    p.add_argument("--out", help="JSON file (default bench/results/concurrency-<gpu>.json on CUDA)")
    args = p.parse_args()
    size = 32
    if args.smoke:
        args.ks, args.model, args.device, args.batch_size, args.attack_steps = "1,2", "tiny-cnn", "cpu", 32, 2
        args.steps, args.warmup, args.width, size = 3, 1, 4, 8
    with tempfile.TemporaryDirectory() as tmp:
        data = str(synthetic_npz(Path(tmp), args.batch_size * 4 + 10, size))
        rows = []
        for k in map(int, args.ks.split(",")):
            rows.append(measure(args, data, k))
            r = rows[-1]
            print(f"K={k}: aggregate {r['aggregate_images_per_s']:.0f} img/s, "
                  f"per run {r['per_run_images_per_s']:.0f} img/s", flush=True)
    import torch

    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu"
    record = {"device": device, "torch": torch.__version__, "model": args.model, "method": args.method,
              "batch_size": args.batch_size, "attack_steps": args.attack_steps, "steps": args.steps, "results": rows}
    default_out = ROOT / "bench" / "results" / f"concurrency-{device.replace(' ', '_')}.json"
    out = args.out or (None if args.smoke else default_out)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=1))
        print(f"written: {out}")


if __name__ == "__main__":
    main()
