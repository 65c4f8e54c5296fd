"""DAFA (Lee et al. 2024): Algorithm 2 by hand, the warm-up, paper vs code, resume, presets, a real-data run."""
import json

import pytest
import torch
from torch import nn

from fastfair import config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.methods import METHODS
from fastfair.methods.dafa import dafa_weights
from fastfair.reproduce import paper
from fastfair.rundir import load_checkpoint
from fastfair.training.trainer import Trainer, final_evaluation

from helpers import cifar_subset_npz, make_method, small_run_config

# p_i(j): row i is the mean softmax over class i's adversarial examples. Class 0 is the hardest
# (p_0(0) = 0.6), class 2 the easiest (p_2(2) = 0.8).
P = torch.tensor([[0.6, 0.3, 0.1],
                  [0.2, 0.7, 0.1],
                  [0.1, 0.1, 0.8]])
# Algorithm 2 with lambda = 1, starting from W = 1:
#   W_0: harder than 1 and 2:   + p_0(1) p_1(1) + p_0(2) p_2(2) = 0.3*0.7 + 0.1*0.8 = 0.21 + 0.08  -> 1.29
#   W_1: easier than 0:         - p_0(1) p_1(1)                 = -0.3*0.7 = -0.21
#        harder than 2:         + p_1(2) p_2(2)                 = 0.1*0.8  = +0.08            -> 0.87
#   W_2: easier than 0 and 1:   - p_0(2) p_2(2) - p_1(2) p_2(2) = -0.08 - 0.08                  -> 0.84
BY_HAND = torch.tensor([1.29, 0.87, 0.84])


def test_weights_follow_algorithm_2_by_hand():
    torch.testing.assert_close(dafa_weights(P, 1.0), BY_HAND)
    torch.testing.assert_close(dafa_weights(P, 2.0), 1 + 2 * (BY_HAND - 1))  # lambda scales the moves
    # what a harder class gains is what the easier one loses: the weights keep their sum
    assert float(dafa_weights(P, 3.7).sum()) == pytest.approx(3.0)


def test_a_tie_is_skipped_by_the_paper_and_subtracted_by_the_code():
    tie = torch.tensor([[0.5, 0.5, 0.0],
                        [0.5, 0.5, 0.0],
                        [0.0, 0.0, 1.0]])
    # paper Algorithm 2: neither branch fires on p_0(0) == p_1(1); class 2 shares no mass
    torch.testing.assert_close(dafa_weights(tie, 1.0, tie_subtracts=False), torch.ones(3))
    # code utils.py (else branch): each of the tied pair loses p_j(i) p_i(i) = 0.5 * 0.5
    torch.testing.assert_close(dafa_weights(tie, 1.0, tie_subtracts=True), torch.tensor([0.75, 0.75, 1.0]))


def epoch_of(state, probs: torch.Tensor) -> dict:
    """The stats of an epoch whose training adversarial examples had exactly these softmax rows (one per class)."""
    state.count(probs.log(), torch.arange(probs.shape[0]), torch.tensor(1.0))
    return {**state.read(), "val": {}}


@pytest.mark.parametrize("terms", ["ce", "row"])
def test_weights_are_set_once_after_the_warm_up_and_scale_eps_alpha_and_the_loss(terms):
    m, state = make_method("dafa-trades", "method.warmup=2", f"method.weight_terms={terms}", "attack.eps=0.1",
                           "attack.alpha=0.02")
    m.end_epoch(state, 0, epoch_of(state, P))  # epoch 1 of 2 warm-up epochs: nothing moves
    assert torch.equal(state["dafa_weight"], torch.ones(3)) and torch.allclose(state["eps"], torch.full((3,), 0.1))
    m.end_epoch(state, 1, epoch_of(state, P))  # the warm-up's last epoch: W from its statistic
    torch.testing.assert_close(state["dafa_weight"], BY_HAND)
    torch.testing.assert_close(state["eps"], 0.1 * BY_HAND)
    torch.testing.assert_close(state["alpha"], 0.02 * BY_HAND)
    # the code weights TRADES' CE term alone (through ce_weight); "row" weights the whole row
    torch.testing.assert_close(state["loss_weight"], BY_HAND if terms == "row" else torch.ones(3))
    m.end_epoch(state, 2, epoch_of(state, torch.eye(3) * 0.9 + 0.1 / 3))  # computed once, never again
    torch.testing.assert_close(state["dafa_weight"], BY_HAND)


