"""CFA's CCM and CCR, class-wise beta, cost-sensitive weights and adversarial classes, on hand-made inputs."""
import pytest
import torch
from torch import nn

from fastfair import config
from fastfair.ops import losses
from fastfair.errors import UserError
from helpers import make_method
from fastfair.methods.cost_sensitive import weights_from_robust_accuracy

EPS = 8 / 255


def stats(acc_percent):
    return {"train_acc_per_class": acc_percent, "val": {}}


def test_ccm_lambda_defaults_follow_cfa_per_method():
    lam = {name: config.resolve(None, {"method.name": name, "data.dataset": "digits"}).ccm.lambda_1
           for name in ("pgd-at", "trades", "fat")}
    assert lam == {"pgd-at": 0.5, "trades": 0.3, "fat": 0.7}


def test_ccm_sets_eps_k_from_train_robust_accuracy_after_begin():
    m, state = make_method("pgd-at", "ccm.enabled=true", "ccm.begin=2", "ccr.begin=2")
    m.end_epoch(state, 0, stats([20.0, 50.0, 80.0]))  # epoch 1 < begin: base eps
    assert torch.allclose(state["eps"], torch.full((3,), EPS))
    m.end_epoch(state, 1, stats([20.0, 50.0, 80.0]))  # epoch 2 uses (0.5 + A_k) eps
    assert torch.allclose(state["eps"], torch.tensor([0.7, 1.0, 1.3]) * EPS)
    assert torch.allclose(state["alpha"], torch.full((3,), 2 / 255))  # step stays (CFA code)


def test_ccr_calibrates_beta_and_normalises_the_trades_loss():
    m, state = make_method("trades", "ccr.enabled=true", "ccm.begin=0", "ccr.begin=0")
    m.end_epoch(state, 0, stats([0.0, 50.0, 100.0]))
    assert torch.allclose(state["kl_weight"], torch.tensor([0.5, 1.0, 1.5]) * 6)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, x_adv, y = torch.randn(5, 4), torch.randn(5, 4), torch.tensor([0, 1, 2, 2, 0])
    loss, _ = m.objective(model, x, x_adv, y, state)
    z, za = model(x), model(x_adv)
    b = torch.tensor([3.0, 6.0, 9.0])[y]
    want = ((losses.cross_entropy(z, y) + b * losses.trades_kl(z, za)) / (1 + b)).mean()
    assert torch.allclose(loss, want, atol=1e-6)


def test_ccr_needs_a_trades_family_method():
    with pytest.raises(UserError, match="ccr"):
        make_method("pgd-at", "ccr.enabled=true")


def test_class_wise_beta_gathers_the_vector_by_label_without_normalising():
    m, state = make_method("trades", "method.kl_weight_per_class=[6, 0.5, 6]")
    torch.manual_seed(1)
    model = nn.Linear(4, 3)
    x, x_adv, y = torch.randn(4, 4), torch.randn(4, 4), torch.tensor([0, 1, 1, 2])
    loss, _ = m.objective(model, x, x_adv, y, state)
    z, za = model(x), model(x_adv)
    want = (losses.cross_entropy(z, y) + torch.tensor([6, 0.5, 0.5, 6]) * losses.trades_kl(z, za)).mean()
    assert torch.allclose(loss, want, atol=1e-6)
    with pytest.raises(UserError, match="3 values"):
        make_method("trades", "method.kl_weight_per_class=[6, 6]")


def test_cost_sensitive_weights_given_and_derived():
    assert torch.allclose(weights_from_robust_accuracy(torch.tensor([0.5, 0.75, 1.0])), torch.tensor([2.0, 1.0, 0.0]))
    assert torch.equal(weights_from_robust_accuracy(torch.ones(3)), torch.ones(3))
    m, state = make_method("pgd-at", "cost_sensitive.weights=[1, 2, 3]")
    rows, y = torch.tensor([1.0, 1.0, 2.0]), torch.tensor([0, 1, 2])
    m.loss = lambda *_: (rows, None)  # Method.objective is the one place that weights rows by class
    assert torch.allclose(m.objective(None, None, None, y, state)[0], torch.tensor((1 + 2 + 6) / 3))
    m, state = make_method("pgd-at", "cost_sensitive.auto=true")
    m.end_epoch(state, 0, stats([50.0, 75.0, 100.0]))
    assert torch.allclose(state["loss_weight"], torch.tensor([2.0, 1.0, 0.0]))


def test_adv_classes_zero_the_other_classes_eps_so_pgd_returns_clean_images():
    m, state = make_method("pgd-at", "adv_classes.classes=[1]", "ccm.enabled=true", "ccm.begin=0", "ccr.begin=0")
    assert torch.allclose(state["eps"], torch.tensor([0.0, EPS, 0.0]))
    m.end_epoch(state, 0, stats([50.0, 50.0, 50.0]))  # CCM multiplies, the mask still holds
    assert torch.allclose(state["eps"], torch.tensor([0.0, EPS, 0.0]))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.rand(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    x_adv = m.perturb(model, x, y, state)
    moved = (x_adv - x).abs().flatten(1).amax(1) > 0
    assert moved.tolist() == [False, True, False, False, True, False]
