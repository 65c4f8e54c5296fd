"""Every code block of the guides (docs/guides/*.md, and docs/index.md where it exists) runs, so a guide cannot go
stale.

The convention a guide's author follows (docs/guides/8-contributing.md says it to contributors):

- ```bash, ```sh and ```console blocks are shell commands; in ```console only the lines that start with ``$ `` are
  commands (the others are what they print). ``fastfair`` in them is ``python -m fastfair`` of this checkout. A
  block of nothing but ``fastfair`` commands (words and quotes, no other shell syntax) runs them through
  ``fastfair.cli.main`` in the test's process, with the shell's environment and the words bash would pass: the same
  command without an interpreter and torch's import each (about 7 CPU s); any other block runs in bash.
- ```python blocks run in-process; the Python blocks of one guide share one namespace.
- ```text (what a command prints) and ```toml (a config shown whole) are shown, not run.
- ``<!-- file: NAME -->`` on the line before a block writes the block to NAME in the guide's folder instead of
  running it (a TOML grid or a module a later block uses).
- ``<!-- not-run: REASON -->`` on the line before a block skips it; the reason is required (needs a GPU, the full
  data set, a cluster, the network, ...).

Each guide runs in a fresh temporary folder, its blocks in order, sharing the folder. The real data subsets
(cifar10-subset.npz, mnist-subset.npz; found as tests/helpers.py finds them) are linked into that folder; a guide
whose blocks name a subset that is absent is skipped from that block on, with the reason.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from fastfair import cli
from fastfair.methods import METHODS
from helpers import NO_REAL_DATA, SHARED

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SHELLS = {"bash", "sh", "console"}
RUN = SHELLS | {"python"}
SHOWN = {"text", "toml"}
SUBSETS = ("cifar10-subset.npz", "mnist-subset.npz")
# the generated reference pages a guide may link to (the site build writes them; they are not in the checkout)
REFERENCE = re.compile(r"^(?:\.\./)?reference/(cli|api|methods/[\w+-]+|options/index|reproduce|presets|performance)"
                       r"\.md(#[\w-]+)?$")
FENCE = re.compile(r"^(\s*)```(.*)$")
MARKER = re.compile(r"^<!--\s*(not-run|file):?(.*?)-->\s*$")


class GuideError(Exception):
    """A guide breaks the block convention (the module docstring)."""


@dataclass
class Block:
    line: int       # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None = None  # the reason
    file: str | None = None


def guides() -> list[Path]:
    found = sorted((DOCS / "guides").glob("*.md"))
    return found + [DOCS / "index.md"] if (DOCS / "index.md").is_file() else found


def parse(text: str, name: str = "guide") -> list[Block]:
    """The fenced blocks of ``text``, each with the marker on the line before it; a block without a language or
    with one outside the convention, a not-run marker without a reason or a marker before no block is an error."""
    lines, out, i, pending = text.splitlines(), [], 0, None
    while i < len(lines):
        line = lines[i]
        fence, mark = FENCE.match(line), MARKER.match(line.strip())
        if mark:
            kind, arg = mark[1], mark[2].strip()
            if not arg:
                raise GuideError(f"{name}:{i + 1}: a {kind} marker needs a "
                                 f"{'reason' if kind == 'not-run' else 'file name'}: <!-- {kind}: ... -->")
            pending = (kind, arg, i)
        elif fence:
            if fence[1]:
                raise GuideError(f"{name}:{i + 1}: an indented block is not run; start its fence at the line start")
            lang = fence[2].strip()
            if not lang:
                raise GuideError(f"{name}:{i + 1}: a code block without a language (one of {sorted(RUN | SHOWN)})")
            if lang not in RUN | SHOWN:
                raise GuideError(f"{name}:{i + 1}: unknown block language {lang!r} (one of {sorted(RUN | SHOWN)})")
            end = next((j for j in range(i + 1, len(lines)) if lines[j].rstrip() == "```"), None)
            if end is None:
                raise GuideError(f"{name}:{i + 1}: the block is never closed")
            block = Block(i + 1, lang, "\n".join(lines[i + 1:end]) + "\n")
            if pending:
                if pending[0] == "not-run":
                    block.not_run = pending[1]
                else:
                    block.file = pending[1]
                if block.lang in SHOWN and block.not_run:
                    raise GuideError(f"{name}:{i + 1}: a ```{lang} block is never run; drop its not-run marker")
            out.append(block)
            pending, i = None, end
        elif pending and line.strip() and pending[2] != i:
            raise GuideError(f"{name}:{pending[2] + 1}: the {pending[0]} marker is not on the line before a block")
        i += 1
    if pending:
        raise GuideError(f"{name}:{pending[2] + 1}: the {pending[0]} marker is not on the line before a block")
    return out


def shell_script(block: Block) -> str:
    if block.lang != "console":
        return block.code
    commands = [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]
    if not commands:
        raise GuideError(f"line {block.line}: a ```console block without a `$ ` command line")
    return "\n".join(commands) + "\n"


SHELL_SYNTAX = re.compile(r"[$`*?~{}]")  # what bash would expand, or may: such a block runs in bash


def fastfair_commands(script: str) -> list[list[str]] | None:
    """The argument lists of ``script``'s commands when each is ``fastfair`` with words and quotes alone (lines
    continued with a backslash joined, ``#`` comments dropped); None when any line is something else."""
    commands = []
    for line in script.replace("\\\n", " ").splitlines():
        if SHELL_SYNTAX.search(line):
            return None
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = list(lexer)
        if not words:
            continue
        if words[0] != "fastfair" or any(set(w) <= set(lexer.punctuation_chars) for w in words):
            return None  # another program, or a pipe, list, redirection or subshell
        commands.append(words[1:])
    return commands or None


