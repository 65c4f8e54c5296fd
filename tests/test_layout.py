"""The package's shape: no import cycles, and no function-local imports of fastfair's own modules.

Local imports are for optional dependencies only (triton behind the ``triton`` backend, ffcv,
submitit, the official autoattack); an import of fastfair's own module inside a function is how a
cycle hides, so it is allowed only where it reaches an optional dependency (ALLOWED_LOCAL), and in
the CLI (LAZY_ENTRY_POINT), which nothing but ``__main__`` imports, so no cycle can run through it.
"""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# module -> the own module it may import inside a function, and why
ALLOWED_LOCAL = {("fastfair.ops", "fastfair.kernels"): "kernels need triton, an optional dependency"}
# Each command imports what it runs when it runs: ``fastfair --help`` must answer without importing torch.
LAZY_ENTRY_POINT = "fastfair.cli"


def modules() -> dict[str, Path]:
    out = {}
    for base, prefix in ((ROOT / "fastfair", "fastfair"), (ROOT / "kernels", "fastfair.kernels")):
        for path in base.rglob("*.py"):
            parts = [prefix, *path.relative_to(base).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def own_imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(modules imported at module level, modules imported inside functions), fastfair's own only."""
    top, local = set(), set()
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def inside_function(node) -> bool:
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return True
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                return None  # typing only: not an import at run time
        return False

    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                     for a in node.names]
        names = [n for n in names if n.split(".")[0] == "fastfair"]
        where = inside_function(node) if names else False
        if where is None:
            continue
        (local if where else top).update(n for n in names if n in known)
    return top, local


def test_no_function_local_imports_of_own_modules():
    mods = modules()
    found = {(m, dep) for m, path in mods.items() for dep in own_imports(path, set(mods))[1]
             if m != LAZY_ENTRY_POINT}
    assert found - set(ALLOWED_LOCAL) == set()


def test_only_main_imports_the_cli():
    """The CLI's lazy imports are safe only while it stays a leaf of the import graph."""
    mods = modules()
    importers = {m for m, path in mods.items() if LAZY_ENTRY_POINT in set().union(*own_imports(path, set(mods)))}
    assert importers <= {LAZY_ENTRY_POINT, "fastfair.__main__"}


def test_no_import_cycles():
    mods = modules()
    graph = {m: own_imports(path, set(mods))[0] for m, path in mods.items()}
    # importing a module first runs its packages' __init__ files
    for m in list(graph):
        for dep in list(graph[m]):
            parts = dep.split(".")
            graph[m] |= {".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) in graph} - {m}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, stack):
        state[m] = 1
        for dep in sorted(graph.get(m, ())):
            if state.get(dep) == 1 and not (m.startswith(dep + ".")):
                cycles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []
