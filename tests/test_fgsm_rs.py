"""FGSM adversarial training from a random start (Wong, Rice & Kolter 2020): its step, its ball, its errors."""
import pytest
import torch
from helpers import make_method
from test_cli import fastfair

from fastfair.errors import UserError


def test_one_step_of_1_25_eps_from_a_uniform_start_stays_in_the_ball_and_raises_the_loss():
    method, state = make_method("fgsm-rs", "attack.eps=0.1")
    assert torch.allclose(state["alpha"], torch.full((3,), 0.125)) and method.attack.steps == 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 3))
    x, y = torch.rand(256, 1, 8, 8), torch.randint(0, 3, (256,))
    x_adv = method.perturb(model, x, y, state)
    assert (x_adv - x).abs().max() <= 0.1 + 1e-6 and 0 <= x_adv.min() and x_adv.max() <= 1
    ce = torch.nn.functional.cross_entropy
    assert ce(model(x_adv), y) > ce(model(x), y)
    again = method.perturb(model, x, y, state)
    assert not torch.equal(again, x_adv)  # a fresh random start each time, as Wong et al. draw it


@pytest.mark.parametrize("sets, said", [(["attack.steps=3"], "one step"), (["attack.init=none"], "uniform random"),
                                        (["attack.alpha=0.01"], "step_ratio"), (["method.step_ratio=0"], "above 0")])
def test_settings_the_method_would_not_take_are_errors(sets, said):
    with pytest.raises(UserError, match=said):
        make_method("fgsm-rs", *sets)


def test_trains_from_the_cli_on_real_digits(tmp_path):
    done = fastfair("train", "--config", "demo", "--method", "fgsm-rs", "--epochs", "2", "--quiet", "--out",
                    str(tmp_path / "run"), "--set", "model.width=4")
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "run" / "eval").glob("*-test.json"))


def test_a_presets_step_it_does_not_take_is_a_warning():
    from fastfair import config
    from fastfair.checks import check_config

    cfg = config.resolve("demo", {"method.name": "fgsm-rs"})  # the demo's attack.alpha = 0.025, for PGD-AT
    assert any("attack.alpha = 0.025 (from the preset) is not read by fgsm-rs" in w for w in check_config(cfg))
    assert not any("attack.alpha" in w for w in check_config(config.resolve(None, {"method.name": "fgsm-rs"})))
