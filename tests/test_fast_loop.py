"""The contributor's loop (``-m "not slow"``, README: The two commands): tests/slow.txt names only tests that exist,
each of them is marked slow, every test file keeps a test in the loop, and the list is chosen as fast_loop says."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import fast_loop
from conftest import COLLECTED

TESTS = Path(__file__).resolve().parent


def collected(request) -> list:
    """Every test the session collected, before -m or -k left any out; skips unless that is the whole folder."""
    if not all(Path(a.split("::")[0]).resolve() in (TESTS, TESTS.parent) for a in request.config.args):
        pytest.skip("needs the whole tests/ folder collected (the full suite or the contributor's loop)")
    return request.config.stash[COLLECTED]


def test_the_slow_list_names_only_tests_that_exist_and_marks_them(request):
    items = collected(request)
    listed = fast_loop.read_slow()
    assert not fast_loop.stale(listed, {i.nodeid for i in items}), \
        "tests/slow.txt names tests that are gone: regenerate it (tests/fast_loop.py)"
    assert all(i.get_closest_marker("slow") for i in items if i.nodeid in listed)


def test_the_list_leaves_every_test_file_a_test_in_the_loop(request):
    """A file whose own markers make every test slow (a whole compile or two-process check) stays out; every
    other file keeps at least one test in the loop."""
    listed, files = fast_loop.read_slow(), {}
    for item in collected(request):
        own = item.get_closest_marker("slow") is not None and item.nodeid not in listed  # its file's marker
        file = item.nodeid.split("::")[0]
        if not own:
            files[file] = files.get(file, False) or item.nodeid not in listed
    assert files and not [f for f, fast in files.items() if not fast]


def test_stale_ids_are_those_of_collected_files_only():
    collected = {"tests/test_a.py::test_x", "tests/test_a.py::test_y[1]"}
    listed = {"tests/test_a.py::test_y[1]", "tests/test_a.py::test_gone", "tests/test_b.py::test_z"}
    assert fast_loop.stale(listed, collected) == {"tests/test_a.py::test_gone"}  # test_b.py was not collected


def test_choose_takes_the_dearest_until_the_rest_fits_and_keeps_a_test_of_every_file(tmp_path):
    cpu = {"tests/test_a.py::big": 14.0, "tests/test_a.py::mid": 12.0, "tests/test_a.py::small": 1.0,
           "tests/test_b.py::only": 40.0, "tests/test_c.py::one": 5.0, "tests/test_c.py::two": 6.0,
           "tests/test_d.py::marked": 90.0, "tests/test_d.py::kept": 2.0}
    marked = {"tests/test_d.py::marked"}  # slow by its file's own marker: out of the loop already
    assert fast_loop.choose(cpu, 60, marked) == ["tests/test_a.py::big", "tests/test_a.py::mid"]
    assert fast_loop.choose(cpu, 1000, marked) == []
    # test_b's only test stays though it is dear; test_c keeps its cheaper test, test_d its one unmarked test
    assert fast_loop.choose(cpu, 0, marked) == ["tests/test_a.py::big", "tests/test_a.py::mid", "tests/test_c.py::two"]
    # a test dearer than SLOW_FROM_S is listed whatever the budget
    assert fast_loop.choose({**cpu, "tests/test_c.py::dear": fast_loop.SLOW_FROM_S + 1}, 1000, marked) == \
        ["tests/test_c.py::dear"]
    record = tmp_path / "cpu.jsonl"
    record.write_text("".join(json.dumps({"test": n, "cpu_s": cpu[n], "wall_s": 1.0, "marked": n in marked}) + "\n"
                              for n in cpu))
    assert fast_loop.read_record(record) == (cpu, marked)
    out = tmp_path / "slow.txt"
    fast_loop.write_list(fast_loop.choose(cpu, 60, marked), cpu, 60, marked, out)
    assert fast_loop.read_slow(out) == {"tests/test_a.py::big", "tests/test_a.py::mid"}
    assert "1 marked slow in their files take 90 s" in out.read_text() and "the loop 54 s (budget 60 s)" in \
        out.read_text()


def _burn_suite(tmp_path: Path, limit: float = 0.3, suite_budget: float | None = None) -> Path:
    """A tiny suite whose conftest registers the budget check at ``limit`` CPU s a test (0.3: one test over it, one
    marked slow over it, one under it) and ``suite_budget`` for the three (about 1.2 s)."""
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport fast_loop\n\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'slow: slow')\n"
        f"    config.pluginmanager.register(fast_loop.CpuTimes(set(), limit={limit}, suite_budget={suite_budget}, "
        "controller=not hasattr(config, 'workerinput')), 'budget')\n")
    (tmp_path / "test_burn.py").write_text(
        "import time\nimport pytest\n\n"
        "def burn(s):\n    t = time.process_time()\n    while time.process_time() - t < s:\n        pass\n\n"
        "def test_over():\n    burn(0.6)\n\n"
        "@pytest.mark.slow\ndef test_slow_over():\n    burn(0.6)\n\n"
        "def test_under():\n    pass\n")
    return tmp_path


# The tiny suites' pytest loads only the plugins they use: the venv's other entry-point plugins take 2 CPU s to load
# in each process (the controller and each xdist worker), 4 times what the three tests take.
INNER_PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "xdist"]
INNER_ENV = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_test_outside_the_slow_tier_over_its_cpu_budget_fails_the_session_by_name(tmp_path, workers):
    import subprocess

    suite = _burn_suite(tmp_path)
    proc = subprocess.run([*INNER_PYTEST, *workers, str(suite)], cwd=suite, env=INNER_ENV, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "3 passed" in out  # every test passed: the budget alone failed the session
    over = [line for line in out.splitlines() if line.startswith("fastfair: ")]
    assert len(over) == 1 and "test_burn.py::test_over took" in over[0] and "mark it slow" in over[0], out


@pytest.mark.parametrize("budget, fails", [(0.5, True), (60.0, False)])
def test_a_whole_suite_over_its_cpu_budget_fails_the_session_and_one_within_says_its_share(tmp_path, budget, fails):
    import subprocess

    suite = _burn_suite(tmp_path, limit=60.0, suite_budget=budget)
    proc = subprocess.run([*INNER_PYTEST, "-n", "2", str(suite)], cwd=suite, env=INNER_ENV, capture_output=True,
                          text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == (1 if fails else 0), out
    assert "3 passed" in out
    (said,) = [line for line in out.splitlines() if line.startswith("fastfair: the suite took ")]
    total = float(said.split()[4])
    assert 1.0 <= total < 60 and (f"over its budget of {budget:.0f} s" in said) == fails, said


def test_the_suite_budget_is_what_the_last_measurement_took_with_a_margin():
    """tests/slow.txt's header records the whole suite's CPU seconds; the budget stays within 1.5x of them, so a
    suite that grows is seen before CI's time is spent."""
    header = fast_loop.SLOW_LIST.read_text().splitlines()[1]
    measured = float(header.split(" tests, ")[1].split(" s in all")[0])
    assert measured < fast_loop.SUITE_BUDGET_S <= 1.5 * measured
