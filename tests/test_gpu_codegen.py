"""bench/lease/gpu_codegen.py --smoke: Inductor's CUDA code for a compiled training step, generated on a CPU, counted
and turned into labelled predictions (TRADES, tiny CNN, batch 8, PGD-2; --kernels torch and triton)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import once_per_run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


# The three runs the tests read, in one process (bench/lease/gpu_codegen.py's main, each with its arguments after
# --smoke): one start of torch, Inductor and Triton, not three, and a graph compiled once (the update graphs of K = 2,
# 4, 6 are the same; the smoke run's K = 2 graphs are the extrapolation's basis)
RUNS = {"smoke": (), "extrapolated": ("--kernels", "torch", "--steps-from", "2", "4", "--attack-steps", "6",
                                      "--validate"),
        "cpp": ("--kernels", "torch", "--cpp-wrapper")}


@pytest.fixture(scope="module")
def runs() -> dict[str, tuple[dict, str]]:
    """{run: (its JSON record, its Markdown)} of ``gpu_codegen.py --smoke ARGS`` for each of RUNS, made once per pytest
    run (helpers.once_per_run) in one process of its own (the script sets TRITON_INTERPRET=0 for itself); the process
    fails if a run's main returns non-zero."""
    def make(out: Path) -> None:
        # one thread: the recorded steps are a tiny CNN's, and OpenMP threads that spin on a shared machine burn CPU
        # for nothing (tests/test_bench_smoke.py's ONE_THREAD; Inductor compiles in one thread here anyway)
        env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        argvs = {name: ["--smoke", "--out", str(out / name), *args] for name, args in RUNS.items()}
        code = ("import sys; from bench.lease import gpu_codegen as g; "
                f"sys.exit(max(g.main(a) for a in {list(argvs.values())!r}))")
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                              capture_output=True, text=True, timeout=1800)
        (out / "proc.json").write_text(json.dumps({"returncode": proc.returncode, "stdout": proc.stdout,
                                                   "stderr": proc.stderr}))

    out = once_per_run("gpu-codegen-smoke", make)
    proc = json.loads((out / "proc.json").read_text())
    assert proc["returncode"] == 0, proc["stdout"][-3000:] + proc["stderr"][-3000:]
    done = {}
    for name in RUNS:
        (md,) = (out / name).glob("gpu-codegen-predicted-smoke-*.md")
        (js,) = (out / name).glob("gpu-codegen-predicted-smoke-*.json")
        done[name] = json.loads(js.read_text()), md.read_text()
    return done


def refusals(record: dict) -> list[str]:
    """Every reason Inductor gave not to record a region of a configuration as a CUDA graph, or a configuration that
    was not counted: what train.cudagraphs=auto (on for CUDA runs that compile) must not meet."""
    said = []
    for r in record["rows"]:
        name = f"{r['method']} {r['model']} {r['batch']} {r['kernels']}"
        said += [f"{name}: not counted ({r['error']})"] if "error" in r else []
        said += [f"{name}: {why}" for why in r.get("cudagraph_refused", [])]
        said += [f"{name}, {g['kind']} graph: {why}"
                 for g in r.get("graph_detail", []) for why in g["cudagraph_refused"]]
    return said


@pytest.fixture(scope="module")
def smoke(runs):
    return runs["smoke"]


def test_results_are_labelled_predictions(smoke):
    record, md = smoke
    assert record["kind"].startswith("PREDICTION") and md.startswith("# PREDICTED")
    assert record["header"]["device"].startswith("none")


