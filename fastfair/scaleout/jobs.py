"""One grid run as a job: its ``fastfair train`` command, run to the end in a child process, with the
output in ``RUN/train.log`` and the done/failed state in ``RUN/grid-state.json`` (what a re-run reads).

A child runs in its own process group (so stopping it stops whatever it started) and dies with the
grid: on Linux the kernel kills it when the grid process dies, even by ``kill -9``; an interrupted
grid (a stop signal, an error) stops its children itself (:func:`stop_children`): SIGTERM, so each
saves at its next step boundary and is marked interrupted, and a re-run resumes it.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from fastfair import stopping
from fastfair.errors import Interrupted, WriteError
from fastfair.rundir import RunDir, append_text, read_json, write_json_atomic

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()
# how a child a stop signal ended exits: 128 + the signal after saving (fastfair.stopping), or killed by it (a
# signal before its handler was in place)
_STOPPED_CODES = {code for s in stopping.SIGNALS for code in (stopping.exit_code(s), -s)}


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


def _child_setup(grid_pid: int, ignored: tuple[int, ...]) -> None:
    """In the child before exec: die with the grid (Linux), and ignore ``ignored`` (an ignored signal stays
    ignored across exec); the new session is Popen's own."""
    for sig in ignored:
        signal.signal(sig, signal.SIG_IGN)
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != grid_pid:  # the grid died before the line above: nobody to die with
            os._exit(1)


def stop_children(grace_s: float = 60.0) -> None:
    """Stop every running child's process group: SIGTERM, so a training saves at its next step boundary (a step
    and a checkpoint take seconds on a GPU), then SIGKILL after ``grace_s``. A second SIGTERM or SIGUSR1 to the
    grid meanwhile does not cut the wait short; a second Ctrl-C does."""
    with _CHILDREN_LOCK:
        children = list(_CHILDREN)
    with stopping.deferred():
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


def run_job(job: Job, env: dict[str, str] | None = None, ignored: tuple[int, ...] = ()) -> str:
    """Run one training to the end in a child process (which ignores the signals ``ignored``); record done,
    interrupted (a stop signal ended it; it resumes) or failed; return the status."""
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
                                start_new_session=True,
                                preexec_fn=functools.partial(_child_setup, os.getpid(), tuple(ignored)))
        with _CHILDREN_LOCK:
            _CHILDREN.add(proc)
        try:
            _write_state(run.path, {**state, "pid": proc.pid})
            code = proc.wait()
        finally:
            with _CHILDREN_LOCK:
                _CHILDREN.discard(proc)
    status = "done" if code == 0 else "interrupted" if code in _STOPPED_CODES else "failed"
    state.update(status=status, returncode=code, ended=time.time())
    if code:
        state["error"] = _why(run.train_log, start, code)
    _write_state(run.path, state)
    return state["status"]


def _why(log: Path, start: int, code: int) -> str:
    """The line that says why a child did not finish, from its part of the log: its last ``fastfair: error:`` or
    ``fastfair: interrupted`` line, else (a crash) the last line of its traceback, else how it ended."""
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    with open(log, "rb") as f:
        f.seek(max(start, f.seek(0, os.SEEK_END) - 65536))  # the end is enough; a log may be long
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("fastfair: error:", "fastfair: interrupted"))]
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


def stopped(err: KeyboardInterrupt, runs: list[tuple[str, Path]]) -> Interrupted:
    """The one line of a grid (or table) a stop signal ended, once its children stopped: what each run kept."""
    states = {name: read_state(run_dir) for name, run_dir in runs}
    count = {s: [n for n, st in states.items() if st["status"] == s] for s in ("done", "interrupted", "failed")}
    saved = [f"{name} {_saved(states[name])}" for name in count["interrupted"]]
    started = {n for names in count.values() for n in names}
    parts = [f"{len(count['done'])} done" if count["done"] else "",
             f"{len(saved)} stopped ({'; '.join(saved)})" if saved else "",
             f"{len(count['failed'])} failed" if count["failed"] else "",
             f"{len(runs) - len(started)} not started" if len(started) < len(runs) else ""]
    signum = stopping.signum_of(err)
    return Interrupted(f"interrupted{stopping.said_by(signum)}; runs: {', '.join(p for p in parts if p)}; run the "
                       "same command again to go on (done runs are skipped, the others resume)", signum)


def _saved(state: dict) -> str:
    """Where an interrupted run stopped and what it saved, from its own line ("in epoch 2 of 3 (1 epoch and 5 of 20
    steps saved)"); how it ended where it said nothing (killed before its handler was in place)."""
    said = re.match(r"fastfair: interrupted(?: by \w+)? (.*?);", state.get("error", ""))
    return said.group(1) if said else f"({state.get('error', 'no line')})"
