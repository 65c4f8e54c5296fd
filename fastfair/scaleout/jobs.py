"""One grid run as a job: its ``fastfair train`` command, run to the end in a child process, with the
output in ``RUN/train.log`` and the done/failed state in ``RUN/grid-state.json`` (what a re-run reads).

A child runs in its own process group (so stopping it stops whatever it started) and dies with the
grid: on Linux the kernel kills it when the grid process dies, even by ``kill -9``; an interrupted
grid (Ctrl-C, an error) stops its children itself (:func:`stop_children`).
"""
from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fastfair.errors import WriteError
from fastfair.rundir import RunDir, append_text, read_json, write_json_atomic

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()


@dataclass(frozen=True)
class Job:
    """What a launcher needs to run one grid run anywhere (picklable for submitit)."""

    name: str
    run_dir: str
    base: str  # "" for none
    sets: tuple[str, ...]  # "key=value" strings, as --set takes them
    argv: tuple[str, ...] = ()  # another fastfair command instead of train (fastfair zoo's evaluations)

    def command(self) -> list[str]:
        """The train command; ``--resume`` is decided when the job starts (a queued job may start late)."""
        if self.argv:
            return [sys.executable, "-m", "fastfair", *self.argv]
        cmd = [sys.executable, "-m", "fastfair", "train", "--out", self.run_dir, "--quiet"]
        cmd += ["--config", self.base] if self.base else []
        cmd += [a for s in self.sets for a in ("--set", s)]
        # a run with a saved config resumes, from its checkpoint or (killed in its first epoch) from the start
        return cmd + (["--resume"] if RunDir(self.run_dir).config.is_file() else [])


def read_state(run_dir: str | Path) -> dict:
    path = RunDir(run_dir).grid_state
    return read_json(path) if path.is_file() else {"status": "pending"}


def _write_state(run_dir: str | Path, state: dict) -> None:
    write_json_atomic(state, RunDir(run_dir).grid_state)


def _child_setup(grid_pid: int) -> None:
    """In the child before exec: die with the grid (Linux); the new session is Popen's own."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != grid_pid:  # the grid died before the line above: nobody to die with
            os._exit(1)


def stop_children(grace_s: float = 10.0) -> None:
    """Stop every running child's process group: SIGTERM, then SIGKILL after ``grace_s``."""
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in children:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
        deadline = time.time() + grace_s
        while any(p.poll() is None for p in children) and time.time() < deadline:
            time.sleep(0.05)


def run_job(job: Job, env: dict[str, str] | None = None) -> str:
    """Run one training to the end in a child process; record done/failed; return the status."""
    run = RunDir(job.run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    previous = read_state(run.path)
    cmd = job.command()
    state = {"status": "running", "attempt": previous.get("attempt", 0) + 1, "command": cmd,
             "started": time.time(), "host": os.uname().nodename}
    _write_state(run.path, state)
    append_text(f"\n# attempt {state['attempt']}: {' '.join(cmd)}\n", run.train_log)
    with open(run.train_log, "a") as log:  # the child's output: its writes fail in the child, which says so
        start = log.tell()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                start_new_session=True, preexec_fn=functools.partial(_child_setup, os.getpid()))
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            _write_state(run.path, {**state, "pid": proc.pid})
            code = proc.wait()
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
    state.update(status="done" if code == 0 else "failed", returncode=code, ended=time.time())
    if code:
        state["error"] = _why(run.train_log, start, code)
    _write_state(run.path, state)
    return state["status"]


def _why(log: Path, start: int, code: int) -> str:
    """The line that says why a child failed, from its part of the log: its last ``fastfair: error:`` line,
    else (a crash) the last line of its traceback, else how it ended."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    with open(log, "rb") as f:
        f.seek(max(start, f.seek(0, os.SEEK_END) - 65536))  # the end is enough; a log may be long
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("fastfair: error:")]
    if errors:
        return errors[-1]
    if "Traceback (most recent call last):" in lines:
        return lines[-1]
    if code == WriteError.exit_code:  # its error line went to a log on the disk it could not write
        return f"exit code {code}: a file could not be written (a full or failing disk)"
    return f"exit code {code}"


def outcome(name: str, run_dir: str | Path) -> str:
    """One line for a run that did not finish: why, and where its log is."""
    state = read_state(run_dir)
    why = state.get("error") or {"running": "its process ended before it could record why (killed?)",
                                 "pending": "never started"}.get(state["status"], state["status"])
    return f"{name}: {why} (log: {RunDir(run_dir).train_log})"
