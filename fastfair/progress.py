"""A rich progress bar for long loops, and console output that does not fight with it."""
from __future__ import annotations

import contextlib

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.progress import Progress as RichProgress


class Progress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.console = Console(highlight=False)

    def print(self, *args) -> None:
        if self.enabled:
            self.console.print(*args, markup=False, soft_wrap=True)

    @contextlib.contextmanager
    def task(self, description: str, total: int):
        """Yields ``advance()``; draws a transient bar when the console is a terminal."""
        if not (self.enabled and self.console.is_terminal):
            yield lambda: None
            return
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with RichProgress(*columns, console=self.console, transient=True) as bar:
            tid = bar.add_task(description, total=total)
            yield lambda: bar.advance(tid)
