"""bench/gpu_codegen.py --smoke: Inductor's CUDA code for a compiled training step, generated on a CPU, counted
and turned into labelled predictions (TRADES, tiny CNN, batch 8, PGD-2; --kernels torch and triton)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("codegen")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_codegen.py"), "--smoke", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (md,) = out.glob("gpu-codegen-predicted-smoke-*.md")
    (js,) = out.glob("gpu-codegen-predicted-smoke-*.json")
    return json.loads(js.read_text()), md.read_text()


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
    # fastfair's kernels inside the graphs: TRADES-PGD-2 has two loss rows and two steps, the update one loss row
    assert rows["triton"]["user_triton_launches"] == 5 and rows["torch"]["user_triton_launches"] == 0
    assert rows["triton"]["eager_ops"].get("fastfair::random_start (eager, one kernel)") == 1


def test_counts_extrapolated_in_attack_steps_equal_the_generated_ones(tmp_path):
    # the full grid's rows at PGD-10 are extrapolated from K = 2 and 4: generated at K = 6 too, the launch counts
    # must equal the extrapolation exactly (Inductor's bytes within BYTES_RTOL); the script fails otherwise
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_codegen.py"), "--smoke", "--kernels", "torch",
                           "--steps-from", "2", "4", "--attack-steps", "6", "--validate", "--out", str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (js,) = tmp_path.glob("gpu-codegen-predicted-smoke-*.json")
    record = json.loads(js.read_text())
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
