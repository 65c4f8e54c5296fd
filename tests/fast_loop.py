"""The contributor's loop, ``python -m pytest -q -n 2 -m "not slow"``: which tests it leaves out, chosen by
measured CPU time, and the measurement that chose them.

Most slow tests carry no marker in their file: :data:`SLOW_LIST` names them (one pytest node id a line), and
conftest marks every listed test ``slow`` at collection, so the list lives in one place while many test files are
edited at once. The list comes from a run of the whole suite that records each test's CPU seconds (setup, call
and teardown, the worker's own and its finished child processes'), not its wall time, which the load of a shared
machine inflates::

    python -m pytest -q -n 2 --cpu-times cpu.jsonl              # the whole suite, as CI runs it
    python tests/fast_loop.py cpu.jsonl --budget 480            # rewrites tests/slow.txt

``choose`` marks the dearest tests slow until the rest fits the budget of CPU seconds, keeping at least one test
of every file in the loop so that every module is still exercised. On 2 cores ``-n 2`` runs two workers, so the
loop's wall time on a quiet machine is about half its CPU seconds plus the workers' start (README, The two
commands).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

SLOW_LIST = Path(__file__).with_name("slow.txt")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def read_slow(path: Path = SLOW_LIST) -> set[str]:
    """The node ids listed in ``path`` (comments after ``#`` and blank lines ignored)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {line for line in lines if line}


def mark_slow(items: list, listed: set[str], marker) -> None:
    """Adds ``marker`` (pytest.mark.slow) to every collected item whose node id is listed."""
    for item in items:
        if item.nodeid in listed:
            item.add_marker(marker)


def stale(listed: set[str], collected: set[str]) -> set[str]:
    """The listed ids of collected files that name no collected test (renamed or removed since the list was
    made); ids of files that were not collected are not judged."""
    files = {_file(nodeid) for nodeid in collected}
    return {nodeid for nodeid in listed if _file(nodeid) in files and nodeid not in collected}


class CpuTimes:
    """A pytest plugin appending ``{"test", "cpu_s", "wall_s", "marked"}`` per test to a JSON-lines file (one file
    per xdist worker, ``FILE.<worker>``, joined by :func:`read_record`); ``marked``: slow by its own file's marker,
    so out of the loop whatever the list says."""

    def __init__(self, path: str, listed: set[str]):
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.path = Path(f"{path}.{worker}" if worker else path)
        self.path.unlink(missing_ok=True)
        self.listed = listed

    def pytest_runtest_protocol(self, item, nextitem):
        # os.times(): user and system seconds of this process (all its threads) and of its waited-for children
        before = os.times()
        yield
        after = os.times()
        cpu = sum(after[:4]) - sum(before[:4])
        with self.path.open("a") as f:
            f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu, 3),
                                "wall_s": round(after.elapsed - before.elapsed, 3),
                                "marked": bool(item.get_closest_marker("slow")) and item.nodeid not in self.listed})
                    + "\n")


CpuTimes.pytest_runtest_protocol.hookwrapper = True  # pytest reads the attribute (no pytest import here)


def read_record(path: Path) -> tuple[dict[str, float], set[str]]:
    """({node id: CPU seconds}, the ids marked slow in their files) from ``path`` and its per-worker files
    ``path.gwN``."""
    files = [path] if path.is_file() else sorted(path.parent.glob(f"{path.name}.gw*"))
    if not files:
        raise SystemExit(f"no record at {path} or {path}.gw*: run pytest with --cpu-times {path}")
    records = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    return {r["test"]: r["cpu_s"] for r in records}, {r["test"] for r in records if r["marked"]}


def choose(cpu: dict[str, float], budget: float, marked: set[str] = frozenset()) -> list[str]:
    """The tests to list as slow: the dearest first, until the loop's CPU seconds fit ``budget``. Tests ``marked``
    slow in their files are out of the loop already; a file's last test in the loop is never taken, so every test
    file keeps at least one test there (its cheapest)."""
    left: dict[str, int] = {}
    for nodeid in cpu.keys() - marked:
        left[_file(nodeid)] = left.get(_file(nodeid), 0) + 1
    total, slow = sum(cpu[n] for n in cpu.keys() - marked), []
    for nodeid in sorted(cpu.keys() - marked, key=lambda n: (-cpu[n], n)):
        if total <= budget:
            break
        if left[_file(nodeid)] > 1:
            left[_file(nodeid)] -= 1
            slow.append(nodeid)
            total -= cpu[nodeid]
    return sorted(slow)


def write_list(slow: list[str], cpu: dict[str, float], budget: float, marked: set[str] = frozenset(),
               path: Path = SLOW_LIST) -> None:
    total = sum(cpu.values())
    loop = sum(v for k, v in cpu.items() if k not in set(slow) | marked)
    head = ["# Tests left out of the contributor's loop (-m 'not slow'), chosen by tests/fast_loop.py from a",
            f"# whole-suite run's CPU seconds: {len(cpu)} tests, {total:.0f} s in all; {len(marked)} marked slow in "
            f"their files take {sum(cpu[n] for n in marked):.0f} s,",
            f"# these {len(slow)} {sum(cpu[n] for n in slow):.0f} s, the loop {loop:.0f} s (budget {budget:.0f} s).",
            "# Regenerate, never edit by hand: python -m pytest -q -n 2 --cpu-times cpu.jsonl; "
            "python tests/fast_loop.py cpu.jsonl --budget N"]
    path.write_text("\n".join(head + [f"{n}  # {cpu[n]:.1f} s" for n in slow]) + "\n")


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("record", type=Path, help="the --cpu-times file of a whole-suite run")
    p.add_argument("--budget", type=float, required=True, help="CPU seconds the loop may take")
    args = p.parse_args(argv)
    cpu, marked = read_record(args.record)
    slow = choose(cpu, args.budget, marked)
    write_list(slow, cpu, args.budget, marked)
    print(f"{len(slow)} of {len(cpu)} tests marked slow in {SLOW_LIST}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