@contextlib.contextmanager
def environment(env: dict):
    """``os.environ`` as ``env`` for the block's in-process commands, then as it was."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_shell(block: Block, folder: Path, env: dict) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of a shell block: its fastfair commands in this process when it holds nothing
    else (:func:`fastfair_commands`), else bash's; the first command that fails ends it, as ``bash -e`` does."""
    script = shell_script(block)
    commands = fastfair_commands(script)
    if commands is None:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=env, capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        return done.returncode, done.stdout, done.stderr
    out, err = io.StringIO(), io.StringIO()
    with environment(env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for argv in commands:
            code = cli.main(argv)
            if code:
                return code, out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def shim(folder: Path) -> dict:
    """The environment of a guide's shell blocks: ``fastfair`` on PATH is ``python -m fastfair`` of this checkout."""
    bin_dir = folder / ".bin"
    bin_dir.mkdir()
    (bin_dir / "fastfair").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m fastfair "$@"\n')
    (bin_dir / "fastfair").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TERM="dumb", COLUMNS="120",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
               FASTFAIR_DATA=str(folder / ".data"))  # nothing lands in the user's ~/.cache
    return env


def run_guide(path: Path, folder: Path, namespace: dict | None = None) -> int:
    """Run ``path``'s blocks in ``folder``; the number run. A failing block raises with its output."""
    blocks = parse(path.read_text(), path.name)
    for name in SUBSETS:
        if (SHARED / name).is_file():
            (folder / name).symlink_to(SHARED / name)
    env, namespace, ran = shim(folder), {} if namespace is None else namespace, 0
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        for block in blocks:
            where = f"{path.name}:{block.line}"
            if block.file:
                (folder / block.file).parent.mkdir(parents=True, exist_ok=True)
                (folder / block.file).write_text(block.code)
                continue
            if block.not_run or block.lang in SHOWN:
                continue
            missing = [n for n in SUBSETS if n in block.code and not (folder / n).exists()]
            if missing:
                pytest.skip(f"{NO_REAL_DATA}: {SHARED / missing[0]} not found ({where} and after)")
            if block.lang == "python":
                exec(compile(block.code, where, "exec"), namespace)
            else:
                code, stdout, stderr = run_shell(block, folder, env)
                if code:
                    raise GuideError(f"{where}: exit code {code}\n{block.code}\n--- stdout\n{stdout[-3000:]}\n"
                                     f"--- stderr\n{stderr[-3000:]}")
            ran += 1
    finally:
        os.chdir(cwd)
    return ran


def links(text: str) -> list[str]:
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not t.startswith(("http://", "https://", "#"))]


# ---- the guides as they are --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", guides(), ids=lambda p: p.name)
def test_blocks_follow_the_convention(path):
    blocks = parse(path.read_text(), path.name)
    if path.parent.name == "guides":  # the home page only shows the commands the guides run
        assert any(b.lang in RUN and not b.not_run and not b.file for b in blocks), f"{path.name} runs no block"
    for b in blocks:
        if b.lang == "console":
            shell_script(b)


@pytest.mark.parametrize("path", guides(), ids=lambda p: p.name)
def test_links_point_inside_docs(path):
    for target in links(path.read_text()):
        if REFERENCE.search(target):
            method = re.search(r"methods/([\w+-]+)\.md", target)
            assert not method or method[1] in {*METHODS, "index"}, f"{path.name}: no method {method[1]!r} for {target}"
            continue
        file = (path.parent / target.split("#")[0]).resolve()
        assert file.is_file() and DOCS in file.parents, f"{path.name}: {target} is not a page under docs/"


