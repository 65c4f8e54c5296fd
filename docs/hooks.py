"""The site's reference pages, written from the code at each build (mkdocs.yml ``hooks:``), so none can drift.

Here and not in the package: it reads the CLI, which only ``fastfair.__main__`` may import (tests/test_layout.py), and
it needs mkdocs, which a user of fastfair does not install. The pages live in memory (``File.generated``): nothing is
written under docs/, so nothing generated is committed. What each page reads:

- reference/cli.md: the typer app, through the click command typer builds (every command, argument and option);
- reference/api.md: mkdocstrings directives for each name ``fastfair/__init__.py`` exports;
- reference/methods/NAME.md, reference/options/NAME.md: the registries (docstrings, keys, defaults, tune ranges), and
  the conformance rows of docs/conformance.md (the page tests/test_conformance.py keeps equal to the checks), read
  as text so the build runs no torch computation;
- reference/presets.md, reference/reproduce.md: the presets and grids; the paper targets with their rows and cost,
  and the coverage table;
- reference/performance.md: bench/results/speed-table.md, the table bench/speed_report.py generates.
"""
from __future__ import annotations

import html
import inspect
import re
import typing
from pathlib import Path

import typer.main
from mkdocs.structure.files import File

import fastfair
from fastfair import cli
from fastfair.methods import METHODS, OPTIONS, Method, Option, declared_keys, untuned
from fastfair.preset_files import grid_names, grid_title, preset_names, preset_title
from fastfair.reproduce import cost, coverage, runs, tables
from fastfair.reproduce.paper import PAPERS
from fastfair.tuning.space import default_space, describe

ROOT = Path(__file__).resolve().parents[1]
CONFORMANCE = ROOT / "docs" / "conformance.md"
SPEED_TABLE = ROOT / "bench" / "results" / "speed-table.md"

# How docs/conformance.md's method column names what is not spelled as a registry name (one label, several pages:
# a check of the CFA code's TRADES with HE belongs to both). Every label must land here, on a registry name, or in
# NOT_TRAINING (tests/test_docs_site.py), so a new conformance case cannot fall off the method pages.
LABELS = {
    "at": ("pgd-at",), "dafa": ("dafa-at", "dafa-trades"), "faal": ("faal-at", "faal-trades"),
    "frl reweight": ("frl-rw",), "frl remargin": ("frl-rm",), "frl reweight + remargin": ("frl",),
    "trades-he": ("trades", "he"), "pgd-he": ("pgd-at", "he"), "he-lis": ("he",), "he-cmp": ("he",),
    "cfa": ("ccm", "ccr"), "class-wise beta": ("trades",), "label smoothing": ("pgd-at", "trades"),
}
# checks of measures and weight averaging (and, by rule, of evaluations and of the presets' setup): on the
# Conformance topic page, on no method's page
NOT_TRAINING = ("cv", "mcd", "temperature-pgd", "ema", "fawa", "ema / fawa")


def cell(text: object) -> str:
    """``text`` fit for one Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def prose(docstring: str | None) -> str:
    """A docstring's reStructuredText inline code and roles (``x``, :func:`x`) as Markdown code."""
    text = re.sub(r":\w+:`~?\.?([^`]+)`", r"`\1`", docstring or "")
    return text.replace("``", "`")


