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

:func:`says` is every command's and every API entry point's way to end on one: the handler installed, a stop
turned into :class:`~fastfair.errors.Interrupted` with the line saying what was kept.

This module imports no torch: the CLI installs the handler before any command loads it.
"""
from __future__ import annotations

import contextlib
import signal
import threading

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
    """The first stop signal received since :func:`handled` began (0: none)."""
    return _received[0] if _received else 0


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
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in SIGNALS}
    mine = [s for s in SIGNALS if previous[s] is _DEFAULTS[s]]
    if not mine:
        yield
        return
    _received.clear()
    for s in mine:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s in mine:
            signal.signal(s, previous[s])
        _received.clear()  # what was received is this block's: a later train() in the process starts afresh


@contextlib.contextmanager
def _block(kind: str):
    if threading.current_thread() is not threading.main_thread():  # signals interrupt the main thread alone
        yield
        return
    with handled():
        before = len(_received)
        _blocks.append(kind)
        try:
            yield
        finally:
            _blocks.pop()
        if not _blocks and len(_received) > before:  # nothing outside will look: stop now, as it would have
            raise Stopped(_received[before])


def held():
    """A signal inside the block takes effect when it ends: the block (an atomic file write) runs whole."""
    return _block("held")


def deferred():
    """Inside the block a signal is recorded for :func:`requested`, and the caller stops at its next boundary; one
    that came after the caller's last look raises as the block ends. A second Ctrl-C raises at once."""
    return _block("deferred")


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
