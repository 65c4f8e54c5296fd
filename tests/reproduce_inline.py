"""What the end-to-end ``fastfair reproduce`` tests share: a grid whose runs train in this process.

A grid job is ``python -m fastfair train ...`` in a child process (:mod:`fastfair.scaleout.jobs`): an interpreter,
torch, fastfair's training modules and Dynamo imported again, some 12 CPU s a run (Tian et al.'s Table 2, 4 runs: 89
CPU s in children, 41 in the test's process), where a run of these tests trains and scores in a few.
:func:`runs_inline` keeps everything of the grid but the process: the launcher's slots, echo lines and done/failed
bookkeeping (``run_job``, ``run_concurrently``) are the real ones, and the child's command is the one ``cli.main``
runs here, its output into the run's ``train.log``. One test keeps the child process (test_figures_cfa.py's benz-f1,
a single run through the CLI)."""
from __future__ import annotations

import contextlib
import os
import subprocess
import types

from fastfair import cli
from fastfair.scaleout import jobs, launchers

from helpers import TINY_SUBSET


class _Here:
    """``subprocess.Popen`` for ``python -m fastfair ...``: the command run to its end by ``cli.main`` in this
    process (the main thread, which a command's stop-signal handler needs), with the slot's environment."""

    def __init__(self, cmd, *, stdout, env, **_):
        assert cmd[1:3] == ["-m", "fastfair"], cmd
        before = dict(os.environ)
        os.environ.update(env)
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stdout):
                self.returncode = cli.main(cmd[3:])
        finally:
            os.environ.clear()
            os.environ.update(before)
        self.pid = os.getpid()

    def wait(self) -> int:
        return self.returncode

    def poll(self) -> int:
        return self.returncode


class _OneAtATime:
    """``ThreadPoolExecutor`` running each job in turn on the calling thread."""

    def __init__(self, max_workers: int):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def map(self, fn, items):
        return map(fn, items)

    def shutdown(self, **_) -> None:
        pass


def runs_inline(monkeypatch) -> None:
    """The local launcher's jobs run one at a time in this process (see the module's doc)."""
    monkeypatch.setattr(jobs, "subprocess", types.SimpleNamespace(Popen=_Here, STDOUT=subprocess.STDOUT))
    monkeypatch.setattr(launchers, "ThreadPoolExecutor", _OneAtATime)


def tiny(*sets: str) -> list[str]:
    """``--set`` arguments for ``fastfair reproduce``: :data:`helpers.TINY_SUBSET`, then ``sets`` (which win)."""
    return [a for s in (*TINY_SUBSET, *sets) for a in ("--set", s)]
