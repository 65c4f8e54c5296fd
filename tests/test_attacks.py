import pytest
import torch
from torch import nn

from fastfair.ops import losses
from fastfair.attacks import PGD, parse_attack, per_class
from fastfair.errors import UserError


def tiny_model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                         nn.Linear(8 * 8 * 8, 4))


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(16, 3, 8, 8, generator=g), torch.randint(0, 4, (16,), generator=g)


@pytest.mark.parametrize("objective,init", [("ce", "uniform"), ("kl", "normal"), ("cw", "uniform")])
def test_pgd_stays_in_per_class_ball_and_raises_loss(batch, objective, init):
    x, y = batch
    model = tiny_model().eval()
    eps_c = torch.tensor([0.0, 2 / 255, 8 / 255, 16 / 255])
    alpha_c = eps_c / 4
    attack = PGD(steps=10, objective=objective, init=init, bn_mode="eval")
    x_adv = attack(model, x, y, eps_c, alpha_c)
    eps = eps_c[y].view(-1, 1, 1, 1)
    # the normal init (TRADES) starts 0.001-noisy outside the ball; every PGD step projects back
    assert ((x_adv - x).abs() <= eps + 1e-6).all()
    assert x_adv.min() >= 0 and x_adv.max() <= 1
    with torch.no_grad():
        z_nat, z_clean, z_adv = model(x), model(x), model(x_adv)
        key = {"ce": "ce_adv", "kl": "kl", "cw": "cw_adv"}[objective]
        before = losses.row_loss(z_nat, z_clean, y, **{key: 1.0})
        after = losses.row_loss(z_nat, z_adv, y, **{key: 1.0})
    moved = eps_c[y] > 0
    assert after[moved].sum() > before[moved].sum()
    assert torch.equal(x_adv[~moved], x[~moved])  # eps 0: the projection pins the input


def test_attack_freezes_parameters_and_restores_mode(batch):
    x, y = batch
    model = tiny_model().train()
    PGD(steps=2, bn_mode="eval")(model, x, y, per_class(8 / 255, 4, "cpu"), per_class(2 / 255, 4, "cpu"))
    assert all(p.grad is None for p in model.parameters())
    assert all(p.requires_grad for p in model.parameters())
    assert model.training


def test_bn_mode_train_updates_running_stats_eval_does_not(batch):
    x, y = batch
    eps, alpha = per_class(8 / 255, 4, "cpu"), per_class(2 / 255, 4, "cpu")
    for mode, changes in (("train", True), ("eval", False)):
        model = tiny_model()
        before = model[1].running_mean.clone()
        PGD(steps=2, bn_mode=mode)(model, x, y, eps, alpha)
        assert (not torch.equal(before, model[1].running_mean)) == changes


def test_restarts_never_lower_attack_success(batch):
    x, y = batch
    model = tiny_model().eval()
    eps, alpha = per_class(8 / 255, 4, "cpu"), per_class(2 / 255, 4, "cpu")
    torch.manual_seed(0)
    one = (model(PGD(steps=3)(model, x, y, eps, alpha)).argmax(1) == y).sum()
    torch.manual_seed(0)
    five = (model(PGD(steps=3, restarts=5)(model, x, y, eps, alpha)).argmax(1) == y).sum()
    assert five <= one


def test_fgsm_is_one_signed_step_of_eps(batch):
    x, y = batch
    x = x * 0.5 + 0.25  # away from the [0,1] border, so no clipping
    model = tiny_model().eval()
    eps = per_class(4 / 255, 4, "cpu")
    x_adv = parse_attack("fgsm")(model, x, y, eps, eps / 4)
    torch.testing.assert_close((x_adv - x).abs(), torch.full_like(x, 4 / 255), atol=1e-6, rtol=0)


def test_parse_attack_names():
    assert parse_attack("pgd20").pgd.steps == 20
    assert parse_attack("pgd50x5").pgd.restarts == 5
    assert parse_attack("cw20").pgd.objective == "cw"
    assert parse_attack("cw20", cw_kappa=50).pgd.kappa == 50
    assert parse_attack("tpgd20@t0.1").pgd.temperature == pytest.approx(0.1)
    assert parse_attack("clean").pgd is None
    with pytest.raises(UserError, match="pgdK"):
        parse_attack("pgdx")
