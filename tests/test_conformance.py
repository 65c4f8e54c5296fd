"""Every method against its reference implementation (see tests/conformance.py and docs/conformance.md)."""
import re

import pytest
import torch

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


def test_a_relu_at_a_float32_tie_explains_a_flip_in_its_receptive_field_and_nowhere_else():
    """A ReLU input the exact forward puts at 0 may go either way in float32 on another CPU's kernels, and with it
    the gradient of every input element under that unit; an element outside that 3x3 field is still a real
    difference (conformance.routing_ties, the tolerances in docs/conformance.md)."""
    torch.manual_seed(0)
    net = conformance.TinyNet().eval()
    x = torch.rand(1, 3, 32, 32)
    with torch.no_grad():
        net.features[0].bias -= net.features[0](x)[0, :, 5, 5]  # every conv1 channel exactly 0 at (5, 5)
        net.features[1].bias.fill_(0.0)
        net.features[1].weight.fill_(1.0)
    ties = conformance.routing_ties(net, x)
    assert ties[0, :, 4:7, 4:7].all()
    assert not ties[0, :, 20:, 20:].any()
    theirs = x.clone()
    ours = x.clone()
    ours[0, 0, 5, 5] += 2 / 255  # a flip at the tie: one step the other way
    ours[0, 0, 25, 25] += 2 / 255  # a flip far from it, where the gradient is not near zero
    grad = torch.ones_like(x)
    assert conformance.step_flips(ours, theirs, grad, 1 / 255, ties) == (2, 1)
