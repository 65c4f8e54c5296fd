"""The GPU suite: every figure fastfair needs from a lent GPU, in priority order, resumable.

A GPU comes rarely, for 15 minutes of device time all told (its start included), in commands of
at most 10: about one full command. So the suite runs its parts one after another in the order
below, the headline first, each in its own process group, stops before a part that would not fit
in this command's time (``--max-s``), gives no part more than twice its estimate (its budget), and
a rerun skips every part that already finished (each part writes its own record, ``<part>.json``,
beside the benches' own result files). A part may run alongside the one before it (the GPU tests
beside the plan's compilation). On a lease::

    bash bench/lease/gpu_lease.sh            # installs what the GPU image lacks, runs the suite, packs $OUT

and locally, once before the lease: ``bash bench/lease/gpu_prepare.sh`` (wheels into a git-ignored
folder that the ``run`` call carries). Unpack the returned ``gpu-suite.tar.gz`` into
``bench/results/`` (a later call takes the records along as untracked files, and resumes), then
``python bench/speed_report.py --write`` (docs/performance.md).

    python bench/lease/gpu_suite.py --list   # the parts, their budgets and status; the plan's total
    python bench/lease/gpu_suite.py --smoke  # every part at tiny sizes on any device (CI)

The first parts are the GPU plan of issue 42, budgeted to fit one command (see PARTS): the
training configurations the CUDA defaults depend on, each beside the reference loop in its own
process (the headline first), with the GPU tests alongside; the concurrency curve; AutoAttack on
10k images. After them, for later commands: the host's time split, MFU, every rung of the ladder,
a real epoch's wall time with validation, checkpoint and compilation, kernels against Inductor,
bf16-trained vs fp32-trained robust accuracy. ``env`` records the device, driver, versions, commit
and whether a full CIFAR-10 exists anywhere on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench import common  # noqa: E402

BENCH = common.ROOT / "bench"  # the benchmarks the parts run (bench/README.md)
SUITE_DIR = "gpu-suite"  # records of the parts, under --out
PER_COMMAND_S = 540  # a lease's command may run 10 minutes; keep a margin for start-up and packing
REAL_DATA = ("cifar10-subset.npz",)  # looked for in .devdata/ (carried to the GPU) and ../shared/data


@dataclass(frozen=True)
class Part:
    name: str
    what: str
    estimate_s: int  # its budget: full size on a GPU, compilation included; whether it fits the time left
    args: Callable[[argparse.Namespace], list[str]] = field(default=lambda a: [])  # after `python`
    run: Callable[[argparse.Namespace, Path], dict] | None = None  # in-process parts (env, real epoch)
    # a part (still to do) started beside this one, which is then given `--after-pid PID` and times nothing before
    # that process has ended: the GPU tests measure nothing and run while the plan's configurations compile
    alongside: str = ""


def bench(script: str, *full: str, smoke: tuple[str, ...] = (), tag: str = ""):
    """``python bench/<script> --out OUT [--tag T] (--smoke SMOKE... | FULL...)``."""
    def args(a: argparse.Namespace) -> list[str]:
        out = [str(BENCH / script), "--out", str(a.out)] + (["--tag", tag] if tag else [])
        return out + (["--smoke", *smoke] if a.smoke else list(full))
    return args


def real_data(a: argparse.Namespace) -> Path | None:
    for folder in (common.ROOT / ".devdata", common.SHARED_DATA):
        for name in REAL_DATA:
            if (folder / name).is_file():
                return folder / name
    return None


# ---- in-process parts --------------------------------------------------------------------------

def find_cifar10(timeout_s: int = 60) -> list[str]:
    """Paths on this machine that look like a full CIFAR-10 (the python batches, or a 50k-image file)."""
    try:
        out = subprocess.run(["find", "/", "-xdev", "-iname", "*cifar*", "-not", "-path", "/proc/*"],
                             capture_output=True, text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [p for p in out.splitlines() if ".git/" not in p][:50]


def env_part(a: argparse.Namespace, _: Path) -> dict:
    dev = common.pick_device("auto")
    found = [] if a.smoke else find_cifar10()
    return {"header": common.header(dev), "cifar_paths": found,
            "full_cifar10": any(p.endswith(("data_batch_5", "cifar-10-batches-py")) for p in found),
            "real_subset": str(real_data(a) or "")}


def real_epoch_part(a: argparse.Namespace, work: Path) -> dict:
    """`fastfair train` as a user runs it: wall time of each epoch with validation and checkpoint,
    the first one holding the compilation, on the real CIFAR-10 subset (digits in a smoke run)."""
    data = None if a.smoke else real_data(a)
    if data is None:
        sets = ["--config", "demo", "--epochs", "2"] + (["--device", "cpu"] if a.smoke else [])
        # a smoke run's epochs: a few images, one attack step, an FGSM validation (the plumbing, not the time)
        sets += [f"--set={k}" for k in ("data.train_per_class=10", "data.val_per_class=5", "model.width=4",
                                         "attack.steps=1", "train.val_attack=fgsm")] if a.smoke else []
    else:
        sets = ["--method", "pgd-at", "--model", "resnet18", "--dataset", "npz", "--data-dir", str(data),
                "--epochs", "3", "--set", "train.lr_milestones=[2]"]
    run = work / "real-epoch-run"
    cmd = [sys.executable, "-m", "fastfair", "train", *sets, "--out", str(run), "--set", 'eval.attacks=["clean"]']
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=common.ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise RuntimeError(f"fastfair train failed: {(proc.stderr.strip().splitlines() or [''])[-1]}")
    epochs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"command": " ".join(cmd[1:]), "data": str(data or "digits (the demo)"), "wall_s": wall,
            "epoch_train_s": [e["epoch_time_s"] for e in epochs], "images_per_s": [e["images_per_s"] for e in epochs],
            "first_epoch_extra_s": epochs[0]["epoch_time_s"] - min(e["epoch_time_s"] for e in epochs[1:]),
            "header": common.header(common.pick_device("auto"))}


# ---- the parts, in priority order ----------------------------------------------------------------

RN18 = ("--models", "resnet18")
GPU_TESTS = "gpu-tests"
PARTS = (
    Part("env", "device, driver, versions, commit; is a full CIFAR-10 on this machine?", 10, run=env_part),
    # The GPU plan (issue 42): everything the CUDA defaults and --per-gpu auto wait for, in about 9 minutes of one
    # command. Budgets from the H200 lease (2026-11-26): the default ResNet-18 PGD-10 AT step compiled in about
    # 115 s (the rn18-at part's 133 s less its reference loop and start-up); a configuration's timing takes seconds.
    # 340 s: 240 s for the ten configurations to compile at once (bench/pool.py; WRN-34-10's, 1.65x ResNet-18's
    # launches, is the longest, and a configuration with CUDA graphs compiles its step a second time without them
    # for the first steps' check) and 100 s to time them one by one beside their reference loops, the headline
    # first. A configuration not compiled by the deadline leaves the part failed; run again, it times only that one.
    Part("plan-training", "ResNet-18 PGD-10 AT at batch 128 and 512, CUDA graphs off and on, C++ wrapper off and on; "
         "TRADES and WRN-34-10 with the CUDA defaults; the reference loop in each configuration's process", 340,
         args=bench("bench_matrix.py", "--compile-deadline", "240", tag="plan"), alongside=GPU_TESTS),
    # 70 s: eight runs of the default configuration compile from the caches plan-training filled (Dynamo's trace,
    # the cached graphs, CUDA graphs' recording: under 50 s), then K = 1, 2, 4, 8 step together, 3 windows each
    Part("concurrency", "aggregate img/s of K = 1, 2, 4, 8 concurrent ResNet-18 PGD-10 AT runs on the GPU", 70,
         args=bench("bench_concurrency.py", "--compile-deadline", "50")),
    # 90 s: standard AutoAttack over 10k images where APGD-CE breaks nearly all of them (its 100 iterations on every
    # image: about 50 s for ResNet-18 in fp32), then the ceiling (every sub-attack on every image) on 100 images. A
    # smoke run is bench_eval's whole smoke, its PGD-family rows too (tests/test_bench_smoke.py reads it)
    Part("aa-10k", "standard AutoAttack (official pyautoattack) on 10k test images of ResNet-18: the two bounds "
         "and a robust model's time predicted from them", 90,
         args=bench("bench_eval.py", *RN18, "--attacks", "--aa", "--aa-images", "10000", "--aa-ceiling-images",
                    "100", smoke=("--aa-ceiling-images", "4"), tag="aa-10k")),
    # ---- after the plan: for the next leases
    Part(GPU_TESTS, "pytest -m gpu: the compiled + Triton step against eager on CUDA, CUDA graphs against none", 240,
         # a test file that imports what the image lacks holds no GPU test; the JUnit file says which tests passed
         # (a smoke run collects one file: collecting the whole folder imports every test module, a minute of CPU)
         args=lambda a: ["-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                         f"--junitxml={a.out / SUITE_DIR / 'gpu-tests-junit.xml'}",
                         str(common.ROOT / "tests" / ("test_kernels.py" if a.smoke else ""))]),
    # (a smoke run's host-profile, mfu, rn18-ladder, bf16 are what tests/test_bench_smoke.py checks: both methods where
    # it checks both)
    # the host's 46.8 ms per step, split: Dynamo, AOTAutograd, Inductor's wrapper, Triton's launcher, the CUDA API,
    # fastfair's Python; and the launches the GPU saw against gpu_codegen's count
    Part("host-profile", "where the host's time goes in the default step (ResNet-18 PGD-AT and TRADES, batch 128)",
         120, args=bench("bench_host.py", *RN18, smoke=("--device", "cpu"), tag="rn18")),
    Part("mfu", "model FLOP utilisation of fastfair's default step (counted FLOPs / time / peak)", 180,
         args=bench("bench_mfu.py", "--methods", "pgd-at", "trades", *RN18, "--steps", "10",
                    smoke=("--methods", "pgd-at", "trades"), tag="rn18")),
    Part("rn18-ladder", "ResNet-18 PGD-10 AT: every rung of the ladder at batch 128, the default at 512", 480,
         args=bench("bench_training.py", "--methods", "pgd-at", *RN18, "--sweep", "512", "--steps", "10",
                    "--warmup", "3", smoke=("--methods", "pgd-at", "trades"), tag="rn18-ladder")),
    Part("real-epoch", "fastfair train on real data: epoch wall time with validation, checkpoint, compilation", 300,
         run=real_epoch_part),
    Part("kernels", "fused Triton kernels against eager and Inductor's code for the same maths", 240,
         args=lambda a: [str(BENCH / "bench_kernels.py"), "--out", str(a.out)] + (["--smoke"] if a.smoke else [])),
    Part("bf16", "robust accuracy of bf16-trained vs fp32-trained ResNet-18 on the real subset (fp32 eval)", 540,
         args=lambda a: [str(BENCH / "investigations" / "check_bf16_robustness.py"), "--out", str(a.out)]
         + (["--smoke"] if a.smoke else ["--epochs", "10", "--seeds", "0"])
         + (["--data", str(real_data(a))] if real_data(a) else [])),
)
PLAN = ("env", "plan-training", "concurrency", "aa-10k")  # the next lease's one command (gpu-tests alongside)


# ---- running -------------------------------------------------------------------------------------

def record_path(a: argparse.Namespace, part: Part) -> Path:
    return a.out / SUITE_DIR / f"{part.name}{'-smoke' if a.smoke else ''}.json"


def device_name() -> str:
    return common.device_name(common.pick_device("auto"))


def record(a: argparse.Namespace, part: Part) -> dict:
    path = record_path(a, part)
    return json.loads(path.read_text()) if path.is_file() else {}


def done(a: argparse.Namespace, part: Part, device: str | None = None) -> bool:
    """Finished on ``device`` (any device when None): a part measured on an H200 is still to do on an H100."""
    rec = record(a, part)
    return rec.get("status") == "ok" and device in (None, rec.get("device"))


@dataclass
class Running:
    """A part under way: its record so far, and its process (None for an in-process part, already finished)."""
    part: Part
    rec: dict
    t0: float
    proc: subprocess.Popen | None = None


def start_part(a: argparse.Namespace, part: Part, extra: tuple[str, ...] = ()) -> Running:
    """Start one part: a subprocess in its own process group (so a timeout stops whatever it started, a pool's
    children included), or, in-process, run it to the end. Never raises: a broken part is recorded."""
    t0 = time.perf_counter()
    rec: dict = {"part": part.name, "what": part.what, "smoke": a.smoke, "device": device_name(),
                 "time_utc": common.utc_now()}
    work = a.out / SUITE_DIR / "work"
    work.mkdir(parents=True, exist_ok=True)
    if part.run:
        try:
            rec.update(status="ok", result=part.run(a, work))
        except Exception as err:  # noqa: BLE001 -- a broken part is recorded; the suite goes on to the next
            rec.update(status=f"failed: {type(err).__name__}: {err}")
        return Running(part, rec, t0)
    cmd = [sys.executable, *part.args(a), *extra]
    rec["command"] = " ".join(cmd[1:])
    path = os.pathsep.join(filter(None, [str(common.ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    # its output to a file, not a pipe: nobody reads a pipe while a part runs beside another, and a full one stops it
    with open(work / f"{part.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=common.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return Running(part, rec, t0, proc)


def finish_part(a: argparse.Namespace, run: Running, limit_s: float) -> dict:
    """Wait for a started part, at most ``limit_s`` seconds from its start; write and return its record."""
    rec, proc = run.rec, run.proc
    if proc is not None:
        try:
            proc.wait(timeout=max(1.0, limit_s - (time.perf_counter() - run.t0)))
            rec["status"] = "ok" if proc.returncode == 0 else f"failed (exit {proc.returncode})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rec["status"] = "timeout"
        rec["output_tail"] = (a.out / SUITE_DIR / "work" / f"{run.part.name}.log").read_text(errors="replace")[-4000:]
    rec["seconds"] = time.perf_counter() - run.t0
    path = record_path(a, run.part)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


def run_part(a: argparse.Namespace, part: Part, limit_s: float) -> dict:
    """Run one part within ``limit_s`` seconds; its record says ok, failed or timeout, never raises."""
    return finish_part(a, start_part(a, part), limit_s)


def pack(a: argparse.Namespace, dest: Path) -> Path:
    """Every result file under --out in one archive (a lease returns at most 8 files)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / "gpu-suite.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(a.out.rglob("*")):
            if path.is_file() and "work" not in path.relative_to(a.out).parts:
                tar.add(path, arcname=str(path.relative_to(a.out)))
    return archive


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="every part at tiny sizes, on any device (CI)")
    p.add_argument("--out", type=Path, default=common.RESULTS, help="where results go (bench/results)")
    p.add_argument("--max-s", type=float, default=PER_COMMAND_S, help="this command's time; parts that would "
                                                                      "not fit are left for the next run")
    p.add_argument("--only", nargs="+", metavar="PART", help="run these parts (done or not)")
    p.add_argument("--redo", action="store_true", help="run parts that already finished again")
    p.add_argument("--pack", type=Path, metavar="DIR", help="afterwards, pack every result into DIR/gpu-suite.tar.gz")
    p.add_argument("--list", action="store_true", help="list the parts and their status")
    a = p.parse_args(argv)
    names = [part.name for part in PARTS]
    unknown = sorted(set(a.only or ()) - set(names))
    if unknown:
        p.error(f"unknown part(s) {', '.join(unknown)}; parts: {', '.join(names)}")
    if a.list:
        for part in PARTS:
            status = f"done on {record(a, part).get('device', '?')}" if done(a, part) else "to do"
            where = "plan" if part.name in PLAN else "alongside" if any(q.alongside == part.name for q in PARTS) else ""
            print(f"{part.name:13s} {where:9s} {status:22s} ~{part.estimate_s:4d} s  {part.what}")
        print(f"the plan: {sum(q.estimate_s for q in PARTS if q.name in PLAN)} s of this command's {a.max_s:.0f}")
        return 0
    if not a.smoke and not torch.cuda.is_available():
        p.error("no CUDA device: the suite measures a GPU; use --smoke to check it on this machine")
    start = time.perf_counter()
    todo = [part for part in PARTS if (part.name in a.only if a.only else
                                       a.redo or part.name == "env" or not done(a, part, device_name()))]
    left_over, ran = [], set()
    for part in todo:
        if part.name in ran:  # ran alongside an earlier part
            continue
        left = a.max_s - (time.perf_counter() - start)
        if not a.smoke and part.estimate_s > left:
            left_over.append(part.name)
            continue  # a smaller later part may still fit
        limit = max(min(left, 2 * part.estimate_s), 1.0) if not a.smoke else 600
        beside = next((q for q in todo if q.name == part.alongside and q.name not in ran), None)
        print(f"== {part.name}: {part.what} (~{part.estimate_s} s, {left:.0f} s left)"
              + (f"; {beside.name} alongside" if beside else ""), flush=True)
        other = start_part(a, beside) if beside else None
        rec = finish_part(a, start_part(a, part, ("--after-pid", str(other.proc.pid)) if other else ()), limit)
        print(f"== {part.name}: {rec['status']} in {rec['seconds']:.0f} s", flush=True)
        if other:
            rec = finish_part(a, other, max(limit, 2 * beside.estimate_s))
            print(f"== {beside.name} (alongside): {rec['status']} in {rec['seconds']:.0f} s", flush=True)
            ran.add(beside.name)
        ran.add(part.name)
    if a.pack:
        print(f"packed {pack(a, a.pack)}")
    failed = [part.name for part in PARTS if part.name in ran and not done(a, part, device_name())]
    print(f"not run, no time left: {', '.join(left_over)} (run the suite again)" if left_over
          else "every part ran" if not failed else "", f"failed: {', '.join(failed)}" if failed else "")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
