"""How fast the demo trains on a shared CPU at 1 and 2 threads, with OpenMP's waiting threads spinning (the default)
or sleeping (``OMP_WAIT_POLICY=PASSIVE``), on the machine as it is and with a CPU hog beside it (issue 57 item 4;
the choice it led to: docs/reliability.md, "CPU training").

    python bench/investigations/threads.py                 # 2 repeats; writes bench/results/threads-cpu.{md,json}
    python bench/investigations/threads.py --repeats 3 --windows 4 --steps 4

Each measurement is a fresh process (OpenMP reads its wait policy once, as torch loads it) with the demo's Trainer
(``--config demo``: ME-TRADES, tiny-cnn on digits, batch 64, fp32, ``train.amp=off`` so every CPU measures the same
thing) whose timed windows of ``--steps`` training steps alternate between ``torch.set_num_threads(1)`` and ``(2)``,
so a change in the machine's load hits both alike. The hog is one process per core spinning in Python, started
before and ended after the measurement. Reported: the median images/s over the windows of every repeat, per load,
wait policy and thread count, with the load average seen; the machine, torch and its OpenMP in the header.
``KMP_BLOCKTIME`` (Intel's OpenMP) is not measured: torch's Linux wheels ship GNU libgomp, which ignores it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"

# one process: windows of steps alternating 1 and 2 threads; prints {"1": [images/s, ...], "2": [...]}
MEASURE = r"""
import json, sys, tempfile, time, torch
from fastfair import config
from fastfair.training.trainer import Trainer
windows, steps = int(sys.argv[1]), int(sys.argv[2])
cfg = config.resolve("demo", sets={"train.amp": "off", "train.device": "cpu", "train.progress": False})
trainer = Trainer(cfg, tempfile.mkdtemp(), quiet=True)
batches = [b for _, b in zip(range(steps), trainer.train_loader)]
seen = {1: [], 2: []}
for w in range(windows + 1):
    for threads in (1, 2) if w % 2 else (2, 1):
        torch.set_num_threads(threads)
        t = time.perf_counter()
        for x, y in batches:
            trainer.train_step(x, y)
        if w:  # the first round warms both up
            seen[threads].append(sum(len(y) for _, y in batches) / (time.perf_counter() - t))
print(json.dumps(seen))
"""
HOG = "while True: pass"


def measure(policy: str, hog: bool, windows: int, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env["PYTHONPATH"] = str(ROOT)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(os.cpu_count() if hog else 0)]
    try:
        load = os.getloadavg()[0]
        r = subprocess.run([sys.executable, "-c", MEASURE, str(windows), str(steps)], env=env, capture_output=True,
                           text=True, timeout=1800)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    return {"load_before": load, "load_after": os.getloadavg()[0], **json.loads(r.stdout.strip().splitlines()[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="processes per (load, policy) (default 2)")
    parser.add_argument("--windows", type=int, default=3, help="timed windows per thread count and process (3)")
    parser.add_argument("--steps", type=int, default=4, help="training steps per window (default 4)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder for threads-cpu.{md,json}")
    args = parser.parse_args()
    import torch

    head = {"time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "python": platform.python_version(),
            "torch": torch.__version__, "cpu": _cpu(), "cores": os.cpu_count(),
            "openmp": next((line.strip() for line in torch.__config__.parallel_info().splitlines()
                            if "OpenMP" in line and "ATen" not in line), ""),
            "torch_default_threads": torch.get_num_threads(),
            "settings": {"repeats": args.repeats, "windows": args.windows, "steps": args.steps}}
    runs = []
    for _ in range(args.repeats):
        for hog in (False, True):
            for policy in ("default", "PASSIVE"):
                t = time.time()
                runs.append({"hog": hog, "policy": policy, **measure(policy, hog, args.windows, args.steps)})
                print(f"# hog={hog} policy={policy}: {time.time() - t:.0f} s, load {runs[-1]['load_before']:.1f}",
                      file=sys.stderr, flush=True)
    rows = []
    for hog in (False, True):
        for policy in ("default", "PASSIVE"):
            mine = [r for r in runs if r["hog"] == hog and r["policy"] == policy]
            rows.append({"load": "+ hog on every core" if hog else "as it was", "policy": policy,
                         "load_average": f"{min(r['load_before'] for r in mine):.1f}-"
                                         f"{max(r['load_after'] for r in mine):.1f}",
                         **{f"threads_{n}": statistics.median(v for r in mine for v in r[str(n)]) for n in (1, 2)}})
    table = ["| machine load | OMP_WAIT_POLICY | load average | 1 thread images/s | 2 threads images/s |",
             "|---|---|---|---|---|"]
    table += [f"| {r['load']} | {r['policy']} | {r['load_average']} | {r['threads_1']:.0f} | {r['threads_2']:.0f} |"
              for r in rows]
    body = (f"# Demo training step at 1 and 2 threads (bench/investigations/threads.py)\n\n{head['time']}, "
            f"{head['cpu']}, {head['cores']} cores, Python {head['python']}, torch {head['torch']} "
            f"({head['openmp']}); median images/s of {args.repeats} processes x {args.windows} windows of "
            f"{args.steps} steps each.\n\n" + "\n".join(table) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "threads-cpu.json").write_text(json.dumps({"header": head, "rows": rows, "runs": runs}, indent=1))
    (args.out / "threads-cpu.md").write_text(body)
    print(body)


def _cpu() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
