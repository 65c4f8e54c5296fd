"""Every method against its reference implementation (see tests/conformance.py and docs/conformance.md)."""
import re

import pytest

import conformance

CASES = conformance.load_cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_its_reference(name):
    checks = CASES[name]()
    assert checks, f"case {name} compared nothing"
    bad = [f"{c.method} / {c.quantity}: {c.measure} {c.diff:.3g} > {c.tol:.0e} ({c.reference})"
           for c in checks if not c.ok]
    assert not bad, "\n".join(bad)


def test_docs_conformance_lists_exactly_these_checks():
    doc = conformance.DOC.read_text()
    table = [tuple(cell.strip().strip("`") for cell in line.strip("|").split("|"))[:4]
             for line in doc.splitlines() if line.startswith("| ") and line.count("|") == 6]
    want = conformance.rows(conformance.all_checks())
    assert table[2:] == want, "regenerate: python tests/golden/make.py doc"
    for d in conformance.DIFFERENCES:
        assert re.search(re.escape(f"| {d.method} | {d.what} | `{d.key}` |"), doc), \
            "regenerate: python tests/golden/make.py doc"