def test_negative_weights_are_kept_as_paper_and_code_do_unless_clamped():
    # lambda = 10: W_2 = 1 - 10 * 0.16 = -0.6
    for clamp, want in ((False, -0.6), (True, 0.0)):
        m, state = make_method("dafa-at", "method.warmup=1", "method.dafa_lambda=10",
                               f"method.clamp_negative={str(clamp).lower()}")
        m.end_epoch(state, 0, epoch_of(state, P))
        assert torch.isfinite(state["dafa_weight"]).all()
        assert float(state["dafa_weight"][2]) == pytest.approx(want, abs=1e-6)
        assert float(state["eps"][2]) == pytest.approx(want * m.cfg.attack.eps, abs=1e-6)  # the code's 0.031
        assert float(state["loss_weight"][2]) == pytest.approx(want, abs=1e-6)  # PGD-AT: W weights the CE row


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def test_trades_code_variant_weights_the_natural_ce_term_only():
    x, y = torch.rand(6, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    x_adv = (x + 0.05 * torch.randn_like(x)).clamp(0, 1)
    model = linear_model()
    m, state = make_method("dafa-trades", "method.warmup=1")
    plain, plain_state = make_method("trades")
    m.end_epoch(state, 0, epoch_of(state, P))
    rows, _ = m.loss(model, x, x_adv, y, state)
    base, _ = plain.loss(model, x, x_adv, y, plain_state)
    ce = nn.functional.cross_entropy(model(x), y, reduction="none")
    torch.testing.assert_close(rows - base, (BY_HAND[y] - 1) * ce)  # W_y CE + beta KL versus CE + beta KL


def test_at_code_variant_takes_a_second_unscaled_step_past_the_class_eps():
    """Code madry_loss: the unscaled second step and projection undo eps_k; the paper keeps x' in eps_k."""
    x, y = torch.full((3, 1, 4, 4), 0.5), torch.tensor([0, 1, 2])
    model = linear_model()
    reach = {}
    for second in (True, False):
        m, state = make_method("dafa-at", "method.warmup=1", f"method.second_step={str(second).lower()}",
                               "attack.eps=0.1", "attack.alpha=0.04", "attack.steps=4")
        m.end_epoch(state, 0, epoch_of(state, P))
        torch.manual_seed(1)
        reach[second] = (m.perturb(model, x, y, state) - x).abs().flatten(1).amax(1)
    eps_k = 0.1 * BY_HAND
    assert (reach[False] <= eps_k + 1e-6).all()  # paper: inside each class's ball
    torch.testing.assert_close(reach[True], torch.full((3,), 0.1))  # code: at the uniform eps
    assert (reach[True][1:] > eps_k[1:] + 1e-3).all()  # beyond the shrunk balls of classes 1 and 2


def test_methods_list_dafa_with_its_paper():
    for name in ("dafa-trades", "dafa-at"):
        assert "Lee et al. 2024" in METHODS.doc(name)
    def refused(*sets):
        return config.resolve(None, {"method.name": "dafa-trades", "data.dataset": "digits"}, list(sets))

    with pytest.raises(UserError, match="warmup"):
        check_config(refused("method.warmup=0"))
    with pytest.raises(UserError, match=r"method.warmup = 70 \(DAFA's class weights from epoch 71\) is past "
                                        r"train.epochs = 20.*--set method.warmup=19"):
        check_config(refused("train.epochs=20"))  # a short run would silently be plain TRADES
    with pytest.raises(UserError, match=r"train for 2 epochs or more"):
        check_config(refused("train.epochs=1", "method.warmup=1"))
    check_config(refused("train.epochs=2", "method.warmup=1"))


@pytest.mark.parametrize("preset", ["dafa-t1-trades", "dafa-t1-trades-dafa"])
def test_presets_resolve_and_record_the_papers_table(preset):
    cfg = config.resolve(preset)
    check_config(cfg)
    assert "Table 1" in cfg.preset and "follows" in cfg.preset
    assert (cfg.model.name, cfg.train.epochs, cfg.train.lr_milestones, cfg.train.nesterov) == ("resnet18", 110,
                                                                                               [99, 104], True)
    assert (cfg.attack.eps, cfg.attack.alpha, cfg.attack.init, cfg.train.select) == (0.031, 0.007, "normal", "last")
    row = paper.load(preset)
    assert row.source == "dafa" and row.table == "1" and row.follows == "code"
    dafa = preset.endswith("-dafa")
    assert row.row == ("TRADES + DAFA" if dafa else "TRADES")
    assert (row.numbers["aa"].avg, row.numbers["aa"].worst) == ((49.05, 30.53) if dafa else (49.80, 21.31))
    assert row.numbers["clean"].std["worst"] == (1.25 if dafa else 1.32)
    if dafa:
        m = cfg.method
        assert (m.name, m.warmup, m.dafa_lambda, m.kl_weight, m.weight_terms) == ("dafa-trades", 70, 1.0, 6.0, "ce")




@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return cifar_subset_npz(tmp_path_factory.mktemp("data"), n_train=400, n_test=100)


def small_cfg(npz, method, *sets):
    return small_run_config(npz, method, "method.warmup=1", *sets)


@pytest.mark.slow
def test_dafa_trades_on_real_cifar10_sets_weights_after_the_warm_up_and_resumes_them(npz, tmp_path):
    cfg = small_cfg(npz, "dafa-trades", "train.epochs=2")
    Trainer(cfg, tmp_path / "a", quiet=True).fit()
    result = final_evaluation(tmp_path / "a", cfg, quiet=True)
    first, second = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert first["vectors"]["dafa_weight"] == [1.0] * 10  # the warm-up epoch trains unweighted
    w = torch.tensor(second["vectors"]["dafa_weight"])
    assert torch.isfinite(w).all() and not torch.equal(w, torch.ones(10))
    assert float(w.sum()) == pytest.approx(10.0, abs=1e-4)  # no exact ties on real data: the sum is kept
    torch.testing.assert_close(torch.tensor(second["vectors"]["eps"]), w * cfg.attack.eps)
    assert set(result["results"]) == {"clean", "pgd2"}
    # a run killed after the warm-up epoch resumes with the weights its checkpoint holds
    Trainer(cfg, tmp_path / "b", quiet=True).run_epoch(0)
    Trainer(cfg, tmp_path / "b", resume=True, quiet=True).fit()
    a, b = (load_checkpoint(p / "checkpoints" / "last.pt")["class_state"] for p in (tmp_path / "a", tmp_path / "b"))
    for name in ("dafa_weight", "eps_dafa", "alpha_dafa"):
        assert torch.equal(a[name], b[name]), name
    torch.testing.assert_close(a["dafa_weight"], w)


@pytest.mark.slow
def test_dafa_at_code_variant_trains_on_real_cifar10(npz, tmp_path):
    Trainer(small_cfg(npz, "dafa-at", "train.epochs=2"), tmp_path, quiet=True).fit()
    last = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()][-1]
    w = torch.tensor(last["vectors"]["dafa_weight"])
    assert torch.isfinite(w).all() and last["loss"] == last["loss"]
    torch.testing.assert_close(torch.tensor(last["vectors"]["loss_weight"]), w)


def test_lambda_grid_sweeps_lambda_over_the_table_preset(tmp_path):
    from fastfair.scaleout.grid import load, run_grid

    grid, _ = load("dafa-code-lambda")
    assert [r.point["method.dafa_lambda"] for r in grid.runs()] == [0.0, 0.5, 1.0, 1.5, 2.0]
    assert run_grid("dafa-code-lambda", out=str(tmp_path / "g"), dry_run=True, echo=lambda _: None) == 0
    base = config.resolve("dafa-t1-trades-dafa")
    for r in grid.runs():
        cfg = config.resolve("dafa-t1-trades-dafa", None, [f"method.dafa_lambda={r.point['method.dafa_lambda']}"])
        check_config(cfg)
        assert (cfg.method.warmup, cfg.train.epochs, cfg.model.name) == (base.method.warmup, 110, "resnet18")
    # lambda 0 is TRADES on DAFA's code path: Algorithm 2 leaves every weight at 1
    p = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]])
    torch.testing.assert_close(dafa_weights(p, 0.0), torch.ones(3))
