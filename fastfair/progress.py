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


def hms(seconds: float) -> str:
    """``h:mm:ss`` of a number of seconds, as the ETAs say a time."""
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
        eta = hms((total - done) / rate) if rate > 0 else "?"
        run = (f", run {hms((total - done + later) / rate) if rate > 0 else '?'}" if later else "")
        return f"{description}  {unit} {done}/{total}{speed}  ETA {eta}{run}"

    @contextlib.contextmanager
    def task(self, description: str, total: int, images_per_step: int | None = None, later: int = 0,
             unit: str = "step"):
        """Yields :class:`Ticks`: a transient bar on a terminal; on other output and in the log file a plain line
        every ``every_s`` seconds. ``later``: the steps the run still has after this task (a training run's later
        epochs), which its ETA includes; ``unit``: what ``total`` counts."""
        bar_on = self.enabled and self.console.is_terminal
        plain_on = self.enabled and not bar_on
        if not (bar_on or plain_on or self.log_file):
            yield Ticks(total)
            return
        t0 = last = self.clock()

        def said(ticks: Ticks) -> None:
            nonlocal last
            now = self.clock()
            if now - last >= self.every_s and ticks.done < ticks.total:
                last = now
                text = self.line(description, ticks.done, ticks.total, now - t0, images_per_step, later, unit)
                if plain_on:
                    print(text, flush=True)
                self._to_file(text)

        if not bar_on:
            yield Ticks(total, said)
            return
        units = unit + ("es" if unit.endswith("s") else "s")  # steps, passes
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(units),
                   TimeElapsedColumn(), TimeRemainingColumn(), *([RunRemaining(later)] if later else []))
        with RichProgress(*columns, console=self.console, transient=True, get_time=self.clock) as bar:
            tid = bar.add_task(description, total=total)

            def shown(ticks: Ticks) -> None:
                bar.update(tid, completed=ticks.done, total=ticks.total)
                said(ticks)
            yield Ticks(total, shown)


# a model pass in progress units: a forward 1, a backward to its input 2 more, as a backward costs about twice a
# forward's arithmetic (Kaplan et al. 2020, Scaling Laws for Neural Language Models, Sec. 2.1: 2N and 4N FLOPs a token),
# so an evaluation's units track its work whichever attack does it (PGD's steps, AutoAttack's sub-attacks, Square's
# queries)
FORWARD, BACKWARD = 1, 2


class PassMeter:
    """A forward hook (``model.register_forward_hook(meter)``) that ticks :class:`Ticks` by the model's passes within
    the plan of the piece of work under way (:meth:`piece`): a forward counts :data:`FORWARD`, one whose input requires
    grad (an attack's step: a backward to the input follows) :data:`FORWARD` + :data:`BACKWARD`. Passes beyond the
    plan are not counted, and plan a piece left unused is dropped; passes outside a piece count nothing."""

    def __init__(self, ticks: "Ticks"):
        self.ticks, self.left, self.done = ticks, 0, 0

    def __call__(self, module, inputs, output) -> None:
        if self.left > 0:
            n = min(self.left, FORWARD + BACKWARD * bool(getattr(inputs[0], "requires_grad", False)))
            self.left -= n
            self.done += n
            self.ticks(n)

    @contextlib.contextmanager
    def piece(self, planned: int):
        """Count the passes of the work inside up to ``planned`` units; drop what it did not use."""
        self.left = planned
        try:
            yield
        finally:
            left, self.left = self.left, 0
            if left:
                self.ticks.drop(left)


class Ticks:
    """The work of a :meth:`Progress.task`: ``ticks(n)`` says n more units are done; ``ticks.drop(n)`` that n units
    of the plan will not be done after all (an attack that broke every image before its last iteration), so the
    total shrinks instead of the count jumping: the rate, and with it the ETA, stays that of the work done."""

    def __init__(self, total: int, shown=lambda ticks: None):
        self.done, self.total, self._shown = 0, total, shown

    def __call__(self, n: int = 1) -> None:
        self.done += n
        self._shown(self)

    def drop(self, n: int) -> None:
        self.total -= n
        self._shown(self)


class RunRemaining(ProgressColumn):
    """The run's time left on a bar: this task's steps left and ``later`` more, at the task's speed."""

    def __init__(self, later: int):
        super().__init__()
        self.later = later

    def render(self, task) -> Text:
        left = (task.remaining or 0) + self.later
        return Text(f"run {hms(left / task.speed) if task.speed else '-:--:--'}", style="progress.remaining")
