"""FAT's early-stopped PGD and MART's loss on hand-made models."""
import math

import torch
import torch.nn.functional as F
from torch import nn

from fastfair import config
from fastfair.ops import losses
from fastfair.training.class_state import ClassState
from fastfair.methods import METHODS
from fastfair.attacks import PGD
from fastfair.methods.fat import EarlyStop, tau_at
from fastfair.methods.mart import boosted_margin


def always_class_1() -> nn.Module:
    """z = (x_0, x_1 + 10): predicts class 1 everywhere in [0, 1]^2, input gradients of fixed non-zero sign."""
    lin = nn.Linear(2, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.eye(2))
        lin.bias.copy_(torch.tensor([0.0, 10.0]))
    return nn.Sequential(nn.Flatten(), lin)


def steps_taken(tau: int, steps: int = 6) -> list[int]:
    x = torch.full((2, 1, 1, 2), 0.5)
    y = torch.tensor([0, 1])  # sample 0 is always misclassified, sample 1 never
    eps, alpha = torch.full((2,), 0.5), torch.full((2,), 0.01)
    x_adv = PGD(steps=steps, init="none", stop=EarlyStop(tau))(always_class_1(), x, y, eps, alpha)
    return [round(v) for v in ((x_adv - x).abs().flatten(1).amax(1) / 0.01).tolist()]


def test_fat_stops_a_sample_after_tau_extra_misclassifications():
    assert steps_taken(tau=0) == [0, 6]  # misclassified at the first check: never moved
    assert steps_taken(tau=2) == [2, 6]  # two more steps allowed, stopped at the third check
    assert steps_taken(tau=10) == [6, 6]


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
