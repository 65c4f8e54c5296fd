"""docs/api.md runs: its ```python blocks, in order, in one namespace, in a fresh folder; and what it says about
which methods fit a user's own training loop is what the method registry says."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from fastfair.methods import METHODS, Method
from helpers import EXTRAS, extra_installed, install_line
from shared_runs import trials_in_process

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


@pytest.mark.slow
def test_every_example_runs(tmp_path, monkeypatch, capsys):
    """A block that starts ``# needs: PACKAGE`` (a package of an optional extra) is left out when the package is not
    installed; the rest run and are checked, and the test then skips with the install line, so that the run with
    the extras (.ci/run's second leg) runs it whole. The tune example's trials train in this process (what a study
    computes is this test's; tests/test_tune.py runs trials as the processes they are)."""
    monkeypatch.chdir(tmp_path)
    trials_in_process(monkeypatch)
    namespace: dict = {}
    ran, missing = 0, set()
    for code in blocks():
        need = re.match(r"# needs: (\w+)", code)  # a distribution of an extra
        extra = need and next(extra for extra, dists in EXTRAS.items() if need[1] in dists)
        if extra and not extra_installed(extra):
            missing.add(extra)
            continue
        exec(compile(code, f"{DOC}:block{ran}", "exec"), namespace)
        ran += 1
    assert ran >= 8
    out = capsys.readouterr().out
    assert "| **worst class** |" in out  # the per-class table
    assert "images must be in [0, 1]" in out and "Did you mean epochs?" in out
    assert "eval.eps=8.0 is out of range: it must be within [0, 1]" in out  # the CLI's line for --set eval.eps=8
    if missing:
        pytest.skip(install_line(",".join(sorted(missing))))


def fits_own_loop(name: str) -> bool:
    """A method whose per-step loss is all of it: no per-class statistics, validation pass or epoch update."""
    cls = METHODS.get(name)
    return (not cls.statistics and not cls.needs_initial_validation
            and all(getattr(cls, hook) is getattr(Method, hook) for hook in ("end_epoch", "validation_pass")))


def test_the_own_loop_list_is_the_registry_s():
    text = DOC.read_text()
    listed = re.search(r"This is natural for the methods whose loss is all there is per step: (.*?), and \*\*fat\*\*",
                       text, flags=re.S)[1]
    said = set(re.findall(r"[\w-]+", listed.replace("*", "")))
    assert said == {n for n in METHODS if fits_own_loop(n)} - {"fat"}
    assert fits_own_loop("fat") and all(f"**{n}" in text or f", {n}" in text or f"{n}**" in text
                                        for n in METHODS if not fits_own_loop(n))
