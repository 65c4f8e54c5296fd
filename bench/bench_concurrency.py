"""How many runs to put on one GPU: aggregate training images/s of K concurrent runs, as ``fastfair grid --per-gpu K``
runs them (separate processes on one GPU); ``--per-gpu auto`` reads the curve (fastfair/scaleout/per_gpu.py).

The largest K of processes of one configuration (default: ResNet-18 PGD-10 AT at batch 128 with the CUDA defaults
the shipped figures set) compile at once (bench/pool.py; the compiled code of the plan-training part's same
configuration is in Inductor's caches by then), then the first K of them step together, for each K: aggregate
images/s = all images of the K runs / (last end - first start), the median of 3 windows.

    python bench/bench_concurrency.py                   # GPU: K = 1, 2, 4, 8; writes bench/results/
    python bench/bench_concurrency.py --smoke           # any device: tiny CNN, K = 1, 2 (CI)
"""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import bench_matrix, common  # noqa: E402
from bench.pool import Pool, Spec  # noqa: E402

COLUMNS = [("method", "method"), ("model", "model"), ("batch", "batch"), ("configuration", "configuration"),
           ("k", "K runs"), ("images_per_s", "aggregate img/s"), ("per_run_images_per_s", "img/s per run"),
           ("x_k1", "x K=1"), ("note", "note")]


def main(argv=None) -> None:
    p = common.base_parser(__doc__)
    p.add_argument("--ks", type=int, nargs="+", help="numbers of concurrent runs (default 1 2 4 8)")
    p.add_argument("--method")
    p.add_argument("--model")
    p.add_argument("--batch", type=int)
    p.add_argument("--steps", type=int, help="timed steps per run and window")
    p.add_argument("--warmup", type=int, help="untimed steps first (compilation, CUDA graphs' recording)")
    p.add_argument("--attack-steps", type=int)
    p.add_argument("--compile-deadline", type=float, help="seconds the runs have to compile, all at once")
    args = p.parse_args(argv)
    full = dict(ks=[1, 2, 4, 8], method="pgd-at", model="resnet18", batch=128, steps=10, warmup=4, attack_steps=10,
                compile_deadline=300.0)
    smoke = dict(ks=[1, 2], method="pgd-at", model="tiny-cnn", batch=16, steps=2, warmup=1, attack_steps=2,
                 compile_deadline=300.0)
    common.fill_defaults(args, full, smoke)
    args.width, args.workers = (8, 1) if args.smoke else (0, 4)
    args.image_shape = [3, 16, 16] if args.smoke else [3, 32, 32]
    args.train_images = 256 if args.smoke else common.CIFAR10_EPOCH
    dev = common.pick_device(args.device)
    graphs, wrapper = bench_matrix.defaults(dev)
    label = bench_matrix.label(graphs, wrapper)
    specs = [Spec(f"run {i}", args.method, args.model, args.batch, args.steps, bench_matrix.settings(graphs, wrapper))
             for i in range(max(args.ks))]
    base = dict(method=args.method, model=args.model, batch=args.batch, configuration=label, graphs=graphs,
                cpp_wrapper=wrapper)
    rows: list[dict] = []
    pool = Pool(specs, args, dev)
    try:
        status = pool.warm(args.compile_deadline)
        warm = [s.name for s in specs if status[s.name] == "warm"]
        for k in args.ks:
            if k > len(warm):
                rows.append({**base, "k": k, "images_per_s": None, "note": f"{len(warm)} of {max(args.ks)} runs "
                             f"compiled: {next(v for v in status.values() if v != 'warm')}"})
                continue
            try:
                windows = [pool.together(warm[:k], args.steps) for _ in range(common.REPEATS)]
            except RuntimeError as err:
                rows.append({**base, "k": k, "images_per_s": None, "note": str(err)})
                continue
            row = {**base, "k": k, **{key: statistics.median(w[key] for w in windows)
                                     for key in ("images_per_s", "per_run_images_per_s")}}
            one = next((r["images_per_s"] for r in rows if r["k"] == 1 and r["images_per_s"]), None)
            rows.append({**row, "x_k1": row["images_per_s"] / one if one else None})
            print(f"K={k}: aggregate {row['images_per_s']:,.0f} img/s, {row['per_run_images_per_s']:,.0f} per run",
                  flush=True)
    finally:
        pool.close()
    settings = {k: getattr(args, k) for k in ("ks", "method", "model", "batch", "steps", "warmup", "attack_steps",
                                              "compile_deadline", "width", "image_shape", "train_images")}
    paths = common.save("concurrency", head=common.header(dev), settings=settings, rows=rows, out_dir=args.out,
                        smoke=args.smoke, tag=args.tag, body=common.markdown_table(rows, COLUMNS))
    print(paths[1].read_text())
    print("written:", *paths)


if __name__ == "__main__":
    main()
