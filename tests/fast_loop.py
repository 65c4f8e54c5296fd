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

import pytest

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


TEST_LIMIT_S = 30.0  # issue 57: no test outside the slow tier may take more CPU seconds than this
SLOW_FROM_S = TEST_LIMIT_S / 2  # choose() lists every test dearer than this: a 2x margin below the limit
# issue 57: the CPU seconds a whole-suite run (python -m pytest -q -n 2: no -k, -m or paths; every extra installed,
# the slow tier included) may take. On 2 cores that is about half as many seconds of wall time plus the workers'
# start; .ci/run's first leg (the test extra alone) runs the larger part of it. The last whole-suite measurement is
# tests/slow.txt's header; test_fast_loop keeps this budget above it by at most half, for a slower CPU or a loaded
# machine's CPU seconds.
SUITE_BUDGET_S = 2400.0


class CpuTimes:
    """A pytest plugin that measures each test's CPU seconds (setup, call and teardown; the process's own, all its
    threads, and its finished child processes') where it runs, carries them to the controlling process on the
    teardown report (``user_properties``, which xdist sends along), and there

    - fails the session, naming them, when a test outside the slow tier took more than :data:`TEST_LIMIT_S`
      (CPU seconds, not wall time: waiting for a core does not move them, but a slower CPU does, and so does a busy
      sibling where two vCPUs share a core: the same README leg measured 1,217 to 1,585 CPU s on one 2-vCPU host
      within a day; hence :data:`SLOW_FROM_S`'s 2x margin), so the suite's budget holds as tests are added;
    - with ``record``, appends ``{"test", "cpu_s", "wall_s", "marked"}`` per test to that JSON-lines file
      (``marked``: slow by its own file's marker, so out of the loop whatever the list says);
    - with ``suite_budget`` (conftest gives it to a run of the whole suite), says the run's CPU seconds against it and
      fails the session when they are over, so the suite as a whole keeps to its budget as tests are added."""

    def __init__(self, listed: set[str], record: str | None = None, limit: float = TEST_LIMIT_S,
                 controller: bool = True, suite_budget: float | None = None):
        self.listed, self.limit, self.over = listed, limit, []
        self.suite_budget, self.total = suite_budget, 0.0
        self.record = Path(record) if record else None
        self.controller = controller  # False in an xdist worker: the controller judges and records
        if self.record and self.controller:
            self.record.unlink(missing_ok=True)

    @pytest.hookimpl(tryfirst=True)  # before any fixture of the test is set up
    def pytest_runtest_setup(self, item):
        item.stash[_STARTED] = os.times()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if call.when == "teardown" and _STARTED in item.stash:
            before, after = item.stash[_STARTED], os.times()
            report.user_properties.append(
                ("cpu_s", (round(sum(after[:4]) - sum(before[:4]), 3), round(after.elapsed - before.elapsed, 3))))
        return report

    def pytest_runtest_logreport(self, report):
        if not self.controller or report.when != "teardown":
            return
        cpu, wall = dict(report.user_properties).get("cpu_s", (None, None))
        if cpu is None:
            return
        slow = "slow" in report.keywords
        self.total += cpu
        if cpu > self.limit and not slow:
            self.over.append((report.nodeid, cpu))
        if self.record:
            with self.record.open("a") as f:
                f.write(json.dumps({"test": report.nodeid, "cpu_s": cpu, "wall_s": wall,
                                    "marked": slow and report.nodeid not in self.listed}) + "\n")

    def over_budget(self) -> bool:
        return self.suite_budget is not None and self.total > self.suite_budget

    def pytest_sessionfinish(self, session):
        if (self.over or self.over_budget()) and session.exitstatus == 0:
            session.exitstatus = 1  # pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter):
        for nodeid, cpu in sorted(self.over, key=lambda o: -o[1]):
            terminalreporter.write_line(
                f"fastfair: {nodeid} took {cpu:.1f} CPU s, over the {self.limit:.0f} s a test outside the slow tier "
                "may take: make it cheaper, or mark it slow (@pytest.mark.slow, or regenerate tests/slow.txt: "
                "tests/fast_loop.py)", red=True)
        if self.suite_budget is not None and self.controller:
            if self.over_budget():
                terminalreporter.write_line(
                    f"fastfair: the suite took {self.total:.0f} CPU s, over its budget of {self.suite_budget:.0f} s "
                    "(tests/fast_loop.py, SUITE_BUDGET_S): make the dearest tests cheaper (python -m pytest -q -n 2 "
                    "--cpu-times FILE records each test's)", red=True)
            else:
                terminalreporter.write_line(f"fastfair: the suite took {self.total:.0f} CPU s of its budget of "
                                            f"{self.suite_budget:.0f} s")


_STARTED = pytest.StashKey[os.times_result]()


def read_record(path: Path) -> tuple[dict[str, float], set[str]]:
    """({node id: CPU seconds}, the ids marked slow in their files) from the record at ``path``."""
    if not path.is_file():
        raise SystemExit(f"no record at {path}: run pytest with --cpu-times {path}")
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["test"]: r["cpu_s"] for r in records}, {r["test"] for r in records if r["marked"]}


def choose(cpu: dict[str, float], budget: float, marked: set[str] = frozenset()) -> list[str]:
    """The tests to list as slow: every one dearer than :data:`SLOW_FROM_S`, then the dearest first until the loop's
    CPU seconds fit ``budget``. Tests ``marked`` slow in their files are out of the loop already; a file's last test
    in the loop is never taken, so every test file keeps at least one test there (its cheapest: if that one is
    over :data:`TEST_LIMIT_S`, the session's check names it)."""
    left: dict[str, int] = {}
    for nodeid in cpu.keys() - marked:
        left[_file(nodeid)] = left.get(_file(nodeid), 0) + 1
    total, slow = sum(cpu[n] for n in cpu.keys() - marked), []
    for nodeid in sorted(cpu.keys() - marked, key=lambda n: (-cpu[n], n)):
        if total <= budget and cpu[nodeid] <= SLOW_FROM_S:
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
