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
    assert cfg.train.val_attack == "pgd20" and cfg.method.kl_weight == 1.5  # frlrmrw.py (issue 25; was 1.0)
    with pytest.raises(UserError, match="--init-from"):
        METHODS.get("frl")(cfg)


def _frl(name, *sets):
    from fastfair.training.class_state import ClassState
    cfg = config.resolve(None, {"method.name": name, "data.dataset": "cifar10"}, ["train.init_from=x.pt", *sets])
    m = METHODS.get(name)(cfg)
    state = ClassState(10, "cpu")
    m.setup(state)
    return m, state


def test_loss_normalises_each_term_by_its_own_weights_as_the_code_does():
    """FRL code's train_model: sum(w_nat CE) / sum(w_nat) + beta sum(w_bndy KL) / sum(w_bndy) (issue 25;
    the old rows were over sum(w_nat + w_bndy))."""
    torch.manual_seed(0)
    m, state = _frl("frl")
    lam = torch.tensor([0.0, 0.1, 0.0, 0.3, 0.0, 0.05, 0.0, 0.0, 0.0, 0.0])
    state.set("frl_w_nat", class_weights(lam))
    state.set("frl_w_bndy", class_weights(lam.flip(0)))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    x, x_adv, y = torch.rand(16, 12), torch.rand(16, 12), torch.arange(16) % 10
    loss, _ = m.objective(model, x, x_adv, y, state)
    w0, w1 = state["frl_w_nat"][y], state["frl_w_bndy"][y]
    z, za = model(x), model(x_adv)
    ce = torch.nn.functional.cross_entropy(z, y, reduction="none")
    kl = (z.softmax(1) * (z.log_softmax(1) - za.log_softmax(1))).sum(1)
    want = (w0 * ce).sum() / w0.sum() + 1.5 * (w1 * kl).sum() / w1.sum()
    assert torch.allclose(loss, want, atol=1e-6)


def test_remargin_step_is_the_batch_largest_eps_over_four_and_reweight_keeps_alpha():
    m, state = _frl("frl")
    state.set("eps_frl", torch.tensor([1.0, 2.0, 3.0] + [1.0] * 7))
    y = torch.tensor([0, 1, 1, 4])  # class 2 (factor 3) is not in the batch
    assert torch.allclose(m.step_sizes(y, state), torch.full((10,), 2.0 * 8 / 255 / 4))
    m, state = _frl("frl-rw")
    assert torch.equal(m.step_sizes(y, state), state["alpha"])
    m, state = _frl("frl-rw", "method.step_from_eps=true")
    assert torch.allclose(m.step_sizes(y, state), torch.full((10,), 8 / 255 / 4))
