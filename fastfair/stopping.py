"""How a command stops on a signal. Ctrl-C (SIGINT), SIGTERM (what SLURM, ``docker stop``, torchrun and
``kill`` send) and SIGUSR1 (SLURM's early warning, ``--signal=USR1@120``) end every command the same way:
one line saying what was kept and how to go on, the run folder's lock released, exit code 128 + the
signal's number (130, 143, 138).

:func:`handled` installs the handler for a command's duration. Outside the blocks below it raises
:class:`Stopped` at once, a ``KeyboardInterrupt``, so every ``except KeyboardInterrupt`` cleanup runs.
Inside :func:`held` (an atomic file write) a signal waits for the block's end. Inside :func:`deferred`
(the training loop; a grid waiting for its stopped children) it is only recorded: the trainer asks
:func:`requested` at each step boundary and stops there, where its state is whole and can be saved. A
second Ctrl-C raises even there; SIGTERM and SIGUSR1 never do, because a cluster may send both (SLURM's
USR1 warning, then a grid's SIGTERM to its children), and only a person pressing twice means "now".

Python runs a handler only when the main thread is back in Python, and a training step can sit in native code that
never returns (oneDNN's AVX2 1x1-convolution weight gradient spun forever in torch 2.13, docs/reliability.md): a
:func:`deferred` block given ``at_once`` (the trainer's) has a watcher thread that sees each signal as it lands,
through the file descriptor CPython's own C handler writes every signal's number to. A first Ctrl-C the caller has
not been told of within a second (by :func:`requested`, at its next boundary: the step is in native code, or still
running, or validation is) is answered with a line saying the run stops when that work ends; a second one Python's
handler has not taken within a second ends the process at once, exit 130, with the line ``at_once()`` returns (the
last whole checkpoint and how to go on). SIGTERM twice does not: two often come from two senders at once (SLURM
signals every process of a job step while a grid or torchrun forwards its own), and a cluster's SIGKILL follows
anyway. A native call that holds the GIL keeps the watcher out too; only SIGKILL ends such a process. A caller that
reaches its boundary within the second stops as before, with nothing more said.

:func:`says` is every command's and every API entry point's way to end on one: the handler installed, a stop
turned into :class:`~fastfair.errors.Interrupted` with the line saying what was kept.

This module imports no torch: the CLI installs the handler before any command loads it.
"""
from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from typing import Callable

from fastfair.errors import Interrupted

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
# what each signal's disposition is in a fresh Python process: only those are replaced, never a caller's own
# handler or an ignored signal (a job started with SIGINT ignored keeps ignoring it)
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
             signal.SIGUSR1: signal.SIG_DFL}


class Stopped(KeyboardInterrupt):
    """A stop signal raised where the command is; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_received: list[int] = []  # the signals since the outermost handled() began, in order
_told = False  # whether requested() has returned a signal since handled() began: the caller is stopping
_blocks: list[str] = []  # the open blocks, innermost last: "held" or "deferred"


def signum_of(err: BaseException) -> int:
    """The signal behind a KeyboardInterrupt: a plain one (Python's own Ctrl-C handler) is SIGINT."""
    return getattr(err, "signum", signal.SIGINT)


def exit_code(signum: int) -> int:
    """128 + the signal's number, as a shell reports a process the signal ended."""
    return 128 + signum


def said_by(signum: int) -> str:
    """"" for Ctrl-C (the line reads "interrupted"), else " by SIGTERM": the line names what stopped the command."""
    return "" if signum == signal.SIGINT else f" by {signal.Signals(signum).name}"


def requested() -> int:
    """The first stop signal received since :func:`handled` began (0: none); the caller's look at a boundary where
    it can stop, which the watcher waits a second for before it says the run is stopping."""
    global _told
    signum = _received[0] if _received else 0
    _told = _told or bool(signum)
    return signum


def _handler(signum: int, frame) -> None:
    again = bool(_received)
    _received.append(signum)
    if "held" in _blocks:
        return
    if "deferred" in _blocks and not (again and signum == signal.SIGINT):
        return
    raise Stopped(signum)


@contextlib.contextmanager
def handled():
    """Stop on SIGINT, SIGTERM and SIGUSR1 as this module says, for the block's duration; nested, or off the main
    thread (where Python cannot install handlers), it changes nothing."""
    global _told
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    mine = [s for s in SIGNALS if previous[s] is _DEFAULTS[s]]
    if not mine:
        yield
        return
    _received.clear()
    _told = False
    for s in mine:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, previous[s])
        _received.clear()  # what was received is this block's: a later train() in the process starts afresh
        _told = False


