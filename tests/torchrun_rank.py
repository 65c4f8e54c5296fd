"""One torchrun rank of tests/test_distributed.py: ``fastfair ARGS`` as ``python -m fastfair`` runs it, for each
command of ``ARGS [--then ARGS ...]`` in turn (one launch, its interpreters and torch imports, serving several runs;
FASTFAIR_TEST_PORTS: a free port for each command after the first),
each followed by one line on stderr naming the threads still running beside the main one.

None may be: a process-group thread still running when the interpreter exits can need the GIL of a finalizing
interpreter and abort the rank (fastfair/scaleout/distributed.py, ``init``). Reads /proc (Linux).
"""
import os
import sys
from pathlib import Path

from fastfair.cli import main

THEN = "--then"


def commands(argv: list[str]) -> list[list[str]]:
    """``argv`` split at each ``--then``."""
    out = [[]]
    for arg in argv:
        if arg == THEN:
            out.append([])
        else:
            out[-1].append(arg)
    return out


if __name__ == "__main__":
    codes = []
    ports = os.environ.get("FASTFAIR_TEST_PORTS", "").split()
    for i, argv in enumerate(commands(sys.argv[1:]), 1):
        if i > 1:  # a process group of its own: a store of its own (rank 0's, at a port the test chose), where the
            # launcher's would still hold the previous group's keys under the same names
            os.environ.update(MASTER_PORT=ports[i - 2], TORCHELASTIC_USE_AGENT_STORE="False")
        codes.append(main(argv))
        others = sorted(t for t in Path("/proc/self/task").iterdir() if t.name != str(os.getpid()))
        names = [(t / "comm").read_text().strip() for t in others]
        # one write(2) of a line shorter than PIPE_BUF: the two ranks' lines never interleave on torchrun's stderr
        os.write(2, f"run {i}: rank {os.environ['RANK']} threads left: {names} (exit code {codes[-1]})\n".encode())
    sys.exit(next((code for code in codes if code), 0))
