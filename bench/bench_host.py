"""Where the host's time goes in fastfair's default training step.

The first GPU lease found the default step host-bound: 46.8 ms per step on an H200 against about 10 ms of
GPU work, for the 2,436 launches bench/lease/gpu_codegen.py counts in its generated code. This bench splits
that host time. It profiles ``--steps`` steps (after ``--warmup``) with torch.profiler and gives every
microsecond of host time to the innermost profiled region it was spent in (each event's self time):

- Dynamo: entering a compiled frame and checking its guards (``Torch-Compiled Region``,
  ``TorchDynamo Cache Lookup``);
- AOTAutograd: its runtime wrappers around a compiled forward or backward (``CompiledFunction...``);
- Inductor's wrapper: the generated Python ``call`` that allocates buffers and issues the kernels
  (``## Call CompiledFxGraph``), less what it calls;
- Triton launcher: Inductor's launch of one Triton kernel (``triton_*``), less the CUDA API call;
- CUDA API: the runtime and driver calls (``cudaLaunchKernel``, ``cuLaunchKernel``, copies, ...), GPU only;
- ATen ops: the dispatcher's ops, cuDNN and cuBLAS calls and the eager ops outside the graphs;
- autograd engine, optimizer, other profiled regions;
- outside any profiled region: fastfair's own Python (the step, the method, the counters) and the
  interpreter, on the main thread, less the time another thread (autograd's device thread) was busy.

Also counted per step: kernel-launch API calls (the launches the GPU saw, against gpu_codegen's count).
The profiler adds its own cost to every region, so the profiled step is slower than the unprofiled one
timed beside it; the split is of the profiled steps' own time (their markers' durations), which their wall time
exceeds by the loop between them, any moment the OS gave the core to another process there, and on a GPU the
final wait for the device.

    python bench/bench_host.py                 # GPU: ResNet-18 PGD-10 AT and TRADES, batch 128
    python bench/bench_host.py --smoke         # any device: tiny CNN, compiled (CI)
"""
from __future__ import annotations

import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench import common  # noqa: E402
from fastfair import config  # noqa: E402

# (category, pattern on the event's name), first match wins
CATEGORIES = (
    ("Dynamo (frame, guards)", re.compile(r"^(Torch-Compiled Region|TorchDynamo Cache Lookup)")),
    ("AOTAutograd wrappers", re.compile(r"^CompiledFunction")),
    ("Inductor's wrapper", re.compile(r"^## Call CompiledFxGraph")),
    ("Triton launcher", re.compile(r"^triton_")),
    ("CUDA API", re.compile(r"^cu(da)?[A-Z]")),
    ("ATen ops", re.compile(r"^aten::")),
    ("autograd engine", re.compile(r"^autograd::")),
    ("optimizer", re.compile(r"^Optimizer\.")),
)
OTHER = "other profiled regions"
OUTSIDE = "outside any profiled region (fastfair's Python)"
LAUNCH = re.compile(r"^cu(da)?LaunchKernel")
MARK = "fastfair: train_step"  # wraps each profiled step


def category(name: str) -> str:
    return next((cat for cat, pattern in CATEGORIES if pattern.match(name)), OTHER)


def merged_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of time spans (us)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def host_events(events) -> list:
    """The profile's host events (a CUDA profile also lists each marker as a GPU annotation: not host time)."""
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CPU and not e.is_async]


def split(events) -> dict[str, float]:
    """Host microseconds by category: each event's self time to its category; the self time of the steps'
    markers (main thread, in no other event), less the time other threads' top-level events cover
    (autograd's device thread while the main one waits in backward), to ``OUTSIDE``."""
    cpu = host_events(events)
    out: dict[str, float] = {}
    for e in cpu:
        if e.name != MARK:
            out[category(e.name)] = out.get(category(e.name), 0.0) + e.self_cpu_time_total
    marks = [e for e in cpu if e.name == MARK]
    main = {e.thread for e in marks}
    others = merged_us([(e.time_range.start, e.time_range.end) for e in cpu
                        if e.cpu_parent is None and e.thread not in main])
    out[OUTSIDE] = max(0.0, sum(e.self_cpu_time_total for e in marks) - others)
    return out


