"""Where oneDNN's AVX2 1x1-convolution weight gradient (``jit_avx2_1x1_convolution_bwd_weights``) hangs or crashes
(issue 57, item 4; findings in docs/reliability.md, "CPU training").

    python bench/investigations/onednn_avx2_hang.py                  # the table, 5 runs per row
    python bench/investigations/onednn_avx2_hang.py --repeats 10 --timeout 20
    python bench/investigations/onednn_avx2_hang.py --isa native     # this CPU's own ISA (AVX-512 here)
    python bench/investigations/onednn_avx2_hang.py --cost           # what avoiding the kernel costs a training step

Each run is a fresh process (the failure depends on the heap's layout, so one process says little) that takes
the weight gradient of one bias-free 1x1 convolution, ``--steps`` times, under ``ONEDNN_MAX_CPU_ISA=AVX2
ATEN_CPU_CAPABILITY=avx2`` (what an AVX2-only CPU runs, emulated), and compares it with ATen's own gradient
(oneDNN off). A run is ``ok`` (finished, gradient equal), ``wrong`` (finished, gradient differs), ``hang``
(killed ``--timeout`` seconds after its setup, for gradients that take milliseconds) or the signal that ended it
(``SIGSEGV``, ``SIGABRT`` from glibc's malloc checks). The rows vary
one thing at a time from the trigger found first: preact-resnet18 width 4's first shortcut (4 -> 8 channels,
stride 2, 32x32 images, batch 50) in channels-last memory, torch's default threads on 2 cores.

``--cost``: images/s of fastfair's fp32 training step (the Trainer's own) of the test fixture's preact-resnet18
width 4 (PGD-AT, one attack step, batch 50, random CIFAR-shaped images) with oneDNN on and off, in channels-last and
NCHW memory (on the emulated AVX2 CPU, oneDNN in channels-last is left out: it hangs); one process, the
configurations' windows of ``--steps`` steps interleaved ``--repeats`` times, the median reported with the process's
CPU milliseconds per image (the number to read on a loaded machine).
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

# one run: n, c_in, c_out, size, stride, layout ("cl" or "nchw"), threads, steps
PROBE = r"""
import sys, torch
n, cin, cout, size, stride, layout, threads, steps = sys.argv[1:]
n, cin, cout, size, stride, threads, steps = map(int, (n, cin, cout, size, stride, threads, steps))
torch.set_num_threads(threads)
torch.manual_seed(0)
conv = torch.nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
x = torch.randn(n, cin, size, size)
if layout == "cl":
    conv, x = conv.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
def grad():
    conv.weight.grad = None
    conv(x).square().sum().backward()
    return conv.weight.grad.clone()
with torch.backends.mkldnn.flags(enabled=False):
    expected = grad()
print("ready", flush=True)  # the timeout counts from here: importing torch on a loaded machine is slow, not hung
for _ in range(steps):
    got = grad()
print("ok" if torch.allclose(got, expected, rtol=1e-4, atol=1e-3) else "wrong")
"""

# one process: the fixture's training step in each (oneDNN, channels_last) of argv, their windows interleaved;
# prints {"oneDNN/channels_last": [[images/s, CPU ms/image], ...]}
COST = r"""
import json, sys, tempfile, time, torch
from fastfair import config
from fastfair.training.trainer import Trainer
npz, windows, steps, *pairs = sys.argv[1:]
def trainer(layout):
    cfg = config.resolve(flags={"method.name": "pgd-at", "model.name": "preact-resnet18", "data.dataset": "npz"},
                         sets={"data.data_dir": npz, "model.width": 4, "data.val_per_class": 5, "data.batch_size": 50,
                               "attack.steps": 1, "train.amp": "off", "train.device": "cpu", "train.progress": False,
                               "model.channels_last": layout})
    t = Trainer(cfg, tempfile.mkdtemp(), quiet=True)
    return t, [b for _, b in zip(range(int(steps)), t.train_loader)]
trainers = {layout: trainer(layout) for layout in {p.split("/")[1] for p in pairs}}
seen = {p: [] for p in pairs}
for w in range(int(windows) + 1):
    for pair in pairs:
        onednn, layout = pair.split("/")
        t, batches = trainers[layout]
        with torch.backends.mkldnn.flags(enabled=onednn == "on"):
            wall, cpu = time.perf_counter(), time.process_time()
            for x, y in batches:
                t.train_step(x, y)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if w:  # the first round warms each up
            n = sum(len(y) for _, y in batches)
            seen[pair].append([n / wall, 1000 * cpu / n])
