"""Every method against its reference implementation (see tests/conformance.py and docs/conformance.md)."""
import copy
import re

import pytest
import torch

import conformance

CASES = conformance.load_cases()
DOC_SECTIONS = conformance.doc_sections(conformance.DOC.read_text())


def failing(checks) -> list[str]:
    return [f"{c.method} / {c.quantity}: {c.measure} {c.diff:.3g} > {c.tol.value:.3g} ({c.tol.how}; {c.reference})"
            for c in checks if not c.ok]


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_its_reference(name):
    """In float64 on both sides at float64 bounds; fastfair in float32 (its real dtype path) against the same
    golden values at float32 bounds (the smoke check); every tolerance says how it was derived (a conformance.Tol
    made by a derivation helper, shown in docs/conformance.md); and docs/conformance.md lists exactly these rows.
    The case runs once for all of these (each run costs seconds to a minute)."""
    full, smoke = conformance.case_checks(name)
    assert smoke, f"case {name} compared nothing"
    for c in full + smoke:
        assert isinstance(c.tol, conformance.Tol) and c.tol.how, f"{c.method} / {c.quantity}: {c.tol!r}"
    assert not failing(full), "float64:\n" + "\n".join(failing(full))
    assert not failing(smoke), "float32 smoke:\n" + "\n".join(failing(smoke))
    listed = [tuple(cell.strip("`") for cell in conformance.cells(line)) for line in DOC_SECTIONS.get(name, [])
              if line.startswith("| ") and not line.startswith(("| method |", "| --- |"))]
    want = conformance.rows(name, (full, smoke))
    assert [(r[0], r[1], r[2], r[3], r[5]) for r in listed] == want, "regenerate: python tests/golden/make.py doc"


def test_docs_conformance_lists_exactly_these_cases_and_differences():
    """Each case's rows are checked by test_matches_its_reference; here, no case is missing or left over."""
    assert sorted(DOC_SECTIONS) == sorted(CASES), "regenerate: python tests/golden/make.py doc"
    doc = conformance.DOC.read_text()
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


def test_a_bare_number_is_refused_as_a_tolerance():
    """A Check's tolerance is a conformance.Tol made by a derivation helper, saying how (each case's are checked in
    test_matches_its_reference, which runs it); a bare number is refused where the Check is made."""
    with pytest.raises(TypeError, match="derivation helper"):
        conformance.Check("m", "q", "ref", 0.0, 1e-6)


def test_derived_loss_and_gradient_bounds_hold_between_float32_and_float64():
    """conformance.logit_tol and weight_grad_tol are bounds: float32's actual error (one side: against float64) of
    a TinyNet's CE loss and of its weight gradient in train mode lies within them."""
    torch.manual_seed(1)
    net = conformance.TinyNet().train()
    x, y = torch.rand(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def loss(model):
        return torch.nn.functional.cross_entropy(model(x), y)

    got = loss(net)
    grad = conformance.weight_grad(net, got)
    net64 = copy.deepcopy(net).double()
    exact = torch.nn.functional.cross_entropy(net64(x.double()), y)
    exact_grad = conformance.weight_grad(net64, exact)
    assert conformance.max_diff(got.detach(), exact.detach()) <= conformance.logit_tol(loss, net, sides=1).value
    assert conformance.rel_diff(grad, exact_grad) <= conformance.weight_grad_tol(loss, net, sides=1).value


def _kl_a_mean_over_the_classes(z_nat, z_adv):
    """TRADES's KL with a mean over the classes where the code (KLDivLoss(size_average=False)) sums them."""
    logp_nat, logp_adv = z_nat.log_softmax(1), z_adv.log_softmax(1)
    return (logp_nat.exp() * (logp_nat - logp_adv)).mean(1)


@pytest.mark.parametrize("mutation", ["KL weight 0.1 % larger", "KL a mean where the code sums"])
def test_a_small_mutation_fails_the_float64_check(mutation, monkeypatch):
    """fastfair's TRADES with its KL weight 0.1 % off, or its KL averaged over the classes where the code sums
    them, fails the float64 loss and weight-gradient checks against the TRADES code, while the right one passes
    them. The 0.1 % weight moves the loss by 3e-3 and the gradient by 1e-3 relative: 5e9 and 6e8 times their
    float64 tolerances, where the float32 bound of the gradient (9e-4) is within 12 % of it."""
    import conformance_trades
    from fastfair.ops import losses

    sets = []
    if mutation.startswith("KL weight"):
        sets = [f"method.kl_weight={1.001 * conformance.golden('trades').meta['settings']['beta']}"]
    else:
        monkeypatch.setattr(losses, "trades_kl", _kl_a_mean_over_the_classes)
    with conformance.precision(torch.float64):
        checks = conformance_trades.code_loss_checks("TRADES", "trades", *sets)[0]
    failed = {c.quantity for c in checks if not c.ok}
    assert {"loss on the code's x_adv", "weight gradient on the code's x_adv"} <= failed
    assert all(c.ok for c in conformance.checks("trades", torch.float64))