def table(header: list[str], rows: list[list[object]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header),
            *["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]]


# ---- the command line -------------------------------------------------------------------------------------------

# typer carries its own copy of click, so its objects are told apart by what they hold, not by click's classes
def commands(group, path: str = "fastfair") -> list[tuple[str, object]]:
    """(its full name, the command) of every command and sub-command, in the order ``--help`` lists them."""
    out = []
    for name, command in group.commands.items():
        out.append((f"{path} {name}", command))
        if hasattr(command, "commands"):
            out += commands(command, f"{path} {name}")
    return out


def help_text(text: str | None) -> str:
    """typer's help as plain Markdown: rich's escaped bracket (``fastfair\\[ffcv]``) loses its backslash."""
    return (text or "").replace("\\[", "[").strip()


def params(command) -> list:
    """The arguments and options a user gives (typer adds --help when it prints, not here)."""
    return [p for p in command.params if not p.hidden]


def is_argument(p) -> bool:
    return p.param_type_name == "argument"


def param_row(p) -> list[str]:
    if is_argument(p):
        # raw HTML: a table cell's code span would show the backslash of an escaped pipe (RUN_DIR|CHECKPOINT)
        name = f"<code>{html.escape(p.metavar or p.name.upper()).replace('|', '&#124;')}</code>"
    else:
        name = " / ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
    annotation = p.type_descriptor.annotation
    if p.multiple and typing.get_args(annotation):  # a repeatable option: the type of each value
        annotation = typing.get_args(annotation)[0]
    kind = "flag" if getattr(p, "is_flag", False) else getattr(annotation, "__name__", str(annotation))
    kind += (f" ({p.metavar})" if p.metavar and not is_argument(p) else "") + (", repeatable" if p.multiple else "")
    # None: the option left out leaves the config's value (or the command's own rule, which its help states)
    shown = "" if p.required else "not set" if p.default is None or p.default == () else f"`{p.default!r}`"
    required = " (required)" if p.required else ""
    return [name, kind + required, shown, help_text(getattr(p, "help", None))]


def cli_page() -> str:
    root = typer.main.get_command(cli.app)
    lines = ["# Command line", "", "Generated from the typer app (`fastfair/cli.py`) at each build. Every command "
             "answers `-h` / `--help` with the same text; a user's mistake is one `fastfair: error:` line naming "
             "the fix.", ""]
    for path, command in commands(root):
        lines += [f"## `{path}`", "", help_text(command.help), ""]
        if hasattr(command, "commands"):
            lines += ["Sub-commands: " + ", ".join(f"`{path} {n}`" for n in command.commands), ""]
            continue
        usage = " ".join(f"{p.metavar or p.name.upper()}" for p in params(command) if is_argument(p))
        lines += ["```text", f"{path} [OPTIONS] {usage}".rstrip(), "```", ""]
        if params(command):
            lines += table(["argument or option", "type", "default", "what it does"],
                           [param_row(p) for p in params(command)]) + [""]
    return "\n".join(lines)


# ---- the Python API ---------------------------------------------------------------------------------------------

def api_page() -> str:
    lines = ["# Python API", "", "Generated from the docstrings of what `import fastfair` exports "
             "(`fastfair/__init__.py`); the [API topic page](../api.md) has worked examples.", ""]
    for name, target in fastfair._PUBLIC.items():
        lines += [f"## `fastfair.{name}`", "", f"::: {target.replace(':', '.')}", "    options:",
                  "      show_root_heading: true", "      show_root_toc_entry: false", "      heading_level: 3", ""]
    return "\n".join(lines)


# ---- methods and options ----------------------------------------------------------------------------------------

def what_it_does(cls, base: type) -> str:
    """Its own docstring, else its module's (an option is one module, whose docstring says what it does)."""
    module = inspect.getmodule(cls)
    return own_doc(cls, base) or prose(inspect.getdoc(module) if module else "")


def undocumented() -> list[str]:
    """Every method without its docstring, option without a description, key without its help, and command or
    argument or option of the CLI without help text: what the pages would show empty."""
    out = [f"method {n}: no docstring" for n in METHODS if not own_doc(METHODS.get(n), Method)]
    out += [f"option {n}: no docstring" for n in OPTIONS if not what_it_does(OPTIONS.get(n), Option)]
    out += [f"{owner}: {key} has no help" for owner, key, _, doc, _ in declared_keys() if not doc.strip()]
    for path, command in commands(typer.main.get_command(cli.app)):
        out += [f"{path}: no help"] * (not help_text(command.help))
        out += [f"{path}: {p.opts[0]} has no help" for p in params(command) if not help_text(p.help)]
    return out


def conformance_tables() -> tuple[list[list[str]], list[list[str]]]:
    """(checks, deliberate differences) of docs/conformance.md, one list of cells per row."""
    checks, differences, current = [], [], None
    for line in CONFORMANCE.read_text().splitlines():
        if line.startswith("## "):
            current = checks if line == "## Checks" else differences if line.startswith("## Deliberate") else None
        elif current is not None and line.startswith("| ") and not line.startswith(("| method |", "| --- |")):
            # unescaped here because table() escapes each cell again: escaped twice, a pipe (a backslash, then '|')
            # would split the generated page's cell
            current.append([c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]])
    return checks, differences


def label_owners(label: str) -> tuple[str, ...]:
    """The registry names a conformance label is about; () for a check of evaluation or averaging."""
    head = re.sub(r"\s*\(.*?\)", "", label.removeprefix("CFA: ")).strip().lower()
    if head in LABELS:
        return LABELS[head]
    if head in NOT_TRAINING or head.startswith("setup:") or "evaluation" in head:
        return ()
    owners = tuple(LABELS.get(part, (registry_name(part),)) for part in head.split(" + "))
    return tuple(name for names in owners for name in names)


def registry_name(words: str) -> str:
    """A label's words as a name: methods are spelled with hyphens (fair-tat), options with underscores."""
    option = re.sub(r"[ -]", "_", words)
    return option if option in OPTIONS else words.replace(" ", "-")


def own_doc(cls, base: type) -> str:
    """The docstring of ``cls`` or of the nearest class between it and ``base`` that has one ('' when none has)."""
    for klass in cls.__mro__[:cls.__mro__.index(base)]:
        if vars(klass).get("__doc__"):
            return prose(inspect.cleandoc(klass.__doc__))
    return ""


def unplaced_labels() -> list[str]:
    """Conformance labels that name neither a method, an option, nor a check outside training."""
    checks, differences = conformance_tables()
    return sorted({row[0] for row in checks + differences
                   if any(n not in METHODS and n not in OPTIONS for n in label_owners(row[0]))})


def conformance_section(name: str) -> list[str]:
    checks, differences = conformance_tables()
    mine = [row for row in checks if name in label_owners(row[0])]
    theirs = [row for row in differences if name in label_owners(row[0])]
    lines = ["## Conformance with the authors' code", ""]
    if mine:
        lines += [f"The checks of [Conformance](../../conformance.md) about it ({len(mine)}), run on each CI run:", "",
                  *table(["case", "quantity", "reference", "float64 tolerance", "measured", "float32 smoke tolerance",
                         "measured"], mine), ""]
    else:
        lines += ["No check compares it with an authors' code or a paper's equation yet.", ""]
    if theirs:
        lines += ["Where it departs from that code on purpose, and the key that switches it:", "",
                  *table(["case", "difference", "key"], theirs), ""]
    return lines


def keys_section(name: str) -> list[str]:
    rows = [[f"`{key}`", f"`{default!r}`", type(default).__name__, f"{tune.span} ({tune.source})" if tune else "",
             doc] for owner, key, default, doc, tune in declared_keys() if owner == name]
    if not rows:
        return ["## Keys", "", "It declares no keys of its own.", ""]
    return ["## Keys", "", *table(["key", "default", "type", "tune range", "what it is"], rows), ""]


def method_page(name: str) -> str:
    method = METHODS.get(name)
    module = inspect.getmodule(method)
    lines = [f"# {name}", "", METHODS.doc(name), "", f"`fastfair train --method {name}`; "
             f"class `{method.__module__}.{method.__qualname__}`.", "", "## What it does", "",
             own_doc(method, Method), "", "## The paper and code it follows", "", prose(inspect.getdoc(module)), ""]
    if method.defaults:
        lines += ["Keys of other sections it sets, as its paper's code does:", "",
                  *table(["key", "value"], [[f"`{k}`", f"`{v!r}`"] for k, v in method.defaults.items()]), ""]
    lines += keys_section(name)
    lines += ["## Default tuning space", ""]
    why = dict(untuned())
    if name in why:
        lines += [f"None: {why[name]}. `fastfair tune` needs `--space FILE.toml` (or an option with knobs).", ""]
    else:
        lines += ["What `fastfair tune` searches by default (key, range, where the range comes from):", "", "```text",
                  *describe(default_space(name)), "```", ""]
    return "\n".join(lines + conformance_section(name))


def option_page(name: str) -> str:
    option = OPTIONS.get(name)
    lines = [f"# {name}", "", OPTIONS.doc(name), "", f"A class-wise option with the config section `[{name}]`; it "
             "combines with any method.", "", "## What it does, and the paper and code it follows", "",
             own_doc(option, Option), "", prose(inspect.getdoc(inspect.getmodule(option))), ""]
    if option.defaults:
        lines += ["Keys of other sections it sets when it is on:", "",
                  *table(["key", "value"], [[f"`{k}`", f"`{v!r}`"] for k, v in option.defaults.items()]), ""]
    return "\n".join(lines + keys_section(name) + conformance_section(name))


def index_page(title: str, intro: str, registry) -> str:
    return "\n".join([f"# {title}", "", intro, "", *table(
        ["name", "what it is"], [[f"[{n}]({n}.md)", registry.doc(n)] for n in registry]), ""])


# ---- presets, reproduce targets, performance --------------------------------------------------------------------

def presets_page() -> str:
    groups: dict[str, list[str]] = {}
    for name in preset_names():  # by the name's first word: the paper (benz, cfa, me, ...) or demo, quick, ...
        groups.setdefault(name.split("-")[0], []).append(name)
    lines = ["# Presets and grids", "", "Generated from `configs/` (what `fastfair presets` lists); a paper's whole "
             "table, its rows run with the seeds it ran, is a [reproduce target](reproduce.md).", "", "## Presets",
             "", "`fastfair train --config NAME`, grouped by the name's first word:", ""]
    for group, names in groups.items():
        lines += [f"### {group}", "", *table(["preset", "what it is"], [[f"`{n}`", preset_title(n)] for n in names]),
                  ""]
    return "\n".join(lines + ["## Grids", "", "`fastfair grid NAME`:", "",
                              *table(["grid", "what it is"], [[f"`{n}`", grid_title(n)] for n in grid_names()]), ""])


def reproduce_page() -> str:
    speeds = cost.gpu_images_per_s()
    lines = ["# Reproduce targets", "", "Generated from the paper modules (`fastfair/reproduce/`); the "
             "[Reproduce topic page](../reproduce.md) says how a target runs and how its verdicts read, and the "
             "rows' presets are listed under [Presets and grids](presets.md).", "",
             "## Coverage of each paper", "", coverage.markdown(), "", "## Targets", "",
             "`fastfair reproduce NAME`: each target's rows at the full scale, with the seeds the paper ran, what "
             "each row follows (the paper or the authors' code) and what the whole target costs.", ""]
    # the paper tables with numbers to compare first; protocols (a paper's setting, no numbers) after them
    for key, target in sorted(tables.tables().items(), key=lambda item: item[1].protocol):
        def seeds(row) -> int:
            return runs.row_seeds(row, None, "full")
        kind = " A protocol: the paper's setting, without numbers to compare." if target.protocol else ""
        lines += [f"### `{key}`", "", f"{target.title} ({PAPERS[target.source].title}).{kind}", "",
                  *table(["preset", "row", "follows", "seeds"],
                         [[f"`{r.preset}`", r.row, r.follows, seeds(r)] for r in target.rows]), "",
                  *[f"- not run yet: {p}" for p in target.pending], f"Cost: {cost.estimate(target, seeds, speeds)}", ""]
    waiting = tables.pending()
    if waiting:
        lines += ["## Pending targets", "", *table(["target", "paper", "item", "what it waits for"], [
            [f"`{k}`", PAPERS[s.source].cite, s.item, s.pending] for k, s in waiting.items()]), ""]
    return "\n".join(lines)


def performance_page() -> str:
    return "\n".join(["# Performance figures", "", "The speed table, generated by `python bench/speed_report.py "
                      "--write` from the result files in `bench/results/` (a test fails while it is stale). What "
                      "each figure rests on, and how to measure your own: the [Performance topic page]"
                      "(../performance.md).", "", SPEED_TABLE.read_text()])


def pages() -> dict[str, str]:
    """Every generated page: its path under docs/ -> its Markdown."""
    out = {"reference/cli.md": cli_page(), "reference/api.md": api_page(),
           "reference/presets.md": presets_page(), "reference/reproduce.md": reproduce_page(),
           "reference/performance.md": performance_page(),
           "reference/methods/index.md": index_page(
               "Methods", "Each training method of the registry (`fastfair methods`), one page each.", METHODS),
           "reference/options/index.md": index_page(
               "Class-wise options", "Options that combine with any method, each its own config section.", OPTIONS)}
    out.update({f"reference/methods/{n}.md": method_page(n) for n in METHODS})
    out.update({f"reference/options/{n}.md": option_page(n) for n in OPTIONS})
    return out


# ---- mkdocs events ----------------------------------------------------------------------------------------------

def _expand(nav: list, index: str, entries: list[str]) -> bool:
    """Replace the nav entry pointing at ``index`` by a section holding it and ``entries``."""
    for i, item in enumerate(nav):
        title, value = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if value == index:
            nav[i] = {title: [index, *entries]}
            return True
        if isinstance(value, list) and _expand(value, index, entries):
            return True
    return False


def on_config(config):
    for folder, registry in (("methods", METHODS), ("options", OPTIONS)):
        _expand(config["nav"], f"reference/{folder}/index.md", [f"reference/{folder}/{n}.md" for n in registry])
    return config


# a Sphinx role as mkdocstrings leaves it in the HTML: :class:<code>~fastfair.errors.Interrupted</code>
ROLE = re.compile(r":(?:func|class|meth|data|mod|attr|exc|obj):<code>~?\.?([^<]*)</code>")


def on_page_content(html, page, config, files):
    """The docstrings' Sphinx cross-references, which mkdocstrings renders as raw text, as plain code."""
    return ROLE.sub(r"<code>\1</code>", html)


def on_files(files, config):
    for uri, text in pages().items():
        files.append(File.generated(config, uri, content=text))
    return files