@pytest.mark.slow
@pytest.mark.parametrize("path", guides(), ids=lambda p: p.name)
def test_every_block_runs(path, tmp_path):
    ran = run_guide(path, tmp_path)
    assert ran >= 1 or path.parent.name != "guides"  # the home page only shows what the guides run


# ---- the checker: it fails on what it must fail on ----------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "guide.md"
    path.write_text(text)
    return path


@pytest.mark.parametrize("text, said", [
    ("```\nls\n```\n", "without a language"),
    ("```shell-session\nls\n```\n", "unknown block language 'shell-session'"),
    ("<!-- not-run: -->\n```bash\nls\n```\n", "needs a reason"),
    ("<!-- not-run -->\n```bash\nls\n```\n", "needs a reason"),
    ("<!-- not-run: needs a GPU -->\n\nSome words.\n```bash\nls\n```\n", "not on the line before a block"),
    ("```bash\nls\n", "never closed"),
    ("- a list\n\n  ```bash\n  ls\n  ```\n", "an indented block is not run"),
])
def test_a_bad_block_is_an_error(tmp_path, text, said):
    with pytest.raises(GuideError, match=re.escape(said)):
        run_guide(write(tmp_path, text), tmp_path)


def test_a_failing_command_fails_and_a_not_run_one_is_skipped(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(GuideError, match="exit code 3"):
        run_guide(write(tmp_path / "a", "```bash\ntrue\nexit 3\n```\n"), tmp_path / "a")
    (tmp_path / "b").mkdir()
    ran = run_guide(write(tmp_path / "b", "<!-- not-run: needs a GPU -->\n```bash\nexit 3\n```\n"
                          "```text\nexit 3\n```\n```console\n$ true\nnot a command\n```\n"), tmp_path / "b")
    assert ran == 1


def test_blocks_share_the_folder_and_one_namespace(tmp_path):
    ns: dict = {}
    ran = run_guide(write(tmp_path, "<!-- file: sub/made.toml -->\n```toml\nx = 1\n```\n"
                          "```bash\ntest -f sub/made.toml && echo hi > said.txt\n```\n"
                          "```python\nn = open('said.txt').read().strip()\n```\n"
                          "```python\nassert n == 'hi'\nm = 2\n```\n"), tmp_path, ns)
    assert ran == 3 and ns["m"] == 2


def test_fastfair_in_a_shell_block_is_this_checkout(tmp_path):
    # not a console script another install put on PATH: the shim, running this interpreter on this checkout
    run_guide(write(tmp_path, "```sh\nfastfair presets > presets.txt\ncommand -v fastfair > which.txt\n"
                    "python -c 'import fastfair; print(fastfair.__file__)' > where.txt\n```\n"), tmp_path)
    assert "demo" in (tmp_path / "presets.txt").read_text()
    assert tmp_path in Path((tmp_path / "which.txt").read_text().strip()).parents
    assert (tmp_path / "where.txt").read_text().strip() == str(ROOT / "fastfair" / "__init__.py")


def test_a_block_of_fastfair_commands_alone_runs_in_process_with_the_words_bash_passes(tmp_path):
    script = ("fastfair train --config demo --out runs/a \\\n"
              "    --set eval.attacks='[\"clean\",\"fgsm\"]'  # a comment\n"
              "\nfastfair eval \"runs/a b\" --attacks clean,pgd20\n")
    words = fastfair_commands(script)
    # what bash passes the same lines: each command's arguments, NUL-separated
    said = subprocess.run(["bash", "-c", "fastfair() { printf '%s\\0' \"$@\"; printf '\\n'; }\n" + script],
                          capture_output=True, text=True, check=True).stdout
    assert words == [line.split("\0")[:-1] for line in said.splitlines()]
    assert words[0][-1] == 'eval.attacks=["clean","fgsm"]' and words[1][1] == "runs/a b"
    for other in ("fastfair presets > p.txt", "fastfair eval $RUN", "ls\nfastfair presets", "fastfair a && fastfair b",
                  "fastfair eval runs/*", "(fastfair presets)", "fastfair presets | head", "# nothing\n"):
        assert fastfair_commands(other) is None, other


def test_an_in_process_command_that_fails_fails_its_block(tmp_path):
    with pytest.raises(GuideError, match="exit code 2(.|\n)*unknown method 'no-such-method'"):
        run_guide(write(tmp_path, "```bash\nfastfair methods\nfastfair train --method no-such-method --out x\n"
                                  "fastfair presets\n```\n"), tmp_path)
