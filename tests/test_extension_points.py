"""The extension architecture (issue 11): what a new method or option gets without editing shared code."""
from pathlib import Path

import pytest
import torch
from torch import nn

from fastfair import config
from fastfair.errors import UserError
from helpers import make_method
from fastfair.methods import METHODS, OPTIONS, keys_markdown
from fastfair.methods.options import Option, register
from fastfair.schema import Key
from fastfair.training.class_state import ClassState


@pytest.mark.parametrize("method", ["standard", "pgd-at", "me-at", "trades", "me-trades", "mart", "fat"])
def test_every_method_honours_per_class_loss_weights(method):
    """Method.objective is the one place that weights rows by class, so no method can skip it."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.rand(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    plain, s0 = make_method(method)
    weighted, s1 = make_method(method, "cost_sensitive.weights=[0, 1, 3]")
    x_adv = x.clamp(0.1, 0.9)
    rows, _ = plain.loss(model, x, x_adv, y, s0)
    loss, _ = weighted.objective(model, x, x_adv, y, s1)
    torch.testing.assert_close(loss, (rows * torch.tensor([0.0, 1, 3])[y]).mean())


def test_an_option_scaling_a_vector_the_method_lacks_fails_naming_the_vector():
    with pytest.raises(UserError, match="ccr does not combine with method pgd-at"):
        make_method("pgd-at", "ccr.enabled=true")
    with pytest.raises(UserError, match="'kl_weight'"):  # the same through its factor, with CCR's defaults left out
        cfg = config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"})
        cfg.ccr.enabled = True
        METHODS.get("pgd-at")(cfg).setup(ClassState(3, "cpu"))
    with pytest.raises(UserError, match="'eps'"):
        make_method("standard", "ccm.enabled=true")


def test_vectors_are_base_times_every_factor_and_checkpoint_round_trips():
    s = ClassState(3, "cpu")
    s.add_vector("eps", 0.5)
    s.add_factor("eps", "eps_a", [1.0, 2.0, 0.0])
    s.add_factor("eps", "eps_b", 3.0)
    held = s["eps"]
    assert torch.equal(held, torch.tensor([1.5, 3.0, 0.0]))
    s.set("eps_b", [1.0, 1.0, 1.0])
    assert s["eps"] is held and torch.equal(held, torch.tensor([0.5, 1.0, 0.0]))  # updated in place
    t = ClassState(3, "cpu")
    t.add_vector("eps", 0.5)
    t.add_factor("eps", "eps_a")
    t.add_factor("eps", "eps_b")
    t.load_state_dict(s.state_dict())
    assert torch.equal(t["eps"], s["eps"])


def test_a_registered_option_gets_its_section_its_statistic_and_its_factor():
    """A new option in one file: its keys validate, it reads a per-epoch statistic, it weights classes."""
    seen = {}

    @register("test_similarity", "test: weight a class by how much its adversarial mass leaves it")
    class Similarity(Option):
        keys = {"enabled": Key(False, "switch it on"), "power": Key(1.0, "exponent")}
        statistics = ("softmax_by_class",)

        def setup(self, state):
            state.add_factor("loss_weight", "loss_weight_sim", 1.0, owner=self.name)

        def end_epoch(self, state, epoch, stats):
            p = stats["statistics"]["softmax_by_class"]
            seen["p"] = p
            state.set("loss_weight_sim", (1.0 - p.diagonal()) ** self.own.power)

    try:
        with pytest.raises(UserError, match="test_similarity.power"):
            config.resolve(None, None, ["test_similarity.powr=2"])
        m, state = make_method("pgd-at", "test_similarity.enabled=true", "test_similarity.power=2")
        logits = torch.tensor([[4.0, 0.0, 0.0], [0.0, 0.0, 4.0], [0.0, 0.0, 4.0]])
        y = torch.tensor([0, 1, 2])
        state.count(logits, y, torch.tensor(1.0))
        state.count(logits, y, torch.tensor(1.0))
        stats = state.read()
        m.end_epoch(state, 0, {**stats, "val": {}})
        want = logits.softmax(1)
        torch.testing.assert_close(seen["p"], want)
        torch.testing.assert_close(state["loss_weight"], (1 - want.diagonal()) ** 2)
    finally:
        OPTIONS._items.pop("test_similarity")


def test_a_checkpoint_holding_products_is_refused_rather_than_scaled_twice():
    s = ClassState(3, "cpu")
    s.add_vector("eps", 0.5)
    s.add_factor("eps", "eps_ccm", 2.0)
    old = {k: v for k, v in s.state_dict().items() if k != "_layout"}
    with pytest.raises(UserError, match="start a new run"):
        s.load_state_dict(old)


def test_docs_list_every_declared_key_as_the_registries_declare_it():
    docs = Path(__file__).resolve().parents[1] / "docs" / "keys.md"
    assert docs.read_text() == keys_markdown(), "regenerate: fastfair methods --markdown > docs/keys.md"
