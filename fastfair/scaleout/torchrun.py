"""``fastfair-torchrun``: torchrun that ends on a stop signal as every fastfair command does.

torch's launcher (``torch.distributed.run``) turns SIGTERM, SIGINT, ... into a ``SignalException`` raised out of
its ``main``: after its ranks have stopped at a step boundary and said how to go on, it prints a ~25-line traceback
and exits 1, which reads as a crash. This runs the same launcher with the same arguments and, on that exception
alone, ends without a traceback with 128 + the signal (143 for SIGTERM), as a one-process run does. Its ranks name
it in their ``continue with:`` line (:data:`LAUNCHER`, read by :func:`fastfair.scaleout.distributed.command`). A
rank that fails is torchrun's own report, unchanged. Plain ``torchrun`` works as well; it only ends noisily.
"""
from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

NAME = "fastfair-torchrun"
LAUNCHER = "FASTFAIR_LAUNCHER"  # set for the ranks: the command their continue line names
COMPLETE = "FASTFAIR_COMPLETE"  # the file rank 0 makes once the run is complete (distributed.say_complete)


def main(argv: list[str] | None = None) -> int:
    """``torch.distributed.run.main(argv)``; 128 + the signal that stopped it, 0 when the ranks finished."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    os.environ[LAUNCHER] = NAME
    for name in list(logging.root.manager.loggerDict):  # torch sets each module's level as it creates its logger
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="fastfair-torchrun-") as folder:
        complete = Path(folder) / "complete"
        os.environ[COMPLETE] = str(complete)  # rank 0 makes it once the run's final result is written
        try:
            run.main(argv)
        except SignalException as err:
            # a signal after the run was complete stopped nothing, as rank 0 said; before, the agent stopped the
            # ranks, whose line said what was kept and how to go on
            return 0 if complete.exists() else 128 + int(err.sigval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
