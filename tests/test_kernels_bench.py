"""bench/bench_kernels.py --smoke runs wherever the tests run (CPU: Triton interpreter)."""
import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_kernels.py"


def test_bench_smoke_writes_table_and_json(tmp_path, capsys):
    pytest.importorskip("fastfair.kernels")
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    bench.main(["--smoke", "--reps", "1", "--warmup", "1", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "| kind | objective | N | C |" in out
    (path,) = tmp_path.glob("kernels-smoke-*.json")
    data = json.loads(path.read_text())
    assert data["torch"] and data["triton"] and data["device"]
    assert all(r["max_abs_err"] < 1e-4 for r in data["rows"])


def test_a_failing_row_is_recorded_not_fatal():
    spec = importlib.util.spec_from_file_location("bench_kernels", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.guarded(lambda n: 1 // n, 0) == {"error": "ZeroDivisionError: integer division or modulo by zero"}
    assert "| loss | ce | 8 | 10 | - |" in bench.markdown([{"kind": "loss", "objective": "ce", "N": 8, "C": 10,
                                                            "error": "boom"}])
