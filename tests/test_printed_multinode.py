"""The ``continue with:`` line of a run on several nodes (issue 49, item 6) is the launcher's command each node runs
again, with the options the run was started with (--nnodes, --rdzv-*, --node-rank): read from the launcher's command
line here; two nodes (two torchrun launchers on this machine meeting through a c10d rendezvous, as two hosts would)
stopped by SIGTERM and resumed as printed in
tests/test_signals.py::test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_resume_gives_the_uninterrupted_weights.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time

import pytest

from fastfair.scaleout import distributed


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
