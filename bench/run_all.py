"""Run the whole benchmark suite, one bench after another, each in its own process.

    python bench/run_all.py                  # GPU, full sizes: results in bench/results/
    python bench/run_all.py --smoke          # any device, tiny sizes
    python bench/run_all.py --with-bf16-check

Runs bench_training, bench_mfu, bench_eval, bench_kernels and bench_loaders (each is called with --smoke
when given and --out); the bf16 robustness check (investigations/check_bf16_robustness.py) trains real models,
so it runs only when asked. Exits non-zero if any bench failed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
SUITE = ["bench_training.py", "bench_mfu.py", "bench_eval.py", "bench_kernels.py", "bench_loaders.py"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", type=Path, default=BENCH / "results")
    p.add_argument("--with-bf16-check", action="store_true", help="also run investigations/check_bf16_robustness.py")
    args = p.parse_args(argv)
    scripts = SUITE + (["investigations/check_bf16_robustness.py"] if args.with_bf16_check else [])
    failed = []
    for name in scripts:
        cmd = [sys.executable, str(BENCH / name), "--out", str(args.out)] + (["--smoke"] if args.smoke else [])
        print(f"== {' '.join(cmd)}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd, cwd=BENCH.parent)
        print(f"== {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.perf_counter() - t0:.0f} s",
              flush=True)
        if rc:
            failed.append(name)
    print("all benches ran" if not failed else f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
