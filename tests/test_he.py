"""HE's cosine head and margin, and the LIS / CMP temperature schedules (Tian et al. App. G)."""
import math

import numpy as np
import pytest
import torch

from fastfair import config, models
from fastfair.errors import UserError
from fastfair.methods import METHODS
from fastfair.methods.he import cmp_scale, cmp_target, lis_scale, max_probability


def test_lis_and_cmp_targets_interpolate_linearly():
    assert [lis_scale(e, 100, 1.0, 75.0) for e in (0, 50)] == [1.0, 38.0]
    assert [round(cmp_target(e, 0.2, 1.0, 90), 6) for e in (0, 45, 90, 99)] == [0.2, 0.6, 1.0, 1.0]


def test_cmp_solves_for_the_scale_with_hybrid_powell():
    gram = np.eye(10)  # orthogonal class weights: p_max(s) = e^s / (e^s + 9)
    for p in (0.2, 0.6, 0.95):
        s = cmp_scale(p, gram)
        assert s == pytest.approx(math.log(9 * p / (1 - p)), rel=1e-6)
        assert max_probability(s, gram) == pytest.approx(p, abs=1e-8)
    assert cmp_scale(1.0, gram) == pytest.approx(math.log(9 * (1 - 1e-6) / 1e-6), rel=1e-5)


def test_cosine_head_and_margin():
    m = models.build("tiny-cnn", num_classes=3, in_channels=1, mean=[0.5], std=[0.5], width=4, head="cosine",
                     head_scale=10.0)
    x = torch.rand(4, 1, 8, 8)
    z = m(x)
    cos = m.head.cosine(m.forward_features(x))
    assert torch.allclose(z, 10.0 * cos) and cos.abs().max() <= 1 + 1e-6
    cfg = config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"},
                         ["model.head=cosine", "he.margin=0.2"])
    method = METHODS.get("pgd-at")(cfg)
    y = torch.tensor([0, 1, 2, 0])
    shifted = method.ce_logits(m, z, y)
    assert torch.allclose(z - shifted, 10.0 * 0.2 * torch.nn.functional.one_hot(y, 3))


def test_schedules_move_the_head_scale_before_each_epoch():
    cfg = config.resolve(None, {"method.name": "trades", "data.dataset": "digits"},
                         ["model.head=cosine", "model.head_scale=1", "he.schedule=lis", "train.epochs=10"])
    m = models.build("tiny-cnn", num_classes=3, in_channels=1, mean=[0.5], std=[0.5], width=4, head="cosine",
                     head_scale=1.0)
    method = METHODS.get("trades")(cfg)
    method.begin_epoch(m, 5)
    assert float(m.head.scale) == pytest.approx(1 + 0.5 * 74)
    cfg = config.resolve(None, {"method.name": "trades", "data.dataset": "digits"},
                         ["model.head=cosine", "he.schedule=cmp"])
    method = METHODS.get("trades")(cfg)
    method.begin_epoch(m, 45)
    w = torch.nn.functional.normalize(m.head.weight, dim=1)
    assert max_probability(float(m.head.scale), (w @ w.T).detach().double().numpy()) == pytest.approx(0.6, abs=1e-6)


def test_he_options_need_the_cosine_head():
    with pytest.raises(UserError, match="model.head=cosine"):  # at config time, before any long work
        config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"}, ["he.schedule=lis"])


def test_weight_norm_data_passes_the_gradient_and_renormalises_after_each_step():
    """he.weight_norm=data (Pang et al.'s code): same values, the gradient at the unit rows without the
    normalisation's Jacobian, and the rows written back onto the unit sphere after the optimiser step."""
    def build():
        torch.manual_seed(0)
        return models.build("tiny-cnn", num_classes=3, in_channels=1, mean=[0.5], std=[0.5], width=4,
                            head="cosine", head_scale=10.0)

    x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 2, 0])
    grads, outs = {}, {}
    for mode in ("graph", "data"):
        cfg = config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"},
                             ["model.head=cosine", f"he.weight_norm={mode}"])
        method = METHODS.get("pgd-at")(cfg)
        m = build()
        method.begin_epoch(m, 0)
        assert m.head.weight_norm == mode
        norms = m.head.weight.norm(dim=1)
        assert torch.allclose(norms, torch.ones(3)) == (mode == "data")
        z = m(x)
        outs[mode] = z.detach()
        w = m.head.weight
        (grads[mode],) = torch.autograd.grad(torch.nn.functional.cross_entropy(z, y), w)
        if mode == "data":
            with torch.no_grad():
                w.add_(torch.randn_like(w))
            method.after_step(m)
            assert torch.allclose(w.norm(dim=1), torch.ones(3))
    assert torch.allclose(outs["graph"], outs["data"], atol=1e-5)
    # graph: d/dW f(W/||W||) = (I - w w^T) g / ||W|| (W: the raw rows), g the data gradient at w = W/||W||
    raw = build().head.weight.detach()
    norm = raw.norm(dim=1, keepdim=True)
    w, g = raw / norm, grads["data"]
    assert torch.allclose(grads["graph"], (g - (g * w).sum(1, keepdim=True) * w) / norm, atol=1e-6)
    assert not torch.allclose(grads["graph"], g, atol=1e-4)


def test_weight_norm_is_checked():
    with pytest.raises(UserError, match="he.weight_norm"):
        config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"},
                       ["model.head=cosine", "he.weight_norm=both"])
    with pytest.raises(UserError, match="model.head=cosine"):
        config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"}, ["he.weight_norm=data"])
