"""Progress of long loops: a bar on a terminal, plain periodic lines elsewhere (a cluster log), and a log file.

On a terminal a rich bar redraws in place. Where the output is a file or a pipe, a bar would write
nothing useful, so every ``every_s`` seconds one plain line says where the loop is:
``epoch 3/10  step 120/391  1850 img/s  ETA 0:02:27, run 0:19:40`` (the run: its later epochs' steps at this
epoch's pace, validation not counted). Lines and (when ``log_file`` is given) the
same periodic lines are appended to a log file too, so a run folder tells how far it got.

Only host values are read: the step count and the wall clock. No tensor is read per step, so the
training step keeps its one sync per epoch. On CUDA the clock measures how fast steps are queued,
which follows the GPU's pace once the queue is full; the epoch's figure in the console line after it
is the exact one.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.text import Text
from rich.progress import (BarColumn, MofNCompleteColumn, ProgressColumn, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.progress import Progress as RichProgress

from fastfair.rundir import append_text

EVERY_S = 30.0  # default seconds between plain progress lines (train.progress_every_s)


def _same_file(path: Path, stream) -> bool:
    """Whether ``stream`` already writes to ``path`` (a grid sends a run's stdout to its train.log)."""
    try:
        return path.exists() and os.path.samestat(os.fstat(stream.fileno()), os.stat(path))
    except (OSError, ValueError, AttributeError):  # a stream without a file (pytest's capture)
        return False


def note_in_log(log_file: str | Path, line: str) -> None:
    """Append a line said outside any :class:`Progress` (Ctrl-C's, printed as the command ends) to a run's log,
    unless stderr already goes there; nothing when the run folder was never made."""
    log = Path(log_file)
    if log.parent.is_dir() and not _same_file(log, sys.stderr):
        append_text(line + "\n", log)


def _clock(seconds: float) -> str:
    return str(datetime.timedelta(seconds=round(seconds)))


class Progress:
    def __init__(self, enabled: bool = True, every_s: float = EVERY_S, log_file: str | Path | None = None,
                 clock=None):
        self.enabled, self.every_s = enabled, every_s
        self.clock = clock or time.monotonic  # seconds; a test's own clock renders without racing the real one
        self.console = Console(highlight=False)
        self.log_file: Path | None = None
        # lines said before the run folder was ready (the quick-run note): written when it is attached
        self._early: list[str] | None = []
        if log_file:
            self.attach(log_file)

    def attach(self, log_file: str | Path) -> None:
        """Append lines to ``log_file`` from now on (and the lines said before), unless stdout already goes there."""
        log = Path(log_file)
        self.log_file = None if _same_file(log, sys.stdout) else log
        early, self._early = self._early or [], None
        for line in early:
            self._to_file(line)

    def print(self, *args) -> None:
        if self.enabled:
            self.console.print(*args, markup=False, soft_wrap=True)
        self._to_file(" ".join(map(str, args)))

    def warn(self, message: str) -> None:
        """A warning: on stderr even with the progress off (--quiet, train.progress=false), and in the log file."""
        print(f"fastfair: warning: {message}", file=sys.stderr)
        self._to_file(f"warning: {message}")

    def _to_file(self, line: str) -> None:
        if self._early is not None:
            self._early.append(line)
        elif self.log_file:
            append_text(line + "\n", self.log_file)

    def line(self, description: str, done: int, total: int, seconds: float, images_per_step: int | None,
             later: int = 0, unit: str = "step") -> str:
        """``description  step done/total  N img/s  ETA h:mm:ss`` from host numbers; with ``later`` (steps of the
        run after this task, as fast as this one's) ``ETA h:mm:ss, run h:mm:ss``."""
        rate = done / seconds if seconds > 0 else 0.0
        speed = f"  {rate * images_per_step:.0f} img/s" if images_per_step else ""
        eta = _clock((total - done) / rate) if rate > 0 else "?"
        run = (f", run {_clock((total - done + later) / rate) if rate > 0 else '?'}" if later else "")
        return f"{description}  {unit} {done}/{total}{speed}  ETA {eta}{run}"

    @contextlib.contextmanager
    def task(self, description: str, total: int, images_per_step: int | None = None, later: int = 0,
             unit: str = "step"):
        """Yields ``advance(n=1)``: a transient bar on a terminal; on other output and in the log file a plain line
        every ``every_s`` seconds. ``later``: the steps the run still has after this task (a training run's later
        epochs), which its ETA includes; ``unit``: what ``total`` counts."""
        bar_on = self.enabled and self.console.is_terminal
        plain_on = self.enabled and not bar_on
        if not (bar_on or plain_on or self.log_file):
            yield lambda n=1: None
            return
        t0 = last = self.clock()
        done = 0

        def tick(n: int = 1) -> None:
            nonlocal done, last
            done += n
            now = self.clock()
            if now - last >= self.every_s and done < total:
                last = now
                text = self.line(description, done, total, now - t0, images_per_step, later, unit)
                if plain_on:
                    print(text, flush=True)
                self._to_file(text)

        if not bar_on:
            yield tick
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit + "s"),
                   TimeElapsedColumn(), TimeRemainingColumn(), *([RunRemaining(later)] if later else []))
        with RichProgress(*columns, console=self.console, transient=True, get_time=self.clock) as bar:
            tid = bar.add_task(description, total=total)

            def advance(n: int = 1) -> None:
                bar.advance(tid, n)
                tick(n)
            yield advance


class RunRemaining(ProgressColumn):
    """The run's time left on a bar: this task's steps left and ``later`` more, at the task's speed."""

    def __init__(self, later: int):
        super().__init__()
        self.later = later

    def render(self, task) -> Text:
        left = (task.remaining or 0) + self.later
        return Text(f"run {_clock(left / task.speed) if task.speed else '-:--:--'}", style="progress.remaining")