def test_the_step_is_compiled_for_cuda_and_counted(smoke):
    rows = {r["kernels"]: r for r in smoke[0]["rows"]}
    assert set(rows) == {"torch", "triton"}
    for r in rows.values():
        # the attack (one inference graph with its input gradients) and the update's forward and backward
        assert sorted(r["graph_kinds"]) == ["backward", "forward", "inference"]
        assert r["triton_launches"] > 0 and r["extern_launches"] > 0  # fused Triton kernels and cuDNN convolutions
        assert r["launches"] == r["launches_in_graphs"] + r["launches_outside"]
        assert r["inductor_gb"] > 0 and r["step_gflop"] > 0
        # channels_last on: cuDNN's convolutions and input gradients write NHWC, as on a GPU (not torch's
        # no-GPU NCHW fallback, which made Inductor write each activation in both layouts)
        assert r["conv_nchw_outputs"] == 0
        assert 0 < r["h100_s_cuda_graphs"] <= r["h100_s_no_graphs"]
        assert r["h100_s_cuda_graphs"] <= r["a100_s_cuda_graphs"]  # same work, a slower device (or the host's pace)
        host = smoke[0]["settings"]["host_launch_us"] * 1e-6
        assert r["h100_s_no_graphs"] == pytest.approx(r["launches"] * host)  # a tiny CNN: the host sets the pace
    assert not refusals(smoke[0])  # Inductor would record every region as a CUDA graph
    # fastfair's kernels inside the graphs: TRADES-PGD-2 has two loss rows and two steps, the update one loss row
    assert rows["triton"]["user_triton_launches"] == 5 and rows["torch"]["user_triton_launches"] == 0
    assert rows["triton"]["eager_ops"].get("fastfair::random_start (eager, one kernel)") == 1


def test_counts_extrapolated_in_attack_steps_equal_the_generated_ones(runs):
    # the full grid's rows at PGD-10 are extrapolated from K = 2 and 4: generated at K = 6 too, the launch counts
    # must equal the extrapolation exactly (Inductor's bytes within BYTES_RTOL); the script fails otherwise
    record, _ = runs["extrapolated"]
    (check,) = record["validation"]
    assert check["differences"] == {} and check["extrapolated"] == "extrapolated from K=2,4"
    rows = {r["source"]: r for r in record["rows"]}
    assert rows.keys() == {"generated", "extrapolated from K=2,4"}
    extrapolated, generated = rows["extrapolated from K=2,4"], rows["generated"]
    assert extrapolated["launches"] == generated["launches"]
    assert [b["attack_steps"] for b in extrapolated["basis"]] == [2, 4]
    # the attack graph grows with K, the update graphs do not
    (lo, hi) = (b["graph_detail"] for b in extrapolated["basis"])
    assert hi[0]["triton"] > lo[0]["triton"] and [g["triton"] for g in hi[1:]] == [g["triton"] for g in lo[1:]]


def test_no_committed_configuration_has_a_region_inductor_would_not_graph():
    """The committed counts (every configuration, each --set variant, both torch ends): no region that Inductor's
    compile-time checks refuse to record as a CUDA graph, the premise of CUDA graphs as the CUDA default."""
    files = sorted((ROOT / "bench" / "results").glob("gpu-codegen-predicted-*.json"))
    records = {f.name: json.loads(f.read_text()) for f in files}
    full = records["gpu-codegen-predicted-torch2.13.0.json"]
    assert full["settings"]["done"] == len(full["settings"]["grid"]) == 60
    for name, record in records.items():
        assert not refusals(record), name
    # the check can fail: one refusal in one graph of one row
    record = json.loads(json.dumps(full))
    row = record["rows"][0]
    row["graph_detail"][1]["cudagraph_refused"] = ["mutated inputs (1 instances)"]
    assert refusals(record) == [f"{row['method']} {row['model']} {row['batch']} {row['kernels']}, "
                                f"{row['graph_detail'][1]['kind']} graph: mutated inputs (1 instances)"]


def test_the_cpp_wrapper_for_cuda_is_generated_without_a_gpu(smoke, runs):
    """--cpp-wrapper: Inductor's C++ wrapper for CUDA, as train.cpp_wrapper=on with CUDA graphs compiles it, written
    on a CPU (torch 2.13; torch 2.11 tunes every Triton kernel on the device while writing it). It calls the same
    kernels as the Python wrapper, so the same launches, now from C++; no region is refused a CUDA graph."""
    record, md = runs["cpp"]
    (cpp,) = record["rows"]
    (python,) = [r for r in smoke[0]["rows"] if r["kernels"] == "torch"]
    assert cpp["wrapper"] == "C++" and python["wrapper"] == "Python" and "| C++ |" in md
    for key in ("triton_launches", "extern_launches", "aten_launches", "launches_outside", "graph_kinds"):
        assert cpp[key] == python[key], key
    assert cpp["inductor_gb"] == pytest.approx(python["inductor_gb"], rel=1e-6) and cpp["conv_nchw_outputs"] == 0
    assert not refusals(record)
    # without graphs, the host's cost per launch from C++ is not measured: no prediction
    assert cpp["h100_s_epoch_no_graphs"] is None and cpp["h100_s_epoch_cuda_graphs"] > 0
