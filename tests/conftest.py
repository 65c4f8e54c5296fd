"""Test-session setup shared by all test files (keep it minimal).

1. Triton interpreter on machines without CUDA. ``triton.jit`` reads ``TRITON_INTERPRET`` when a
   kernel is *decorated*, i.e. when ``fastfair.kernels`` is first imported, so setting it here
   (conftest runs before any test module is imported) is early enough; importing torch first
   is fine. On a CUDA machine the kernels compile for the GPU instead.
2. ``fastfair.kernels`` is this checkout's folder: pyproject maps the top-level folder
   ``kernels/`` to ``fastfair.kernels``. A finder first on ``sys.meta_path`` maps that one name
   to the folder, whether the package is not installed or another checkout is the one installed
   in editable mode (a git worktree testing its own kernels), so no top-level ``kernels``
   module ever becomes importable.
3. ``fastfair.presets`` (pyproject maps ``configs/`` to it) is always this checkout's folder, so
   the presets under test are the ones beside the tests.
4. After the run, one line counts the tests skipped for want of the real data subsets and says
   where they go (``helpers.real_data``), and one the tests skipped for want of an optional extra, with the install
   line that runs them (``helpers.needs_extra``). With ``FASTFAIR_EXTRA_SKIPS=FILE`` (.ci/run's first leg, the
   README's command on the ``test`` extra alone) the latter tests' node ids go to FILE, for the second leg to run once
   the extras are in; a skip that names an extra's package without its install line fails that run, as such a test
   would be run by neither leg.
5. The contributor's loop (``-m "not slow"``): every test listed in ``tests/slow.txt`` is marked slow; each test's
   CPU seconds are measured, a test outside the slow tier over ``fast_loop.TEST_LIMIT_S`` fails the session, so does
   a whole-suite run over ``fast_loop.SUITE_BUDGET_S``, and ``--cpu-times FILE`` records them, from which that list
   is made (``fast_loop``).
6. Under xdist the workers share the cores: each worker's torch, and every process its tests start, gets
   cores // workers threads (unless OMP_NUM_THREADS says otherwise). Two workers of two threads each on 2 cores
   kept OpenMP's waiting threads spinning: tests/test_train.py with -n 2 on the loaded 2-core machine took
   1,063 and 719 s (193 and 175 CPU s) with torch's default of one thread per core, 199 and 143 s (22 and 23
   CPU s) with one, in alternating runs.
7. Whatever a test does to torch's thread count is undone after it, so the count of 6. holds for every test of a
   worker: a helper that left two threads behind made the next test's training in that worker more than ten times
   slower (a 78 s fixture past 15 minutes), the way a CI run went past its 90 minutes.
8. OpenMP's waiting threads sleep (``OMP_WAIT_POLICY=PASSIVE``, as every fastfair command sets it): on the loaded
   2-core machine the README's demo trained at 8-16 images/s with spinning threads and 300-400 with sleeping ones,
   the same numbers either way (issue 57, item 4).
"""
import importlib.abc
import importlib.util
import os
import re
import sys
from pathlib import Path

import pytest

# 8. OpenMP's idle threads sleep rather than spin (unless the caller chose): set before torch starts its OpenMP
# runtime, and inherited by every process a test starts
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch  # noqa: E402