GRACE_S = 1.0  # how long the watcher waits (for the caller's look, or Python's handler) before it speaks or acts
NOTICE = ("fastfair: stopping once the step or validation now running ends (it has not for a second); Ctrl-C again "
          "stops at once, losing the work since the last checkpoint")


class _Watcher:
    """A thread that reads each signal's number from the wakeup descriptor while the main thread may be stuck in
    native code (module docstring); ``at_once()`` says what was kept when a second Ctrl-C ends the process."""

    def __init__(self, at_once: Callable[[], str]):
        self.at_once, self.base = at_once, len(_received)
        self.read, write = os.pipe()
        os.set_blocking(write, False)  # CPython's C handler must never block on it
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self.write = write
        self.thread = threading.Thread(target=self._watch, name="fastfair-stop-watcher", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        arrived, notice_at, end_at = 0, None, None
        while True:
            due = [t for t in (notice_at, end_at) if t is not None]
            ready, _, _ = select.select([self.read], [], [], max(0.0, min(due) - time.monotonic()) if due else None)
            if ready:
                got = os.read(self.read, 64)
                if not got:  # the block ended: close() shut the pipe
                    return
                for signum in (s for s in got if s in SIGNALS):
                    arrived += 1
                    if signum == signal.SIGINT:
                        at = time.monotonic() + GRACE_S
                        notice_at, end_at = (at, None) if arrived == 1 else (None, at)
            now = time.monotonic()
            stuck = len(_received) - self.base < arrived  # Python's handler has not got to every signal yet
            if notice_at is not None and now >= notice_at:
                notice_at = None
                # not "stuck": a Ctrl-C that Python's handler took just before the step blocked in native code, or
                # during a long step or validation, would leave the run silent for as long as that takes
                if not _told:
                    print(NOTICE, file=sys.stderr, flush=True)
            if end_at is not None and now >= end_at:
                end_at = None
                if stuck:
                    print(f"fastfair: {self.at_once()}", file=sys.stderr, flush=True)
                    os._exit(exit_code(signal.SIGINT))

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        os.close(self.write)
        self.thread.join()
        os.close(self.read)


def _watcher(at_once: Callable[[], str] | None) -> _Watcher | None:
    """A watcher for an ``at_once`` block where this module's handler takes Ctrl-C and no one else (an outer
    block's watcher, asyncio) reads the wakeup descriptor."""
    if at_once is None or signal.getsignal(signal.SIGINT) is not _handler:
        return None
    previous = signal.set_wakeup_fd(-1)
    if previous != -1:
        signal.set_wakeup_fd(previous)
        return None
    return _Watcher(at_once)


@contextlib.contextmanager
def _block(kind: str, at_once: Callable[[], str] | None = None):
    if threading.current_thread() is not threading.main_thread():  # signals interrupt the main thread alone
        yield
        return
    with handled():
        before = len(_received)
        _blocks.append(kind)
        watcher = _watcher(at_once)
        try:
            yield
        finally:
            if watcher:
                watcher.close()
            _blocks.pop()
        if not _blocks and len(_received) > before:  # nothing outside will look: stop now, as it would have
            raise Stopped(_received[before])


def held():
    """A signal inside the block takes effect when it ends: the block (an atomic file write) runs whole."""
    return _block("held")


def deferred(at_once: Callable[[], str] | None = None):
    """Inside the block a signal is recorded for :func:`requested`, and the caller stops at its next boundary; one
    that came after the caller's last look raises as the block ends. A second Ctrl-C raises at once, and with
    ``at_once`` (what was kept and how to go on) ends the process where native code keeps the handler out."""
    return _block("deferred", at_once)


@contextlib.contextmanager
def says(message: str):
    """A stop signal inside the block (handled here, as :func:`handled` says) raises :class:`Interrupted` with one
    line: ``interrupted by SIGTERM; {message}``, ``message`` saying what was kept and how to go on."""
    with handled():
        try:
            yield
        except KeyboardInterrupt as err:
            signum = signum_of(err)
            raise Interrupted(f"interrupted{said_by(signum)}; {message}", signum) from None
