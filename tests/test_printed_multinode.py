"""The ``continue with:`` line of a run on several nodes (issue 49, item 6) is the launcher's command each node runs
again, with the options the run was started with (--nnodes, --rdzv-*, --node-rank), as
tests/test_printed_commands.py proves for one node. Two nodes here are two torchrun launchers on this machine meeting
through a c10d rendezvous, as two hosts would.
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastfair.rundir import RunDir
from fastfair.scaleout import distributed
from test_printed_commands import TRAIN
from test_signals import ROOT, STEP, ended, held, release, start, wait_held


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.fault
@pytest.mark.slow
def test_sigterm_to_a_two_node_torchrun_run_prints_the_command_each_node_runs_again_and_it_continues(tmp_path):
    env, markers = held(tmp_path, STEP, 2)  # both ranks wait before their second step
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # torchrun, as torch installs it
    out = tmp_path / "run"
    launcher = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                f"127.0.0.1:{_free_port()}", "--rdzv-id", "job7"]
    nodes = [start([*launcher, "-m", "fastfair", *TRAIN, "--set", "data.batch_size=20", "--out", str(out)], env)
             for _ in range(2)]
    wait_held(markers, nodes[0], count=2)
    for node in nodes:  # SLURM signals every node's launcher
        node.send_signal(signal.SIGTERM)
    err = "".join(ended(node)[2] for node in nodes)
    said = [line for line in err.splitlines() if line.startswith("fastfair: interrupted")]
    go_on = f"{shlex.join(launcher)} -m fastfair train --out {out} --resume"
    assert said == [f"fastfair: interrupted by SIGTERM in epoch 1 of 2 (3 of 5 steps saved); torchrun's own report "
                    f"after this line (exit code 1) is how it ends on a signal (fastfair-torchrun ends here); continue "
                    f"with: on each of the 2 nodes: {go_on}"], err[-3000:]

    release(markers)
    command = re.search(r"on each of the 2 nodes: (.+)$", said[0]).group(1)  # as printed, on each node
    resumed = [subprocess.Popen(shlex.split(command), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for node in resumed:
        _, node_err = node.communicate(timeout=600)
        assert node.returncode == 0, node_err[-3000:]
    assert [m["epoch"] for m in RunDir(out).read_metrics()] == [1, 2]


@pytest.mark.fault
def test_the_launcher_options_are_read_as_given_and_a_static_rendezvous_says_each_node_s_own_rank(tmp_path,
                                                                                                 monkeypatch):
    """The options come from the launcher's own command line (torchrun starts each rank as its child); a run started
    with --node-rank (a static rendezvous) tells each node to give its own; anything else is not a launcher."""
    script = tmp_path / "torchrun"  # a stand-in for torch's console script: its command line is all that is read
    script.write_text("import time\ntime.sleep(60)\n")
    given = ["--nnodes", "2", "--node-rank", "0", "--master-addr", "node0", "--master-port", "29500",
             "--nproc-per-node", "1"]
    proc = subprocess.Popen([sys.executable, str(script), *given, "-m", "fastfair", *sys.argv[1:]])
    try:
        deadline = time.monotonic() + 30
        # until the child has exec'd the interpreter: before, its command line is pytest's, no launcher's
        while (read := distributed.launcher_options(proc.pid)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert read == given
    finally:
        proc.kill()
        proc.wait()
    assert distributed.launcher_options(os.getpid()) is None  # pytest is no launcher

    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.delenv("FASTFAIR_LAUNCHER", raising=False)
    monkeypatch.setattr(distributed, "launcher_options", lambda: given)
    assert distributed.command("train --out run --resume") == (
        f"on each of the 2 nodes, with its own --node-rank: torchrun {shlex.join(given)} -m fastfair train --out run "
        f"--resume")
