"""FAT's early-stopped PGD and MART's loss on hand-made models."""
import math

import pytest

import torch
import torch.nn.functional as F
from torch import nn

from fastfair import config
from fastfair.errors import UserError
from fastfair.preset_files import preset_names
from fastfair.ops import losses
from fastfair.training.class_state import ClassState
from fastfair.methods import METHODS
from fastfair.attacks import PGD
from fastfair.methods.fat import BudgetStop, EarlyStop, tau_at
from fastfair.methods.mart import boosted_margin


def always_class_1() -> nn.Module:
    """z = (x_0, x_1 + 10): predicts class 1 everywhere in [0, 1]^2, input gradients of fixed non-zero sign."""
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.copy_(torch.tensor([0.0, 10.0]))
    return nn.Sequential(nn.Flatten(), lin)


class Alternating(nn.Module):
    """Predicts class 0 after an even number of 0.01 steps down from 0.5, class 1 after an odd one; the
    input gradient of CE(., 0) is negative everywhere, so every PGD step it takes goes down by 0.01."""

    def forward(self, x):
        n = torch.round((0.5 - x.detach().flatten(1)[:, 0]) / 0.01)
        right = torch.where(n.remainder(2) == 0, 10.0, -10.0)
        return torch.stack([right + 1e-3 * x.flatten(1).sum(1), torch.zeros_like(right)], 1)


def steps_taken(tau: int, steps: int = 6, rule=EarlyStop, model=None) -> list[int]:
    x = torch.full((2, 1, 1, 2), 0.5)
    y = torch.tensor([0, 1])  # always_class_1: sample 0 is always misclassified, sample 1 never
    eps, alpha = torch.full((2,), 0.5), torch.full((2,), 0.01)
    x_adv = PGD(steps=steps, init="none", stop=rule(tau))(model or always_class_1(), x, y, eps, alpha)
    return [round(v) for v in ((x_adv - x).abs().flatten(1).amax(1) / 0.01).tolist()]


def test_fat_stops_a_sample_after_tau_extra_misclassifications():
    assert steps_taken(tau=0) == [0, 6]  # misclassified at the first check: never moved
    assert steps_taken(tau=2) == [2, 6]  # two more steps allowed, stopped at the third check
    assert steps_taken(tau=10) == [6, 6]


def test_cfa_rule_moves_only_while_the_budget_is_positive():
    assert steps_taken(tau=0, rule=BudgetStop) == [0, 0]  # CFA's fat_loss: tau 0 moves nothing
    assert steps_taken(tau=2, rule=BudgetStop) == [2, 6]
    assert steps_taken(tau=10, rule=BudgetStop) == [6, 6]


def test_the_two_rules_on_a_prediction_that_alternates_with_each_step():
    """Right, wrong, right, ...: FAT's rule takes one step more than CFA's, which stops once the budget
    is spent even though the sample is then classified correctly again."""
    fat = [steps_taken(tau, 10, EarlyStop, Alternating())[0] for tau in range(4)]
    cfa = [steps_taken(tau, 10, BudgetStop, Alternating())[0] for tau in range(4)]
    assert (fat, cfa) == ([1, 3, 5, 7], [0, 2, 4, 6])


def test_stop_rule_and_omega_keys():
    def attack(*sets):
        cfg = config.resolve(None, {"method.name": "fat", "data.dataset": "digits"}, list(sets))
        return METHODS.get("fat")(cfg).attack

    a = attack()
    assert (type(a.stop), a.noise) == (EarlyStop, 0.001)  # FAT's code: earlystop.py, --omega 0.001
    a = attack("method.stop_rule=cfa", "method.omega=0", "method.tau=3")
    assert (a.stop, a.noise) == (BudgetStop(3), 0.0)
    for preset in [p for p in preset_names() if p.startswith("cfa-") and "-fat" in p]:
        m = config.resolve(preset).method
        assert (m.stop_rule, m.omega) == ("cfa", 0.0), preset  # CFA's code: fat_loss, no noise
    with pytest.raises(UserError, match="stop_rule"):
        attack("method.stop_rule=cfa-code")


def test_step_noise_is_drawn_from_the_seeded_generator_before_the_descent():
    """x' <- clip(x' + alpha sign(g) + omega n_k) with n drawn as one (K, *x.shape) tensor; stopped rows get none."""
    x = torch.full((2, 1, 1, 2), 0.5)
    y = torch.tensor([0, 1])
    eps, alpha = torch.full((2,), 0.5), torch.full((2,), 0.01)
    model = always_class_1()
    torch.manual_seed(3)
    out = PGD(steps=3, init="none", noise=0.02, stop=EarlyStop(1))(model, x, y, eps, alpha)
    torch.manual_seed(3)
    n = 0.02 * torch.randn((3, *x.shape))
    want = x.clone()
    for k in range(3):  # sample 0 (always wrong) takes one step, sample 1 all three; CE's gradient: -, +
        step = want + torch.tensor([-0.01, 0.01]).view(2, 1, 1, 1) * torch.tensor([[1.0, -1.0]]).view(1, 1, 1, 2)
        moved = (step + n[k]).clamp(0, 1)
        want = torch.where(torch.tensor([k < 1, True]).view(2, 1, 1, 1), moved, want)
    torch.testing.assert_close(out, want)


def test_fat_dynamic_tau_schedule():
    assert [tau_at(e, 0, [50, 90]) for e in (0, 49, 50, 89, 90, 119)] == [0, 0, 1, 1, 2, 2]


def test_mart_loss_matches_its_formula():
    z_adv = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    assert torch.allclose(boosted_margin(z_adv, torch.tensor([0])), torch.tensor([-math.log(1.0001 - 0.2)]))
    cfg = config.resolve(None, {"method.name": "mart", "data.dataset": "digits"})
    assert (cfg.attack.objective, cfg.attack.init, cfg.method.kl_weight) == ("ce", "normal", 6.0)
    m = METHODS.get("mart")(cfg)
    state = ClassState(3, "cpu")
    m.setup(state)
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, x_adv, y = torch.randn(5, 4), torch.randn(5, 4), torch.tensor([0, 1, 2, 0, 1])
    loss, _ = m.objective(model, x, x_adv, y, state)
    z, za = model(x), model(x_adv)
    p_y = F.softmax(z, 1).gather(1, y[:, None]).squeeze(1)
    want = (losses.cross_entropy(za, y) + boosted_margin(za, y) + 6.0 * losses.trades_kl(z, za) * (1 - p_y)).mean()
    assert torch.allclose(loss, want, atol=1e-6)
