"""What every benchmark shares: the device/version header, timing, synthetic data, fastfair
configs and trainers built from names, and saving results as JSON + Markdown in bench/results/.

Timing follows the device method (warm up first; CUDA events around the region on a GPU,
``time.perf_counter`` after a synchronise on the CPU; medians where a region repeats).
"""
from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/x.py`: import this checkout's fastfair and bench
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from fastfair import config  # noqa: E402
from fastfair.data.datasets import DATASETS, DataBundle, DatasetSpec  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# The real data sets beside the repository; FASTFAIR_SHARED_DATA points elsewhere (a worktree).
SHARED_DATA = Path(os.environ.get("FASTFAIR_SHARED_DATA", ROOT / ".." / "shared" / "data"))
CIFAR10_EPOCH = 50_000  # images in one CIFAR-10 training epoch: seconds per epoch are quoted for this size


# ---- device and versions ----------------------------------------------------------------------

def pick_device(name: str = "auto") -> torch.device:
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else ("cpu" if name == "auto" else name))


def device_name(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"CPU {cpu}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def gpu_driver() -> str | None:
    """The NVIDIA driver version (nvidia-smi), or None where it cannot be asked."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out.splitlines()[0] if out else None


def _git() -> dict[str, Any]:
    def run(*args):
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    try:
        return {"commit": run("rev-parse", "HEAD"), "dirty": bool(run("status", "--porcelain", "--untracked-files=no"))}
    except OSError:
        return {"commit": "", "dirty": None}


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def header(dev: torch.device) -> dict[str, Any]:
    """Device and software versions that a number depends on (stored with every result)."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    import torchvision

    out = {
        "device": device_name(dev), "device_type": dev.type,
        "torch": torch.__version__, "torchvision": torchvision.__version__, "triton": triton_version,
        "python": platform.python_version(), "cuda": torch.version.cuda,
        # TF32 changes what "fp32" means on a GPU: the reference loop gets whatever PyTorch defaults to.
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        "time_utc": utc_now(),
        **_git(),
    }
    if dev.type == "cuda":
        out["driver"] = gpu_driver()
        props = torch.cuda.get_device_properties(dev)
        out.update(capability=f"{props.major}.{props.minor}", sm_count=props.multi_processor_count,
                   memory_gib=round(props.total_memory / 2**30, 1))
    return out


# ---- timing -----------------------------------------------------------------------------------

def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed(fn: Callable[[], Any], dev: torch.device) -> float:
    """Seconds that ``fn()`` keeps the device busy: CUDA events on a GPU, the host clock on a CPU."""
    sync(dev)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def wait_for_pid(pid: int, timeout_s: float) -> bool:
    """Wait, at most ``timeout_s``, until process ``pid`` has ended (a zombie its parent has not reaped yet has);
    whether it has."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.5)
    return False


def median_seconds(fn: Callable[[], Any], dev: torch.device, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(timed(fn, dev) for _ in range(reps))


def endless(loader: Iterable) -> Iterator:
    """Batches of ``loader`` epoch after epoch (a fresh pass each time; nothing is cached)."""
    while True:
        yield from loader


REPEATS = 3  # timed windows per measurement; the median is reported


def run_steps(step: Callable, loader: Iterable, n: int, dev: torch.device) -> None:
    """``n`` untimed calls of ``step(x, y)`` on consecutive batches (compilation, autotuning, warm-up), synchronised."""
    batches = endless(loader)
    try:
        for _ in range(n):
            step(*next(batches))
    finally:
        batches.close()
    sync(dev)


def time_steps(step: Callable, loader: Iterable, steps: int, warmup: int, dev: torch.device,
               repeats: int = REPEATS) -> float:
    """Median over ``repeats`` windows of the seconds for ``steps`` calls of ``step(x, y)`` on
    consecutive batches, after ``warmup`` calls.

    Fetching the batches is inside the timed region: loading is part of what a loop costs.
    """
    batches = endless(loader)
    try:
        for _ in range(warmup):
            step(*next(batches))
        return statistics.median(timed(lambda: [step(*next(batches)) for _ in range(steps)], dev)
                                 for _ in range(repeats))
    finally:
        batches.close()  # shuts down DataLoader workers now, not at garbage collection


def interleaved_windows(steps: dict[str, Callable[[], Any]], *, windows: int, window_steps: int, warmup: int,
                        dev: torch.device) -> dict[str, dict[str, list[float]]]:
    """Seconds per call of each ``steps[name]()``, one list entry per timed window of ``window_steps`` calls:
    ``wall`` (the device's time, :func:`timed`) and ``cpu`` (this process's CPU seconds, all its threads: on a
    loaded CPU they grow far less than the wall time, which waits for the other processes). The windows take
    turns (a, b, c, a, b, c, ...), so a change in the machine's load hits every entry alike; each entry is
    called ``warmup`` times first."""
    for step in steps.values():
        for _ in range(warmup):
            step()
    seconds = {name: {"wall": [], "cpu": []} for name in steps}
    for _ in range(windows):
        for name, step in steps.items():
            cpu = time.process_time()
            seconds[name]["wall"].append(timed(lambda: [step() for _ in range(window_steps)], dev) / window_steps)
            seconds[name]["cpu"].append((time.process_time() - cpu) / window_steps)
    return seconds


# ---- data and fastfair objects ----------------------------------------------------------------

def synthetic_bundle(n_train: int, n_test: int, shape=(3, 32, 32), num_classes: int = 10, seed: int = 0) -> DataBundle:
    """Random uint8 images of CIFAR shape and balanced labels in random order: throughput does not
    depend on the pixels (random, not zeros: zeros can run faster than real data)."""
    g = torch.Generator().manual_seed(seed)
    return DataBundle(
        "synthetic", torch.randint(0, 256, (n_train, *shape), dtype=torch.uint8, generator=g),
        torch.randperm(n_train, generator=g) % num_classes,
        torch.randint(0, 256, (n_test, *shape), dtype=torch.uint8, generator=g),
        torch.randperm(n_test, generator=g) % num_classes, [str(i) for i in range(num_classes)],
    )


def register_synthetic(n_train: int, n_test: int = 0, shape=(3, 32, 32), num_classes: int = 10) -> str:
    """Register a synthetic data set in fastfair's DATASETS (one validation image per
    class, the least fastfair accepts; CIFAR augmentation) so the real Trainer can run on it; returns its name."""
    name = f"bench-synthetic-{n_train}-{n_test}-{'x'.join(map(str, shape))}-{num_classes}"
    if name not in DATASETS:
        # + one validation image per class, so the training split keeps n_train images
        bundle = synthetic_bundle(max(n_train, num_classes) + num_classes, n_test, shape, num_classes)
        DATASETS.register(name, "benchmark data: random uint8 images")(
            DatasetSpec(lambda _: bundle, 1, 4, True, "generated by bench/common.py"))
    return name


def has_key(key: str) -> bool:
    """Whether fastfair's config has ``section.name`` (optimisations not in the core are skipped, not faked)."""
    section, _, name = key.partition(".")
    sec = getattr(config.Config(), section, None)
    return dataclasses.is_dataclass(sec) and name in {f.name for f in dataclasses.fields(sec)}


def switch(key: str, on: bool) -> bool | str:
    """The value that turns ``key`` on or off: a bool for a bool key, "on" / "off" for an auto | on | off key."""
    section, _, name = key.partition(".")
    return on if isinstance(getattr(getattr(config.Config(), section), name), bool) else ("on" if on else "off")


def make_config(method: str, model: str, dataset: str, overrides: dict[str, Any]) -> config.Config:
    cfg = config.resolve(flags={"method.name": method, "model.name": model, "data.dataset": dataset})
    return config.apply(cfg, {"train.progress": False, **overrides}, "the benchmark")


def make_trainer(method: str, model: str, dataset: str, overrides: dict[str, Any], out: Path):
    """A fresh Trainer; compiled code of earlier trainers is dropped first, or after 8 of them
    torch.compile would hit its recompile limit and silently run eagerly."""
    from fastfair.training.trainer import Trainer

    torch._dynamo.reset()
    return Trainer(make_config(method, model, dataset, overrides), out, quiet=True)


def interleaved_trainers(method: str, model: str, dataset: str, configs: dict[Any, dict[str, Any]], *, windows: int,
                         window_steps: int, warmup: int) -> dict[Any, dict[str, list[float]]]:
    """:func:`interleaved_windows` of the training steps of one Trainer per entry of ``configs`` (its config keys),
    all alive in this process on the CPU, each on its own loader."""
    with tempfile.TemporaryDirectory() as tmp:
        trainers = {key: make_trainer(method, model, dataset, sets, Path(tmp) / str(i))
                    for i, (key, sets) in enumerate(configs.items())}
        batches = {key: endless(t.train_loader) for key, t in trainers.items()}
        try:
            return interleaved_windows(
                {key: lambda t=t, b=batches[key]: t.train_step(*next(b)) for key, t in trainers.items()},
                windows=windows, window_steps=window_steps, warmup=warmup, dev=torch.device("cpu"))
        finally:
            for b in batches.values():
                b.close()


# ---- results ----------------------------------------------------------------------------------

# Profiler events that wrap a compiled graph's run (Dynamo's region, AOTAutograd's function, Inductor's call)
GRAPH_EVENTS = ("Torch-Compiled Region", "CompiledFunction", "## Call CompiledFxGraph", "TorchDynamo Cache Lookup")


def ancestors(event) -> Iterator:
    """A profiler event's enclosing events, innermost first."""
    up = event.cpu_parent
    while up is not None:
        yield up
        up = up.cpu_parent


def in_compiled_graph(event) -> bool:
    """Whether a profiled op ran inside a compiled graph (else it ran eagerly, launched by the host)."""
    return any(up.name.startswith(GRAPH_EVENTS) for up in ancestors(event))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def markdown_table(rows: list[dict], columns: list[tuple[str, str]]) -> str:
    """``columns``: (row key, header). Missing values print as '-'."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(k)) for k, _ in columns) + " |" for r in rows]
    return "\n".join(lines)


def result_path(name: str, head: dict, out_dir: Path, smoke: bool, tag: str = "") -> Path:
    """``out_dir/<name>[-<tag>][-smoke]-<device>.json``: where :func:`save` writes a bench's record."""
    dev = "cpu" if head["device_type"] == "cpu" else slug(head["device"])
    return Path(out_dir) / f"{name}{'-' + slug(tag) if tag else ''}{'-smoke' if smoke else ''}-{dev}.json"


def save(name: str, *, head: dict, settings: dict, rows: list[dict], body: str, out_dir: Path,
         smoke: bool, tag: str = "") -> tuple[Path, Path]:
    """Write ``<name>[-<tag>][-smoke]-<device>.json`` and ``.md`` under ``out_dir``; returns both paths.

    One file pair per bench, tag (a part of the GPU suite) and device: a new run replaces the
    last, git keeps the history.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = result_path(name, head, out_dir, smoke, tag)
    md_path = json_path.with_name(json_path.name.removesuffix(".json") + ".md")
    record = {"bench": name, "smoke": smoke, "header": head, "settings": settings, "rows": rows}
    json_path.write_text(json.dumps(record, indent=1) + "\n")
    kind = "CPU smoke run: tiny sizes, not a performance number" if smoke else "full-size run"
    md = [f"# {name} ({kind})", "",
          f"- device: {head['device']}",
          f"- torch {head['torch']}, torchvision {head['torchvision']}, triton {head['triton']}, "
          f"CUDA {head['cuda']}, Python {head['python']}",
          f"- fastfair commit {head['commit'][:12]}{' (uncommitted changes)' if head['dirty'] else ''}, "
          f"{head['time_utc']}",
          f"- settings: `{json.dumps(settings)}`", "", body, ""]
    md_path.write_text("\n".join(md))
    return json_path, md_path


def base_parser(doc: str):
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny sizes on any device (CI); numbers mean nothing")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--out", type=Path, default=RESULTS, help="folder for the JSON and Markdown results")
    p.add_argument("--tag", default="", help="added to the result file names (the GPU suite names its parts)")
    return p


def step_parser(doc: str):
    """``base_parser`` with the options of every bench that runs training steps; unset, they take the bench's
    defaults (``fill_defaults``)."""
    p = base_parser(doc)
    p.add_argument("--methods", nargs="+")
    p.add_argument("--models", nargs="+")
    p.add_argument("--batch", type=int, help="batch size (default: the papers' 128)")
    p.add_argument("--steps", type=int, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, help="untimed steps first (compilation, cuDNN autotuning, workers)")
    p.add_argument("--attack-steps", type=int, help="PGD steps per training step (default 10)")
    return p


def fill_defaults(args, full: dict, smoke: dict) -> None:
    """Every option left unset takes the bench's full-size default, or its smoke one under ``--smoke``."""
    for key, value in (smoke if args.smoke else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
