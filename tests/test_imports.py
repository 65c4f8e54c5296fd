"""No import cycle between fastfair's modules: every package's ``__init__`` imports nothing that imports it back.

The graph is read from the source (``ast``), so it holds every import a module can run: at top level and inside
functions (a function-local import runs when its function does, and closes a cycle as surely), leaving out only
``if TYPE_CHECKING:`` blocks, which never run. An edge goes to each module whose namespace a statement reads:

* ``import a.b.c`` (``as x`` or not): ``a``, ``a.b`` and ``a.b.c``, since the name is looked up through each package;
* ``from p import n`` (a relative one resolved first): ``p``, whose ``__init__`` fills the namespace ``n`` is read
  from, and ``p.n`` too when ``n`` is a module. Inside ``p``'s own modules that namespace is half-built while
  ``p``'s ``__init__`` imports them: a submodule is found there only through the import system's fallback, any other
  name fails with "partially initialized module";
* ``importlib.import_module("a.b")``: ``a.b``; ``importlib.import_module(f"{__name__}.{...}")`` in a package (how
  ``fastfair.methods`` registers every module it holds): each of the package's modules.

Python runs a package's ``__init__`` before any module in it, but that order is not a dependency a module chooses,
so ``from p.m import n`` is an edge to ``p.m`` alone: were it one to ``p`` as well, every package whose ``__init__``
imports its own modules would be a cycle. So a module inside ``p`` takes what it needs from ``p.m``, never from ``p``.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# package -> its folder; kernels/ installs as fastfair.kernels (pyproject's package-dir)
PACKAGES = {"fastfair": ROOT / "fastfair", "fastfair.kernels": ROOT / "kernels"}


def modules(packages: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (its file, whether it is a package's ``__init__``)."""
    out = {}
    for prefix, base in packages.items():
        for path in sorted(base.rglob("*.py")):
            parts = [prefix, *path.relative_to(base).with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _typing_only(tree: ast.Module) -> set[ast.AST]:
    """The nodes inside ``if TYPE_CHECKING:`` branches: they never run."""
    return {n for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for n in ast.walk(stmt)}


def _dynamic(node: ast.Call, name: str, is_package: bool, known: set[str]) -> set[str]:
    """What ``importlib.import_module(...)`` imports, where the source says it."""
    called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
    if called != "import_module" or not node.args:
        return set()
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return {arg.value} & known
    if (is_package and isinstance(arg, ast.JoinedStr) and len(arg.values) >= 2
            and isinstance(arg.values[0], ast.FormattedValue) and ast.unparse(arg.values[0].value) == "__name__"
            and isinstance(arg.values[1], ast.Constant) and arg.values[1].value == "."):
        return {m for m in known if m.rpartition(".")[0] == name}
    return set()


def _source(node: ast.ImportFrom, here: str) -> str:
    """The module ``from SOURCE import ...`` reads, a relative one resolved against ``here`` (the first dot)."""
    if not node.level:
        return node.module
    base = here.split(".")[:len(here.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(name: str, path: Path, is_package: bool, known: set[str]) -> set[str]:
    """The modules of ``known`` whose namespace ``name``'s source reads (the module docstring's rules)."""
    here = name if is_package else name.rpartition(".")[0]  # what a relative import's first dot stands for
    found = set()
    tree = ast.parse(path.read_text())
    skipped = _typing_only(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        elif isinstance(node, ast.ImportFrom):
            source = _source(node, here)
            found |= {source, *(f"{source}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Call):
            found |= _dynamic(node, name, is_package, known)
    return (found & known) - {name}


def import_graph(packages: dict[str, Path]) -> dict[str, set[str]]:
    mods = modules(packages)
    return {name: imports(name, path, is_package, set(mods)) for name, (path, is_package) in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as [m, ..., m], shortest from its first."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(m):
        index[m] = low[m] = len(index)
        stack.append(m)
        on_stack.add(m)
        for dep in sorted(graph[m]):
            if dep not in index:
                connect(dep)
                low[m] = min(low[m], low[dep])
            elif dep in on_stack:
                low[m] = min(low[m], index[dep])
        if low[m] == index[m]:
            group = set()
            while m not in group:
                group.add(stack.pop())
            on_stack.difference_update(group)
            if len(group) > 1:
                groups.append(group)

    for m in sorted(graph):
        if m not in index:
            connect(m)
    found = []
    for group in groups:
        start = min(group)
        paths, seen = [[start]], set()
        while paths:  # breadth first: the shortest way back to start inside the group
            path = paths.pop(0)
            nxt = sorted(d for d in graph[path[-1]] if d in group)
            if start in nxt:
                found.append([*path, start])
                break
            for dep in nxt:
                if dep not in seen:
                    seen.add(dep)
                    paths.append([*path, dep])
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(PACKAGES)


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert found == [], "import cycles (break each where a module reads its own package):\n" + "\n".join(
        " -> ".join(c) for c in found)


def test_the_graph_holds_fastfair_and_kernels(graph):
    """A graph that lost its modules would find no cycle: it holds both folders and the edges read from them."""
    assert {"fastfair.cli", "fastfair.data.ffcv", "fastfair.kernels.pgd", "fastfair.reproduce.figures.me"} <= set(graph)
    assert "fastfair.data.ffcv" in graph["fastfair.data"]  # the package registers its loader
    assert "fastfair.ops.steps" in graph["fastfair.kernels.pgd"]
    assert "fastfair.kernels" in graph["fastfair.ops"]  # a function-local import (the triton backend)
    assert "fastfair.methods.absld" in graph["fastfair.methods"]  # imported by importlib, module by module
    assert "fastfair.config" not in graph["fastfair.methods.base"]  # under TYPE_CHECKING only


def test_the_package_takes_no_public_name_from_fastfair():
    """``fastfair``'s public names are imported by its ``__getattr__`` when first used (fastfair/__init__.py), by a
    name in a string, which the graph does not follow: inside the package each is taken from its module instead, so
    no cycle runs through them."""
    import fastfair

    public = set(fastfair.__all__)
    found = []
    for name, (path, is_package) in modules(PACKAGES).items():
        here = name if is_package else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and _source(node, here) == "fastfair":
                found += [f"{name}: from fastfair import {a.name}" for a in node.names if a.name in public]
            elif isinstance(node, ast.Attribute) and ast.unparse(node.value) == "fastfair" and node.attr in public:
                found.append(f"{name}: fastfair.{node.attr}")
    assert found == []


# A package "pkg" whose __init__ imports its module a; b and c are the other modules. Each case: what a.py holds
# (its other files stay fixed), and the cycle expected (None: none).
CASES = {
    "from the package": ("from pkg import b\n", ["pkg", "pkg.a", "pkg"]),
    "relative, from the package": ("from . import b\n", ["pkg", "pkg.a", "pkg"]),
    "import through the package": ("import pkg.b as b\n", ["pkg", "pkg.a", "pkg"]),
    "inside a function": ("def f():\n    from pkg.c import C\n", ["pkg", "pkg.a", "pkg.c", "pkg"]),
    "by importlib": ("import importlib\nimportlib.import_module('pkg.c')\n", ["pkg", "pkg.a", "pkg.c", "pkg"]),
    "from the module": ("from pkg.b import B\n", None),
    "relative, from the module": ("from .b import B\n", None),
    "typing only": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n", None),
}


@pytest.mark.parametrize("case", CASES)
def test_a_cycle_is_found_and_named(tmp_path, case):
    source, expected = CASES[case]
    files = {"__init__.py": "from pkg import a\n", "a.py": source, "b.py": "B = 1\n",
             "c.py": "def g():\n    from pkg import a\n"}  # c reads the package only inside a function
    for name, text in files.items():
        (tmp_path / "pkg").mkdir(exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    found = cycles(import_graph({"pkg": tmp_path / "pkg"}))
    assert found == ([expected] if expected else [])
