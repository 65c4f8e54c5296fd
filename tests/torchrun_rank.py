"""One torchrun rank of tests/test_distributed.py: ``fastfair ARGS`` as ``python -m fastfair`` runs it, then one
line on stderr naming the threads still running beside the main one.

None may be: a process-group thread still running when the interpreter exits can need the GIL of a finalizing
interpreter and abort the rank (fastfair/scaleout/distributed.py, ``init``). Reads /proc (Linux).
"""
import os
import sys
from pathlib import Path

from fastfair.cli import main

if __name__ == "__main__":
    code = main()
    others = sorted(t for t in Path("/proc/self/task").iterdir() if t.name != str(os.getpid()))
    names = [(t / "comm").read_text().strip() for t in others]
    # one write(2) of a line shorter than PIPE_BUF: the two ranks' lines never interleave on torchrun's stderr
    os.write(2, f"rank {os.environ['RANK']} threads left: {names}\n".encode())
    sys.exit(code)
