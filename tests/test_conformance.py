"""Every method against its reference implementation (see tests/conformance.py and docs/conformance.md)."""
import copy
import re

import pytest
import torch

import conformance

CASES = conformance.load_cases()


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_its_reference(name):
    checks = CASES[name]()
    assert checks, f"case {name} compared nothing"
    bad = [f"{c.method} / {c.quantity}: {c.measure} {c.diff:.3g} > {c.tol.value:.3g} ({c.tol.how}; {c.reference})"
           for c in checks if not c.ok]
    assert not bad, "\n".join(bad)


def test_docs_conformance_lists_exactly_these_checks():
    doc = conformance.DOC.read_text()
    table = [tuple(cell.strip("`") for cell in conformance.cells(line))[:4]
             for line in doc.splitlines() if line.startswith("| ") and len(conformance.cells(line)) == 5]
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


def test_every_tolerance_says_how_it_was_derived():
    """A Check's tolerance is a conformance.Tol made by a derivation helper, saying how (shown in
    docs/conformance.md); a bare number is refused where the Check is made."""
    for c in conformance.all_checks():
        assert isinstance(c.tol, conformance.Tol) and c.tol.how, f"{c.method} / {c.quantity}: {c.tol!r}"
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


def test_derived_tolerances_still_catch_a_wrong_kl_weight():
    """TRADES's loss and weight gradient with beta 10 % smaller than the code's differ from the golden values by
    far more than their derived tolerances (the bounds are not so loose that a wrong setting passes)."""
    import conformance_trades

    g, inp = conformance.golden("trades"), conformance.inputs()
    s = g.meta["settings"]
    m, state = conformance.method("trades", f"method.kl_weight={0.9 * s['beta']}")
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    model = inp.model("train")
    loss, _ = m.objective(model, x, g.t("x_adv"), y, state)
    right = {c.quantity: c for c in conformance_trades.code_loss_checks("TRADES", "trades")[0]}
    assert conformance.max_diff(loss.detach(), g.t("loss")) > 10 * right["loss on the code's x_adv"].tol.value
    assert (conformance.rel_diff(conformance.weight_grad(model, loss), g.t("weight_grad"))
            > 10 * right["weight gradient on the code's x_adv"].tol.value)
