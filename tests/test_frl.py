"""FRL's multiplier updates (Xu et al. 2021; authors' code) on hand-made validation accuracies."""
import pytest
import torch

from fastfair import config
from fastfair.errors import UserError
from fastfair.methods import METHODS
from fastfair.methods.frl import class_weights, margin_factor, normalize_multipliers, update_multipliers

KW = dict(bound=0.05, rate_weight=0.05, rate_margin=0.1, lim=0.5)


def test_multipliers_grow_for_classes_worse_than_average_and_stay_non_negative():
    clean = torch.tensor([0.9, 0.9, 0.6])  # class 2: clean error 0.4 vs mean 0.2
    robust = torch.tensor([0.6, 0.6, 0.1])  # class 2: boundary error 0.5 vs mean 0.367
    z = torch.zeros(3)
    nat, bndy, margin = update_multipliers(z, z, z, clean, robust, reweight=True, remargin=True, **KW)
    assert torch.allclose(nat, torch.tensor([0.0, 0.0, 0.05 * (0.4 - 0.2 - 0.05)]))
    assert torch.allclose(bndy, torch.tensor([0.0, 0.0, 2 * 0.05 * (0.5 - 1.1 / 3 - 0.05)]))
    assert margin[2] > 0 > margin[0]  # the remargin multiplier is not clipped (FRL code)
    w = class_weights(nat)
    assert w[2] > 1 / 3 > w[0] and torch.isclose(w.sum(), torch.tensor(1.0))
    eps = margin_factor(margin)
    assert eps[2] > 1.0 and eps[0] == pytest.approx(0.98)


def test_reweight_multipliers_respect_lim_and_margins_are_clamped():
    assert torch.allclose(normalize_multipliers(torch.tensor([0.6, 0.4, -0.2]), 0.5), torch.tensor([0.3, 0.2, 0.0]))
    assert torch.allclose(normalize_multipliers(torch.tensor([0.1, 0.2]), 0.5), torch.tensor([0.1, 0.2]))
    assert torch.allclose(margin_factor(torch.tensor([-1.0, 0.0, 5.0])), torch.tensor([0.98, 1.0, 3.0]))


def test_reweight_only_leaves_margins_and_remargin_only_leaves_weights():
    clean, robust, z = torch.tensor([0.9, 0.5]), torch.tensor([0.5, 0.1]), torch.zeros(2)
    *_, margin = update_multipliers(z, z, z, clean, robust, reweight=True, remargin=False, **KW)
    assert torch.equal(margin, z)
    nat, bndy, _ = update_multipliers(z, z, z, clean, robust, reweight=False, remargin=True, **KW)
    assert torch.equal(nat, z) and torch.equal(bndy, z)


def test_frl_needs_a_checkpoint_to_fine_tune():
    cfg = config.resolve(None, {"method.name": "frl", "data.dataset": "digits"})
    assert cfg.train.val_attack == "pgd20" and cfg.method.kl_weight == 1.0
    with pytest.raises(UserError, match="--init-from"):
        METHODS.get("frl")(cfg)