print(json.dumps(seen))
"""
# what each ISA can run: the emulated AVX2 CPU hangs in oneDNN with channels_last, so that pair is left out there
PAIRS = {"avx2": ["off/on", "on/off", "off/off"], "native": ["on/on", "off/on", "on/off"]}

TRIGGER = dict(n=50, cin=4, cout=8, size=32, stride=2, layout="cl", threads=2)
# one change from the trigger per row
ROWS = (
    {}, {"threads": 1}, {"layout": "nchw"}, {"layout": "nchw", "threads": 1}, {"stride": 1},
    {"cin": 8, "cout": 16, "size": 16}, {"cin": 8, "cout": 16, "size": 16, "layout": "nchw"},
    {"cin": 16, "cout": 32, "size": 8}, {"cin": 8, "cout": 8}, {"cin": 16, "cout": 16}, {"n": 1},
    # oneDNN issue 6035's size, where AVX-512's kernel (--isa native) crashed too
    {"n": 32, "size": 128}, {"n": 32, "size": 128, "cin": 8, "cout": 16}, {"n": 32, "size": 128, "cin": 16, "cout": 16},
)


def run_once(row: dict, steps: int, timeout: float, env: dict) -> str:
    args = [str(row[k]) for k in ("n", "cin", "cout", "size", "stride", "layout", "threads")] + [str(steps)]
    proc = subprocess.Popen([sys.executable, "-c", PROBE, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        ready = proc.stdout.readline().strip()  # setup done (or the process ended before)
        if ready == "ready":
            proc.wait(timeout=timeout)  # gradients of milliseconds each: waiting longer is a hang
        out, err = proc.communicate()
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "hang"
    if proc.returncode < 0:
        return signal.Signals(-proc.returncode).name
    if proc.returncode:
        last = (err.strip().splitlines() or ["?"])[-1]
        return "SIGABRT" if "Assertion" in err or "malloc" in err else f"exit {proc.returncode}: {last[:60]}"
    return out.strip()


def cost(args, env: dict) -> None:
    import json
    import statistics
    import tempfile

    import numpy as np

    npz = Path(tempfile.mkdtemp()) / "cifar-shaped.npz"
    rng = np.random.default_rng(0)
    np.savez(npz, x_train=rng.integers(0, 256, (700, 3, 32, 32), dtype=np.uint8), y_train=np.arange(700) % 10,
             x_test=rng.integers(0, 256, (60, 3, 32, 32), dtype=np.uint8), y_test=np.arange(60) % 10)
    r = subprocess.run([sys.executable, "-c", COST, str(npz), str(args.repeats), str(args.steps), *PAIRS[args.isa]],
                       env=env, capture_output=True, text=True, timeout=args.timeout)
    if r.returncode:
        raise SystemExit(r.stderr[-3000:])
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    print("| oneDNN | channels_last | images/s (median) | CPU ms/image (median) |")
    print("|---|---|---|---|")
    for pair, got in seen.items():
        onednn, layout = pair.split("/")
        print(f"| {onednn} | {layout} | {statistics.median(g[0] for g in got):.1f} | "
              f"{statistics.median(g[1] for g in got):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="fresh processes per row (default 5)")
    parser.add_argument("--timeout", type=float, default=20,
                        help="seconds of gradients before a run counts as hung (default 20; --cost: of the whole run)")
    parser.add_argument("--steps", type=int, default=5, help="weight gradients per process (default 5)")
    parser.add_argument("--cost", action="store_true", help="time fastfair's training step with oneDNN on and off")
    parser.add_argument("--isa", choices=("avx2", "native"), default="avx2",
                        help="avx2: emulate an AVX2-only CPU (default); native: this CPU's own ISA")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")}
    if args.isa == "avx2":
        env.update(ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    import torch  # only for the header: every probe is its own process

    if args.cost:
        print(f"# torch {torch.__version__}, {os.cpu_count()} cores, ISA {args.isa}, fp32, {args.repeats} interleaved "
              f"windows of {args.steps} steps, OMP_NUM_THREADS={env.get('OMP_NUM_THREADS', 'unset')}, load "
              f"average {os.getloadavg()[0]:.1f}")
        cost(args, env)
        print(f"# load average after: {os.getloadavg()[0]:.1f}")
        return

    print(f"# torch {torch.__version__}, {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"ISA {args.isa}, {args.repeats} runs per row of {args.steps} gradients, {args.timeout:g} s timeout")
    cols = ("n", "cin", "cout", "size", "stride", "layout", "threads")
    print("| " + " | ".join(cols) + " | outcomes |")
    print("|" + "---|" * (len(cols) + 1))
    for change in ROWS:
        row = {**TRIGGER, **change}
        seen = Counter(run_once(row, args.steps, args.timeout, env) for _ in range(args.repeats))
        said = ", ".join(f"{k} {v}/{args.repeats}" for k, v in seen.most_common())
        print("| " + " | ".join(str(row[c]) for c in cols) + f" | {said} |", flush=True)


if __name__ == "__main__":
    main()
