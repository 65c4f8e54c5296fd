import math

import pytest
import torch

from fastfair.ops import losses

Z = torch.tensor([[2.0, 1.0, 0.0], [0.0, 0.0, 3.0]])
Y = torch.tensor([0, 1])


def softmax_rows():
    return [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in Z.tolist()]


def test_cross_entropy_by_hand():
    p = softmax_rows()
    expected = [-math.log(p[0][0]), -math.log(p[1][1])]
    assert losses.cross_entropy(Z, Y).tolist() == pytest.approx(expected, rel=1e-6)


def test_label_smoothing_by_hand():
    a, c = 0.1, 3
    p = softmax_rows()
    expected = []
    for i, y in enumerate(Y.tolist()):
        q = [(1 - a) * (j == y) + a / c for j in range(c)]
        expected.append(-sum(q[j] * math.log(p[i][j]) for j in range(c)))
    assert losses.cross_entropy(Z, Y, smoothing=a).tolist() == pytest.approx(expected, rel=1e-6)


def test_entropy_by_hand():
    p = softmax_rows()
    expected = [-sum(v * math.log(v) for v in row) for row in p]
    assert losses.entropy(Z).tolist() == pytest.approx(expected, rel=1e-6)
    assert losses.entropy(torch.zeros(1, 10)).item() == pytest.approx(math.log(10), rel=1e-6)


def test_trades_kl_by_hand():
    z_adv = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    p = softmax_rows()
    q = [[math.exp(v) / sum(math.exp(u) for u in row) for v in row] for row in z_adv.tolist()]
    expected = [sum(pi * (math.log(pi) - math.log(qi)) for pi, qi in zip(pr, qr)) for pr, qr in zip(p, q)]
    assert losses.trades_kl(Z, z_adv).tolist() == pytest.approx(expected, rel=1e-6)
    assert losses.trades_kl(Z, Z).abs().max().item() < 1e-6


def test_cw_margin_by_hand():
    # row 0: max other 1 - z_y 2 = -1; row 1: max other 3 - 0 = 3, clamped at kappa 2
    assert losses.cw_margin(Z, Y).tolist() == pytest.approx([-1.0, 3.0])
    assert losses.cw_margin(Z, Y, kappa=2.0).tolist() == pytest.approx([-1.0, 2.0])


def test_row_loss_combines_terms_with_per_sample_weights():
    z_adv = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    w = torch.tensor([0.5, 2.0])
    got = losses.row_loss(Z, z_adv, Y, ce_nat=1.0, kl=w, ent_nat=0.3)
    expected = losses.cross_entropy(Z, Y) + w * losses.trades_kl(Z, z_adv) - 0.3 * losses.entropy(Z)
    torch.testing.assert_close(got, expected)


def test_row_loss_temperature_scales_logits():
    got = losses.row_loss(None, Z, Y, ce_adv=1.0, temperature=0.5)
    torch.testing.assert_close(got, losses.cross_entropy(Z / 0.5, Y))


def test_row_loss_stable_for_extreme_logits():
    z = torch.tensor([[1e4, -1e4, 0.0]])
    out = losses.row_loss(z, z * 0.5, torch.tensor([0]), ce_nat=1.0, kl=1.0, ent_nat=1.0, smoothing=0.1)
    assert torch.isfinite(out).all()


def test_row_loss_rejects_unknown_weight_names():
    with pytest.raises(TypeError, match="unknown weight.*ce_ad.*known terms: ce_nat"):
        losses.row_loss(None, Z, Y, ce_ad=1.0)


def test_each_term_reads_only_its_logits():
    """A term alone, with the logits it does not read passed as None, is its sign times its value."""
    for term in losses.TERMS:
        z = {"nat": Z, "adv": Z.flip(1)}
        given = {r: z[r] if r in term.reads else None for r in ("nat", "adv")}
        got = losses.row_loss(given["nat"], given["adv"], Y, **{term.name: 0.5})
        want = 0.5 * term.sign * term.value(*(z[r] for r in term.reads), Y, 0.0, math.inf)
        torch.testing.assert_close(got, want)