def measure(method: str, model: str, dataset: str, args, dev: torch.device, overrides: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = common.make_trainer(method, model, dataset, overrides, Path(tmp) / "run")
        step, loader = trainer.train_step, trainer.train_loader
        unprofiled = common.time_steps(step, loader, args.steps, args.warmup, dev)
        batches = common.endless(loader)
        try:
            data = [next(batches) for _ in range(args.steps)]  # loaded before: the split is of the steps alone
        finally:
            batches.close()
        activities = [torch.profiler.ProfilerActivity.CPU] + (
            [torch.profiler.ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        common.sync(dev)
        with torch.profiler.profile(activities=activities) as prof:
            t0 = time.perf_counter()
            for x, y in data:
                with torch.profiler.record_function(MARK):
                    step(x, y)
            common.sync(dev)
            wall_us = (time.perf_counter() - t0) * 1e6
        events = prof.events()
        parts = split(events)
        marked_us = sum(e.time_range.end - e.time_range.start for e in host_events(events) if e.name == MARK)
    launches = sum(1 for e in events if LAUNCH.match(e.name))
    n = args.steps
    return {"model": model, "method": method, "batch": args.batch, "attack_steps": args.attack_steps,
            "compiled": trainer.net is not trainer.model, "ms_per_step": 1e3 * unprofiled / n,
            "profiled_ms_per_step": wall_us / 1e3 / n, "marked_ms_per_step": marked_us / 1e3 / n,
            "launch_api_calls_per_step": launches / n if dev.type == "cuda" else None,
            "split_ms_per_step": {k: v / 1e3 / n for k, v in sorted(parts.items(), key=lambda kv: -kv[1])}}


def body(rows: list[dict]) -> str:
    cats = [c for c, _ in CATEGORIES] + [OTHER, OUTSIDE]
    table = ["| category | " + " | ".join(f"{r['method']} {r['model']} b{r['batch']}" for r in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for c in cats:
        table.append(f"| {c} | " + " | ".join(f"{r['split_ms_per_step'].get(c, 0.0):.2f}" for r in rows) + " |")
    for key, label in (("marked_ms_per_step", "profiled step, its own time (ms)"),
                       ("profiled_ms_per_step", "profiled step, wall time (ms)"),
                       ("ms_per_step", "unprofiled step (ms)"),
                       ("launch_api_calls_per_step", "kernel-launch API calls per step")):
        table.append(f"| **{label}** | " + " | ".join(common.fmt(r[key]) for r in rows) + " |")
    return "Host milliseconds per step, by where they were spent:\n\n" + "\n".join(table)


def main(argv=None) -> None:
    p = common.step_parser(__doc__)  # --steps: profiled, and apart timed
    p.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                   help="fastfair settings changed from the device's defaults (train.compile=on on a CPU)")
    args = p.parse_args(argv)
    full = dict(methods=["pgd-at", "trades"], models=["resnet18"], batch=128, steps=10, warmup=3, attack_steps=10)
    smoke = dict(methods=["pgd-at"], models=["tiny-cnn"], batch=8, steps=2, warmup=1, attack_steps=2)
    common.fill_defaults(args, full, smoke)
    dev = common.pick_device(args.device)
    shape = (3, 16, 16) if args.smoke else (3, 32, 32)
    dataset = common.register_synthetic((args.warmup + 2 * args.steps + 1) * args.batch, 0, shape)
    # the default path of this device; a smoke run compiles on a CPU too, so its regions are all there
    overrides = {"data.batch_size": args.batch, "train.device": str(dev), "attack.steps": args.attack_steps,
                 **({"model.width": 8, "train.compile": "on"} if args.smoke else {}),
                 **config.parse_set(args.set)}  # values read as fastfair train --set reads them (true: a bool)
    rows = [measure(method, model, dataset, args, dev, overrides) for model in args.models for method in args.methods]
    text = body(rows)
    settings = {k: getattr(args, k) for k in ("methods", "models", "batch", "steps", "warmup", "attack_steps", "set")}
    method_note = __doc__.split("\n\n    python")[0].strip()
    paths = common.save("host", head=common.header(dev), settings=settings, rows=rows, body=f"{text}\n\n{method_note}",
                        out_dir=args.out, smoke=args.smoke, tag=args.tag)
    print(text)
    print("\nwritten:", *paths)


if __name__ == "__main__":
    main()
