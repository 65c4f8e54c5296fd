"""bench/lease/gpu_suite.py: every part runs in --smoke on a CPU; the suite keeps to its time, records
failures and resumes where it stopped."""
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from bench.lease import gpu_suite

from helpers import gpu_suite_smoke, gpu_suite_smoke_command, real_data

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_every_part_runs_in_smoke_and_a_rerun_skips_them(tmp_path):
    # the bf16 and real-epoch parts train on the real CIFAR-10 subset, found where the tests found it; the smoke run
    # is the one of this pytest run (tests/test_bench_smoke.py checks its benches' results)
    real_data()
    out, proc = gpu_suite_smoke()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = {p.name: json.loads(p.read_text()) for p in (out / "gpu-suite").glob("*.json")}
    assert sorted(records) == sorted(f"{part.name}-smoke.json" for part in gpu_suite.PARTS)
    assert all(r["status"] == "ok" for r in records.values()), {k: r["status"] for k, r in records.items()}
    assert records["env-smoke.json"]["result"]["header"]["torch"]
    epoch = records["real-epoch-smoke.json"]["result"]
    assert len(epoch["epoch_train_s"]) == 2 and epoch["wall_s"] > sum(epoch["epoch_train_s"])
    with tarfile.open(out.parent / "packed" / "gpu-suite.tar.gz") as tar:
        names = tar.getnames()
    assert {"gpu-suite/plan-training-smoke.json", "training-plan-smoke-cpu.md", "concurrency-smoke-cpu.json",
            "eval-aa-10k-smoke-cpu.md", "gpu-suite/gpu-tests-junit.xml"} <= set(names)
    plan = json.loads((out / "training-plan-smoke-cpu.json").read_text())["rows"]
    assert {r["loop"] for r in plan} == {"reference", "fastfair"}  # both loops, in each configuration's process
    assert not any("/work/" in n or n.startswith("gpu-suite/work") for n in names)  # no run folders
    # the rerun in a copy: the shared run's files are read, never written
    shutil.copytree(out, tmp_path / "r")
    cmd, env = gpu_suite_smoke_command(tmp_path / "r", tmp_path / "packed")
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    ran = [line.split(":")[0] for line in again.stdout.splitlines() if line.startswith("== ")]
    assert again.returncode == 0 and set(ran) == {"== env"}  # nothing left but the machine's own record


def test_parts_that_do_not_fit_wait_failures_are_recorded_and_a_rerun_resumes(tmp_path, monkeypatch, capsys):
    ran = []

    def work(name, fail=False):
        def run(a, _):
            ran.append(name)
            if fail:
                raise RuntimeError("the GPU said no")
            return {"value": name}
        return run

    monkeypatch.setattr(gpu_suite, "PARTS", (
        gpu_suite.Part("small", "fits", 10, run=work("small")),
        gpu_suite.Part("huge", "does not fit in 100 s", 1000, run=work("huge")),
        gpu_suite.Part("broken", "fails", 10, run=work("broken", fail=True)),
    ))
    monkeypatch.setattr(gpu_suite.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_suite, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    args = ["--out", str(tmp_path), "--max-s", "100"]
    assert gpu_suite.main(args) == 1  # broken failed
    assert ran == ["small", "broken"]
    out = capsys.readouterr().out
    assert "not run, no time left: huge" in out and "failed: broken" in out
    record = json.loads((tmp_path / "gpu-suite" / "broken.json").read_text())
    assert record["status"] == "failed: RuntimeError: the GPU said no"
    ran.clear()
    gpu_suite.main(["--out", str(tmp_path), "--max-s", "2000"])
    assert ran == ["huge", "broken"]  # small is done; the failed part is tried again
    ran.clear()
    monkeypatch.setattr(gpu_suite, "device_name", lambda: "NVIDIA H200")
    gpu_suite.main(["--out", str(tmp_path), "--max-s", "2000"])
    assert ran == ["small", "huge", "broken"]  # done on an H100 is still to do on an H200
    with pytest.raises(SystemExit):
        gpu_suite.main(["--out", str(tmp_path), "--only", "nosuchpart"])


def test_without_a_gpu_the_full_suite_refuses_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_suite.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_suite.main(["--out", str(tmp_path)])
    assert "use --smoke" in capsys.readouterr().err


def test_a_part_alongside_runs_beside_the_next_which_waits_for_it_to_time_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_suite, "PARTS", (
        gpu_suite.Part("main", "times after the other", 10, alongside="tests",
                       args=lambda a: ["-c", "import sys; print('args', sys.argv[1:])"]),
        gpu_suite.Part("tests", "runs alongside", 10, args=lambda a: ["-c", "import time; time.sleep(1)"]),
    ))
    monkeypatch.setattr(gpu_suite.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gpu_suite, "device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert gpu_suite.main(["--out", str(tmp_path), "--max-s", "100"]) == 0
    out = capsys.readouterr().out
    assert "== main: times after the other (~10 s, " in out and "; tests alongside" in out
    assert "== tests (alongside): ok" in out and "== tests: runs alongside" not in out  # not run a second time
    main = json.loads((tmp_path / "gpu-suite" / "main.json").read_text())
    tests = json.loads((tmp_path / "gpu-suite" / "tests.json").read_text())
    assert main["status"] == tests["status"] == "ok" and "args ['--after-pid', '" in main["output_tail"]
    assert tests["seconds"] >= 1
