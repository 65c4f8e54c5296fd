"""The documentation site: it builds in strict mode (a broken link, a missing page or any warning fails), and its
generated reference pages (docs/hooks.py) leave nothing a user looks up undocumented."""
from __future__ import annotations

import importlib.util
import logging
import warnings
from pathlib import Path
from typing import Annotated

import pytest
import typer

from fastfair.methods import METHODS, OPTIONS, Method, Option
from helpers import needs_extra

ROOT = Path(__file__).resolve().parents[1]
needs_extra("docs")


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hooks = _hooks()


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path, monkeypatch):
    """``mkdocs build --strict`` through mkdocs' own command line (click), in this process (a child's interpreter and
    fastfair's imports again were half its 14 CPU s); mkdocs' logger and Python's warning hooks are put back."""
    from click.testing import CliRunner
    from mkdocs.__main__ import cli as mkdocs_cli

    monkeypatch.chdir(ROOT)
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    logger = logging.getLogger("mkdocs")
    kept = (logger.level, logger.propagate, list(logger.handlers))
    try:
        with warnings.catch_warnings():
            done = CliRunner().invoke(mkdocs_cli, ["build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                                                   "-d", str(tmp_path / "site")])
    finally:
        logger.setLevel(kept[0])
        logger.propagate = kept[1]
        logger.handlers[:] = kept[2]
    assert done.exit_code == 0, done.output[-3000:] + repr(done.exception)
    site = tmp_path / "site"
    assert (site / "reference" / "cli" / "index.html").is_file()
    assert all((site / "reference" / "methods" / name / "index.html").is_file() for name in METHODS)
    assert all((site / "reference" / "options" / name / "index.html").is_file() for name in OPTIONS)
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "per-class accuracy" in api.lower() and "fastfair.api.train" in api  # mkdocstrings rendered docstrings


def test_nothing_a_user_looks_up_is_undocumented():
    assert hooks.undocumented() == []


def test_an_undocumented_method_option_or_cli_option_is_named(monkeypatch):
    bare_method = type("Bare", (Method,), {"__module__": "not_a_module"})
    bare_option = type("BareOption", (Option,), {"__module__": "not_a_module", "name": "bare_option"})
    app = typer.Typer()

    @app.command(help="a command whose option has no help")
    def run(level: Annotated[int, typer.Option()] = 1) -> None:
        pass

    @app.command(help="another, so typer keeps the command's name")
    def other() -> None:
        pass

    METHODS.register("bare-method", "a method registered without a docstring")(bare_method)
    OPTIONS.register("bare_option", "an option registered without a docstring")(bare_option)
    monkeypatch.setattr(hooks.cli, "app", app)
    try:
        said = hooks.undocumented()
    finally:
        METHODS.unregister("bare-method")
        OPTIONS.unregister("bare_option")
    assert said == ["method bare-method: no docstring", "option bare_option: no docstring",
                    "fastfair run: --level has no help"]


def test_every_conformance_row_lands_on_a_page_or_is_not_about_training():
    assert hooks.unplaced_labels() == []
    assert "FRL reweight" in hooks.method_page("frl-rw") and "FRL reweight" not in hooks.method_page("frl-rm")
    assert "CFA: TRADES + CCM + CCR" in hooks.option_page("ccr")


def test_the_cli_page_names_every_option_of_eval_and_train():
    page = hooks.cli_page()
    root = typer.main.get_command(hooks.cli.app)
    for name in ("eval", "train"):
        section = page.split(f"## `fastfair {name}`", 1)[1].split("\n## ", 1)[0]
        options = [o for p in root.commands[name].params if not hooks.is_argument(p) for o in p.opts]
        assert len(options) > 10 and all(f"`{o}`" in section for o in options)


def _cells(line: str) -> int:
    """How many cells a Markdown table row has: a backslash escapes the next character (an escaped backslash
    before a pipe leaves the pipe a separator), every other pipe separates."""
    seps, escaped = 0, False
    for ch in line.strip().strip("|"):
        seps += ch == "|" and not escaped
        escaped = ch == "\\" and not escaped
    return seps + 1


def _tables(page: str) -> list[list[str]]:
    """The Markdown tables of ``page``, each as its lines (header, separator, rows)."""
    out, current = [], None
    for line in page.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                out.append(current)
            current.append(line)
        else:
            current = None
    return out


def test_every_generated_table_row_has_its_header_s_columns():
    """A '|' inside a cell (a tolerance's formula, |terms|) is escaped once, so no row of a generated method or
    option page has more cells than its header; a twice-escaped pipe split 278 cells of the conformance tables."""
    pages = {**{f"method {n}": hooks.method_page(n) for n in METHODS},
             **{f"option {n}": hooks.option_page(n) for n in OPTIONS}}
    bad, tables = [], 0
    for where, page in pages.items():
        for table in _tables(page):
            tables += 1
            width = _cells(table[0])
            bad += [f"{where}: {line[:80]}" for line in table[1:] if _cells(line) != width]
    assert tables > len(pages) and not bad, "\n".join(bad[:10])
    assert any("Σ\\|terms\\|" in page for page in pages.values())  # the formulas are there, escaped once
