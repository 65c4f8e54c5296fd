"""One grid run as a job: its ``fastfair train`` command, run to the end in a child process, with the
output in ``RUN/train.log`` and the done/failed state in ``RUN/grid-state.json`` (what a re-run reads)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fastfair.rundir import RunDir, write_text_atomic


@dataclass(frozen=True)
class Job:
    """What a launcher needs to run one grid run anywhere (picklable for submitit)."""

    name: str
    run_dir: str
    base: str  # "" for none
    sets: tuple[str, ...]  # "key=value" strings, as --set takes them

    def command(self) -> list[str]:
        """The train command; ``--resume`` is decided when the job starts (a queued job may start late)."""
        cmd = [sys.executable, "-m", "fastfair", "train", "--out", self.run_dir, "--quiet"]
        cmd += ["--config", self.base] if self.base else []
        cmd += [a for s in self.sets for a in ("--set", s)]
        return cmd + (["--resume"] if RunDir(self.run_dir).last.is_file() else [])


def read_state(run_dir: str | Path) -> dict:
    path = RunDir(run_dir).grid_state
    return json.loads(path.read_text()) if path.is_file() else {"status": "pending"}


def _write_state(run_dir: str | Path, state: dict) -> None:
    write_text_atomic(json.dumps(state, indent=1), RunDir(run_dir).grid_state)


def run_job(job: Job, env: dict[str, str] | None = None) -> str:
    """Run one training to the end in a child process; record done/failed; return the status."""
    run = RunDir(job.run_dir)
    run.path.mkdir(parents=True, exist_ok=True)
    previous = read_state(run.path)
    cmd = job.command()
    state = {"status": "running", "attempt": previous.get("attempt", 0) + 1, "command": cmd,
             "started": time.time(), "host": os.uname().nodename}
    _write_state(run.path, state)
    with open(run.train_log, "a") as log:
        log.write(f"\n# attempt {state['attempt']}: {' '.join(cmd)}\n")
        log.flush()
        code = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}).returncode
    state.update(status="done" if code == 0 else "failed", returncode=code, ended=time.time())
    _write_state(run.path, state)
    return state["status"]