import fast_loop

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "OMP_NUM_THREADS" not in os.environ:  # 6.
    _threads = max(1, len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    torch.set_num_threads(_threads)

_KERNELS = Path(__file__).resolve().parents[1] / "kernels"


class _KernelsFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "fastfair.kernels" or not (_KERNELS / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, _KERNELS / "__init__.py", submodule_search_locations=[str(_KERNELS)]
        )


sys.meta_path.insert(0, _KernelsFinder())  # first: before the editable install's own finder

_PRESETS = Path(__file__).resolve().parents[1] / "configs"


class _PresetsFinder(importlib.abc.MetaPathFinder):
    """``fastfair.presets`` is this checkout's ``configs/`` even when another checkout is the one
    installed in editable mode (a git worktree testing its own presets)."""

    def find_spec(self, name, path, target=None):
        if name != "fastfair.presets" or not (_PRESETS / "__init__.py").is_file():
            return None
        return importlib.util.spec_from_file_location(
            name, _PRESETS / "__init__.py", submodule_search_locations=[str(_PRESETS)]
        )


sys.meta_path.insert(0, _PresetsFinder())  # first: before the editable install's own finder


def pytest_addoption(parser):
    parser.addoption("--cpu-times", metavar="FILE", help="append each test's CPU seconds to FILE (JSON lines; "
                     "python tests/fast_loop.py FILE --budget N makes tests/slow.txt from them)")


def _whole_suite(config) -> bool:
    """Whether this run is the whole suite: tests/ as pyproject's testpaths name it, nothing left out by -k, -m or
    --deselect."""
    return (config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.keyword
            and not config.option.markexpr and not config.option.deselect)


def pytest_configure(config):
    """5. Each test's CPU seconds: the session fails when one outside the slow tier is over budget, or when the
    whole suite is over its budget."""
    config.pluginmanager.register(fast_loop.CpuTimes(fast_loop.read_slow(), config.getoption("--cpu-times"),
                                                     controller=not hasattr(config, "workerinput"),
                                                     suite_budget=fast_loop.SUITE_BUDGET_S if _whole_suite(config)
                                                     else None),
                                  "fastfair-cpu-times")


COLLECTED = pytest.StashKey[list]()  # every item collected, before -m or -k leaves any out (test_fast_loop)


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    """5. The listed tests are slow."""
    fast_loop.mark_slow(items, fast_loop.read_slow(), pytest.mark.slow)
    config.stash[COLLECTED] = list(items)


def pytest_terminal_summary(terminalreporter):
    """4. One line for the tests skipped for want of the real data (helpers.real_data), saying how to run them; one
    for those skipped for want of an extra (helpers.needs_extra)."""
    from helpers import EXTRAS, INSTALL_LINE, NO_REAL_DATA, SHARED

    skips = [(r.nodeid, str(r.longrepr[2]).removeprefix("Skipped: "))
             for r in terminalreporter.stats.get("skipped", []) if isinstance(r.longrepr, tuple)]
    no_data = [s for s in skips if NO_REAL_DATA in s[1]]
    if no_data:
        terminalreporter.write_line(
            f"fastfair: {len(no_data)} tests skipped: no real CIFAR-10/MNIST subset at {SHARED}; make them from the "
            f"official data sets there with `fastfair data subset cifar10 --out {SHARED}/cifar10-subset.npz` and the "
            "same for mnist (--data-dir where torchvision's files are), or set FASTFAIR_SHARED_DATA=DIR where they "
            "are (docs/guides/8-contributing.md: The whole suite and CI)")
    for_extra = {nodeid: match[1] for nodeid, reason in skips if (match := INSTALL_LINE.fullmatch(reason))}
    if for_extra:
        extras = sorted({e for listed in for_extra.values() for e in listed.split(",")})
        terminalreporter.write_line(f"fastfair: {len(for_extra)} tests or test modules skipped for want of an optional "
                                    f'extra; pip install -e ".[{",".join(extras)}]" runs them')
    if os.environ.get("FASTFAIR_EXTRA_SKIPS"):
        Path(os.environ["FASTFAIR_EXTRA_SKIPS"]).write_text("".join(f"{n}\n" for n in sorted(set(for_extra))))
        packages = re.compile("|".join(re.escape(d) for dists in EXTRAS.values() for d in dists)
                              + r"|No module named|fastfair\[|pip install")
        forgotten = [(n, r) for n, r in skips if n not in for_extra and packages.search(r)]
        for nodeid, reason in forgotten:
            terminalreporter.write_line(f"fastfair: {nodeid} skipped for want of a package without its install line "
                                        f"({reason}): skip it with helpers.needs_extra, so the second leg runs it",
                                        red=True)
        if forgotten:  # the session's exit status is read after this hook
            terminalreporter._session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _thread_count_kept():  # 7.
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)

