"""How long a user waits for ``fastfair --help`` and for a refused command's one error line (issue 57, item 6).

Each command runs ``--repeat`` times in a fresh ``python -m fastfair`` of the checkout ``--root``; per command the
median wall time, the median CPU time of the process (user + sys: on a busy machine the wall time grows with the
load, the CPU time much less, so it stands in for the wall time a quiet machine would take), whether torch was
imported (``-X importtime``) and the line it ended with. The load average is recorded beside them.

    python bench/cli_startup.py --label after                      # this checkout
    python bench/cli_startup.py --root ../main --label before      # another one, for the comparison

Writes bench/results/cli-startup-LABEL.json and .md. Imports nothing of fastfair or torch itself.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"

# what a user types, right or wrong: help and a listing answer; the others are refused with one error line
COMMANDS = (
    ("--help",),
    ("presets",),
    ("train", "--bogus"),
    ("eval", "runs/nosuch"),
    ("eval", "runs/nosuch", "--attacks", "aa", "--per-class", "20"),
    ("train", "--method", "nosuch"),
    ("train", "--set", "train.lrr=0.1"),
    ("train", "--set", "nosuch.key=1"),
    ("train", "--config", "demo", "--set", "train.amp=fp16"),
    ("train", "--epochs", "two"),
    ("tune", "--methods", "tradez"),
)


def run(root: Path, args: tuple[str, ...], importtime: bool = False) -> tuple[float, float,
                                                                            subprocess.CompletedProcess]:
    """(wall seconds, CPU seconds of the child, the finished process) of ``python -m fastfair ARGS`` in ``root``."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "100"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "fastfair", *args],
                          capture_output=True, text=True, env=env, cwd=root, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose fastfair runs (default: this one)")
    parser.add_argument("--label", required=True, help="names the result files: cli-startup-LABEL")
    parser.add_argument("--repeat", type=int, default=3)
    a = parser.parse_args()
    load_before = os.getloadavg()
    rows = []
    for args in COMMANDS:
        _, _, probe = run(a.root, args, importtime=True)
        torch = any(re.search(r"\|\s+torch$", line.rstrip()) for line in probe.stderr.splitlines())
        said = [line for line in probe.stderr.splitlines() if not line.startswith("import time:")]
        times = [run(a.root, args)[:2] for _ in range(a.repeat)]
        rows.append({"command": "fastfair " + " ".join(args), "exit_code": probe.returncode,
                     "wall_s": round(statistics.median(w for w, _ in times), 2),
                     "cpu_s": round(statistics.median(c for _, c in times), 2), "imports_torch": torch,
                     "said": (said[-1] if said else probe.stdout.strip().splitlines()[0])[:140]})
        row = rows[-1]
        print(f"{row['wall_s']:6.2f} s wall {row['cpu_s']:6.2f} s CPU  torch={torch!s:5}  {row['command']}", flush=True)
    commit = subprocess.run(["git", "-C", str(a.root), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    record = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "root": str(a.root), "commit": commit,
              "python": platform.python_version(), "cpus": os.cpu_count(), "repeat": a.repeat,
              "load_average_1m": [load_before[0], os.getloadavg()[0]], "commands": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"cli-startup-{a.label}.json"
    out.write_text(json.dumps(record, indent=1) + "\n")
    lines = [f"# CLI startup: {a.label} ({commit}, {record['when']})", "",
             f"{record['cpus']} CPUs, load average {load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the "
             f"end; median of {a.repeat} runs. CPU s (user + sys of the process) stands in for a quiet machine's "
             "wall time.", "", "| command | wall s | CPU s | torch imported | exit | ends with |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| `{r['command']}` | {r['wall_s']} | {r['cpu_s']} | {'yes' if r['imports_torch'] else 'no'} | "
              f"{r['exit_code']} | {r['said'].replace('|', '/')} |" for r in rows]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print(f"written: {out} and {out.with_suffix('.md').name}")


if __name__ == "__main__":
    main()
