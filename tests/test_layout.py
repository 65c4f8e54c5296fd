"""The package's shape: the CLI is a leaf of the import graph.

``fastfair.cli`` is the entry point over the library: it imports what each command runs when it runs (``fastfair
--help`` answers without importing torch). Only ``fastfair.__main__`` imports it, so library code never depends on
argument parsing (docs/hooks.py lives outside the package for this reason) and the CLI's lazy imports cannot close a
cycle; tests/test_imports.py checks the cycles themselves.
"""
from test_imports import PACKAGES, import_graph

LAZY_ENTRY_POINT = "fastfair.cli"


def test_only_main_imports_the_cli():
    importers = {m for m, deps in import_graph(PACKAGES).items() if LAZY_ENTRY_POINT in deps}
    assert importers <= {"fastfair.__main__"}
