"""Every bench runs end to end in --smoke mode (tiny sizes, any device) and writes its JSON and
Markdown. Not timed: the numbers of a smoke run mean nothing. The benches that are parts of the GPU suite (training,
host, MFU, bf16, eval) are read from this pytest run's one suite --smoke (helpers.gpu_suite_smoke: no GPU, one
thread), CPU layout runs in this process, the stop vote (its processes are what it measures) in one of its own."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.bench_host import category, merged_us
from helpers import gpu_suite_smoke, real_data

ROOT = Path(__file__).resolve().parents[1]
# One thread per process, Inductor's compilation included (its pool would start a process per core): these runs
# share a 2-core machine with pytest's workers, where threads that spin while they wait cost many times their work.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
# A run's wall-clock limit, per CPU second of its work: 3 for a slower CPU (AVX2-only) or a cold Inductor cache,
# times 10 because a loaded 2-core machine (load average 13 to 16 while these were measured; CI's is alike) gives
# one process as little as a tenth of a core. What the limit catches is a hang, never load.
WALL_PER_CPU_S = 3 * 10


def smoke(script: str, out: Path, *extra: str, cpu_s: float) -> subprocess.CompletedProcess:
    """bench/SCRIPT --smoke in a process of its own; ``cpu_s``: the CPU seconds it took on the 2-core machine
    (user + sys, its compiler processes included, a cold Inductor cache: a quiet machine's wall time)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **ONE_THREAD}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke", "--out", str(out), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=WALL_PER_CPU_S * cpu_s)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def in_process(main, out: Path, *extra: str) -> None:
    """bench MAIN(["--smoke", "--out", OUT, *EXTRA]) in this process, in one thread (ONE_THREAD's; torch's count is
    restored after): a process of its own costs the start of an interpreter and torch, where no process is tested."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["--smoke", "--out", str(out), *extra]) in (None, 0)
    finally:
        torch.set_num_threads(threads)


def results(out: Path, name: str) -> tuple[dict, str]:
    record = json.loads((out / f"{name}-smoke-cpu.json").read_text())
    assert record["smoke"] and record["header"]["torch"] and record["header"]["device"].startswith("CPU")
    return record, (out / f"{name}-smoke-cpu.md").read_text()


# Each test that reads the GPU suite's smoke run is slow, whatever its own checks cost: the run (~200 CPU s, every part
# a process of its own) is paid by whichever reader runs first, in the contributor's loop as in the whole suite.
reads_the_suite = pytest.mark.slow


def from_suite(part: str, name: str) -> tuple[dict, str]:
    """The results of the GPU suite's smoke PART, whose bench (on the CPU) ran to the end and wrote NAME's files
    (``<bench>-<tag>``: the suite tags its parts'); the suite runs once per pytest run."""
    out, _ = gpu_suite_smoke()
    rec = json.loads((out / "gpu-suite" / f"{part}-smoke.json").read_text())
    assert rec["status"] == "ok", rec.get("output_tail", "")[-3000:]
    return results(out, name)


@reads_the_suite
def test_training_smoke():
    record, md = from_suite("rn18-ladder", "training-rn18-ladder")
    rows = {(r["method"], r["batch"], r["rung"]): r for r in record["rows"]}
    for method in ("pgd-at", "trades"):
        for rung in ("reference", "+ data on device", "fastfair fp32", "+ channels_last", "+ bf16 autocast"):
            assert rows[(method, 16, rung)]["images_per_s"] > 0
        assert rows[(method, 16, "reference")]["x_reference"] == 1.0
        assert rows[(method, 16, "fastfair default")]["images_per_s"] > 0
        assert rows[(method, 32, "fastfair default (sweep)")]["images_per_s"] > 0
        for rung in ("+ torch.compile", "+ compiled attack", "+ CUDA graphs", "+ fused kernels"):
            assert rows[(method, 16, rung)]["note"].startswith("skipped: ")
    assert "## Headline" in md and "fastfair / reference" in md


@reads_the_suite  # its part compiles a training step: 60 CPU s of Inductor and C++ compilers on a cold cache
def test_host_smoke():
    record, md = from_suite("host-profile", "host-rn18")
    (r,) = record["rows"]
    assert r["compiled"] and r["launch_api_calls_per_step"] is None  # no CUDA API on a CPU
    split = r["split_ms_per_step"]
    # a compiled step passes through every layer, and the split accounts for the whole profiled step
    for part in ("Dynamo (frame, guards)", "AOTAutograd wrappers", "Inductor's wrapper", "ATen ops", "optimizer",
                 "outside any profiled region (fastfair's Python)"):
        assert split[part] > 0, part
    # the steps' own time, not their wall time: between two steps the OS may give a loaded machine's core away (CI10:
    # 6 ms of a 22 ms window, where the split summed to the steps' 16)
    assert sum(split.values()) == pytest.approx(r["marked_ms_per_step"], rel=0.01)
    assert r["marked_ms_per_step"] <= r["profiled_ms_per_step"]
    assert "Host milliseconds per step" in md


def test_host_split_counts_overlapping_time_once():
    assert merged_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17
    assert [category(n) for n in ("cudaLaunchKernel", "cuLaunchKernelEx", "aten::add", "cudnn_convolution",
                                  "## Call CompiledFxGraph fx", "triton_poi_fused_0", "Torch-Compiled Region: 0/0")] \
        == ["CUDA API", "CUDA API", "ATen ops", "other profiled regions", "Inductor's wrapper", "Triton launcher",
            "Dynamo (frame, guards)"]


@reads_the_suite
def test_mfu_smoke():
    record, md = from_suite("mfu", "mfu-rn18")
    for r in record["rows"]:
        assert r["images_per_s"] > 0 and r["mfu_percent"] is None
        assert r["step_gflop"] < r["reference_gflop"]
    # Tiny CNN (width 8, 16x16) multiply-adds: stem 16*16*8*27, conv 8*8*16*72, head 64*10; s = the
    # stem's share of a forward F. PGD-2 step in forwards: 2 x (F + input grad F) + F + weight grads F
    # + input grads F - s (none reaches the image) = 7 - s; TRADES: 1 + 4 + 2 x (3 - s) = 11 - 2 s.
    s = 16 * 16 * 8 * 27 / (16 * 16 * 8 * 27 + 8 * 8 * 16 * 72 + 64 * 10)
    steps = {r["method"]: r["step_in_forwards"] for r in record["rows"]}
    assert steps == {"pgd-at": pytest.approx(7 - s, rel=1e-6), "trades": pytest.approx(11 - 2 * s, rel=1e-6)}
    assert "MFU" in md


@reads_the_suite
def test_eval_smoke():
    record, md = from_suite("aa-10k", "eval-aa-10k")  # bench_eval --smoke, its ceiling on 4 images
    assert [(r["attack"], r["precision"], r["images"]) for r in record["rows"]] == \
        [("clean", "fp32", 64), ("pgd20", "fp32", 64), ("cw20", "fp32", 64),
         ("aa (random weights)", "fp32", 8), ("aa (ceiling)", "fp32", 4),
         ("aa (robust model, 50% robust: PREDICTED from the two rows above)", "fp32", 10_000)]
    assert "| tiny-cnn | pgd20 | fp32 |" in md
    aa = {r["attack"]: r for r in record["rows"] if r["attack"].startswith("aa")}
    assert all(r["aa_backend"].startswith("pyautoattack") for r in aa.values())
    assert aa["aa (ceiling)"]["aa_robust"] == 100.0  # at eps 1e-6 nothing breaks: every sub-attack ran on every image
    # the prediction lies between the two bounds scaled to 10k images: all broken by APGD-CE, none broken
    low, high = (10_000 * aa[k]["seconds"] / aa[k]["images"] for k in ("aa (random weights)", "aa (ceiling)"))
    predicted = aa["aa (robust model, 50% robust: PREDICTED from the two rows above)"]["seconds"]
    assert min(low, high) <= predicted <= max(low, high) and "PREDICTED" in md


@reads_the_suite
def test_bf16_check_smoke():
    real_data()  # the suite's bf16 part trains on it
    record, md = from_suite("bf16", "bf16-robustness")
    assert [r["train_amp"] for r in record["rows"]] == ["off", "bf16"]
    assert "within noise" in md or "OUTSIDE noise" in md


def test_stop_vote_smoke(tmp_path):
    smoke("investigations/bench_stop_vote.py", tmp_path, cpu_s=11)
    record, md = results(tmp_path, "stop-vote")
    rows = {(r["what"], r["step_ms"]): r for r in record["rows"]}
    assert rows[("now (blocking vote)", None)]["us_per_call"] > 0
    assert rows[("lagged, per boundary", 1.0)]["us_per_call"] > 0 and "us_added_per_step" in rows[
        ("lagged, per boundary", 1.0)]
    assert rows[("no vote, per boundary", 1.0)]["ms_per_step"] >= 1.0 and "us added per step" in md


def test_cpu_layout_smoke(tmp_path):
    from bench.investigations import cpu_layout

    in_process(cpu_layout.main, tmp_path)
    record, md = results(tmp_path, "cpu-layout")
    assert sorted((r["amp"], r["layout"]) for r in record["rows"]) == [
        ("bf16", "NCHW"), ("bf16", "channels_last"), ("fp32", "NCHW"), ("fp32", "channels_last")]
    assert all(r["wall_s"] > 0 and r["cpu_s"] > 0 and len(r["wall_windows"]) == 2 for r in record["rows"])
    assert sum(r["wall_fastest_here"] for r in record["rows"]) == 1 and "channels_last / NCHW" in md
