"""Cluster dispatch: the submitit launcher, in submitit's local mode, runs a 2-run grid end to end;
a stopped grid stops its children's process groups."""
import json
import os
import signal
import threading
import time

import pytest

from fastfair import config
from fastfair.errors import UserError
from fastfair.scaleout.grid import run_grid
from fastfair.scaleout.jobs import Job, read_state, run_job, stop_children
from fastfair.scaleout.launchers import parse_gpus
from helpers import needs_extra

from test_grid import TINY, _alive


def test_gpu_lists():
    assert parse_gpus("cpu") == []
    assert parse_gpus("0, 2") == ["0", "2"]
    with pytest.raises(UserError, match="comma-separated GPU ids"):
        parse_gpus("gpu0")


@pytest.mark.slow
def test_submitit_local_mode_runs_a_two_run_grid(tmp_path):
    needs_extra("submitit")
    path = tmp_path / "g.toml"
    path.write_text(TINY + '[[axes]]\nkey = "train.seed"\nvalues = [0, 1]\n[launcher.submitit]\ncluster = "local"\n')
    out = tmp_path / "out"
    lines = []
    assert run_grid(str(path), out=str(out), gpus="cpu", launcher="submitit", sets=["train.epochs=1"],
                    echo=lines.append) == 0
    assert any("submitted 2 array task(s)" in line for line in lines)  # --per-gpu 1: one run per task
    for run in ("seed=0", "seed=1"):
        assert json.loads((out / run / "grid-state.json").read_text())["status"] == "done"
        assert config.load_saved(out / run / "config.toml")["train"]["epochs"] == 1  # the grid's --set went along
    table = (out / "results.md").read_text().splitlines()
    # one group: the two seeds folded by fastfair report's table
    (row,) = [line for line in table[2:] if line.startswith("|")]
    assert "Intervals (95 %)" in table[-1]  # what the table's intervals are, said below it
    assert row.split("|")[2].strip() == "2"
    again = []  # a second call finds both runs done and submits nothing
    assert run_grid(str(path), out=str(out), gpus="cpu", launcher="submitit", sets=["train.epochs=1"],
                    echo=again.append) == 0
    assert "2 done" in again[0] and not any("submitted" in line for line in again)


def test_a_stopped_grid_stops_its_children_and_what_they_started(tmp_path, monkeypatch):
    # the child starts a grandchild (as torchrun or a data worker would) and waits on it
    grandchild_pid = tmp_path / "grandchild.pid"
    monkeypatch.setattr(Job, "command", lambda self: ["sh", "-c", f"sleep 60 & echo $! > {grandchild_pid}; wait"])
    job = Job("r", str(tmp_path / "r"), "", ())
    statuses = []
    thread = threading.Thread(target=lambda: statuses.append(run_job(job)))
    thread.start()
    deadline = time.time() + 30
    while not (grandchild_pid.is_file() and grandchild_pid.read_text().strip() and "pid" in read_state(job.run_dir)):
        assert time.time() < deadline
        time.sleep(0.02)
    state = read_state(job.run_dir)
    assert state["status"] == "running" and os.getpgid(state["pid"]) == state["pid"]  # a group of its own
    stop_children(grace_s=5)
    thread.join(10)
    # stopped by the grid, not failed: a re-run resumes it
    assert statuses == ["interrupted"] and read_state(job.run_dir)["returncode"] == -signal.SIGTERM
    grandchild = int(grandchild_pid.read_text())
    deadline = time.time() + 5
    while _alive(grandchild):
        assert time.time() < deadline, "the child's own child survived"
        time.sleep(0.02)
