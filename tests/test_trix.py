"""TRIX (Medi, Jung & Keuper 2025; authors' code Fairness-a11y/TRIX): the per-batch strong/weak split by
hand, the targets, the targeted PGD rows, the DAFA vectors, no host sync, checkpoint/resume and a short
run on the real CIFAR-10 subset."""
import json

import pytest
import torch
from torch import nn

from fastfair import cli, config
from fastfair.attacks.pgd import PGD
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.methods import trix
from fastfair.methods.trix import batch_similarity, draw_targets, strong_mask
from fastfair.reproduce import paper
from fastfair.rundir import load_checkpoint
from fastfair.scaleout.grid import load, run_grid
from fastfair.training.trainer import Trainer, final_evaluation

from helpers import cifar_subset_npz, make_method, small_run_config
from test_compiled_step import NoHostSync

# p_i(j) of a batch whose class-i rows all have softmax P[i]. DAFA Algorithm 2 with lambda 1 (see
# test_dafa.py): W = (1.29, 0.87, 0.84); class 0 is the hardest (weak), class 2 the easiest (strong).
P = torch.tensor([[0.6, 0.3, 0.1],
                  [0.2, 0.7, 0.1],
                  [0.1, 0.1, 0.8]])
BY_HAND = torch.tensor([1.29, 0.87, 0.84])


def logits_of(y: torch.Tensor, probs: torch.Tensor = P) -> torch.Tensor:
    return probs[y].log()  # softmax(log p) = p


def test_batch_similarity_is_the_mean_softmax_per_present_class():
    y = torch.tensor([0, 1, 1, 2])
    z = torch.randn(4, 3)
    sim = batch_similarity(z, y, 3)
    p = z.softmax(1)
    torch.testing.assert_close(sim, torch.stack([p[0], (p[1] + p[2]) / 2, p[3]]))
    assert torch.equal(batch_similarity(z[:1], y[:1], 3)[1:], torch.zeros(2, 3))  # absent classes: zero rows


def test_split_adds_the_codes_1e_8_to_the_similarity_diagonal_in_float64(monkeypatch):
    # calculate_class_weights_from_clean: class_similarity += 1e-8 * eye, in float64 (below float32's resolution)
    seen = {}
    monkeypatch.setattr(trix, "dafa_weights", lambda p, lam, tie_subtracts: seen.setdefault("p", p).diagonal().float())
    y = torch.tensor([0, 1, 1])
    z = logits_of(y)
    trix.batch_weights(z, y, 3)
    assert seen["p"].dtype == torch.float64
    torch.testing.assert_close(seen["p"] - batch_similarity(z, y, 3).double(), 1e-8 * torch.eye(3, dtype=torch.float64),
                               rtol=0, atol=1e-15)


def test_split_by_hand_strong_is_below_the_sample_mean_of_the_batch_weights():
    # one sample per class: weights (1.29, 0.87, 0.84), mean 1.0 -> classes 1 and 2 strong
    y = torch.tensor([0, 1, 2])
    assert strong_mask(logits_of(y), y, 3).tolist() == [False, True, True]
    # the code averages over samples, not classes: 15 samples of class 2 pull the mean to
    # (1.29 + 0.87 + 15 * 0.84) / 17 = 0.8682 < 0.87, so class 1 turns weak (a class mean, 1.0, would not)
    y = torch.tensor([0, 1] + [2] * 15)
    mask = strong_mask(logits_of(y), y, 3)
    assert mask.tolist() == [False, False] + [True] * 15
    # a class absent from the batch moves no weight: with only classes 0 and 1 (p_0(0) = 0.6 < p_1(1) = 0.7),
    # W_0 = 1 + 0.3 * 0.7 = 1.21, W_1 = 1 - 0.21 = 0.79; samples (1.21, 0.79, 0.79), mean 0.93
    y = torch.tensor([0, 1, 1])
    assert strong_mask(logits_of(y), y, 3).tolist() == [False, True, True]
    # a batch of one class: its weight equals the mean, so nobody is strong (all untargeted)
    y = torch.tensor([2, 2, 2])
    assert not strong_mask(logits_of(y), y, 3).any()


def test_targets_are_uniform_over_the_other_classes_and_never_the_label():
    torch.manual_seed(0)
    y = torch.arange(10).repeat(1800)
    t = draw_targets(y, 10)
    assert not (t == y).any() and t.min() >= 0 and t.max() <= 9
    pairs = torch.zeros(10, 10).index_put_((y, t), torch.ones_like(y, dtype=torch.float32), accumulate=True)
    off = pairs[~torch.eye(10, dtype=torch.bool)]
    assert off.min() > 140 and off.max() < 260  # 1800 / 9 = 200 per (label, target) pair
    torch.manual_seed(0)
    assert torch.equal(draw_targets(y, 10), t)  # from torch's seeded generator: repeatable
    assert torch.equal(draw_targets(torch.tensor([0, 1]), 2), torch.tensor([1, 0]))  # two classes: the other one


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3))


def test_targeted_rows_move_towards_their_target_inside_their_class_ball():
    model = linear_model()
    x, y = torch.full((6, 1, 4, 4), 0.5), torch.tensor([0, 1, 2, 0, 1, 2])
    target = torch.tensor([1, 2, 0, 2, 0, 1])
    eps, alpha = torch.tensor([0.1, 0.05, 0.02]), torch.tensor([0.03, 0.02, 0.01])
    attack = PGD(steps=5, objective="kl", init="normal", bn_mode="eval")
    torch.manual_seed(1)
    toward = attack(model, x, y, eps, alpha, target, torch.ones(6, dtype=torch.bool))
    torch.manual_seed(1)
    away = attack(model, x, y, eps, alpha)
    with torch.no_grad():
        p0, p1 = model(x).softmax(1), model(toward).softmax(1)
    rows = torch.arange(6)
    assert (p1[rows, target] > p0[rows, target] + 1e-3).all()  # towards the target ...
    assert (p1[rows, y] < p0[rows, y]).all()  # ... and away from the label
    reach = (toward - x).abs().flatten(1).amax(1)
    assert (reach <= eps[y] + 1e-6).all() and toward.min() >= 0 and toward.max() <= 1
    # the mask picks per row: targeted rows as in the all-targeted run, the others as the plain attack
    mask = torch.tensor([True, False, True, False, True, False])
    torch.manual_seed(1)
    mixed = attack(model, x, y, eps, alpha, target, mask)
    torch.testing.assert_close(mixed[mask], toward[mask])
    torch.testing.assert_close(mixed[~mask], away[~mask])
    with pytest.raises(UserError, match="both target and toward"):
        attack(model, x, y, eps, alpha, target)


def test_trix_perturb_targets_the_strong_rows_only():
    """method.perturb: the split from the clean batch, targets drawn, one attack; targeted=false is DAFA-TRADES."""
    model = linear_model()
    torch.manual_seed(3)
    x, y = torch.rand(12, 1, 4, 4), torch.arange(3).repeat(4)
    m, state = make_method("trix", "attack.eps=0.1", "attack.alpha=0.02")
    torch.manual_seed(5)
    target, strong = m.targeting(model, x, y, 3)
    assert strong.any() and not strong.all() and not (target == y).any()
    torch.manual_seed(5)
    x_adv = m.perturb(model, x, y, state)
    torch.manual_seed(5)
    draw_targets(y, 3)  # the same draws in the same order, by hand
    want = m.attack(model, x, y, state["eps"], state["alpha"], target, strong)
    torch.testing.assert_close(x_adv, want)
    plain, plain_state = make_method("trix", "method.targeted=false", "attack.eps=0.1", "attack.alpha=0.02")
    dafa, dafa_state = make_method("dafa-trades", "attack.eps=0.1", "attack.alpha=0.02")
    torch.manual_seed(5)
    a = plain.perturb(model, x, y, plain_state)
    torch.manual_seed(5)
    torch.testing.assert_close(a, dafa.perturb(model, x, y, dafa_state))


def epoch_of(state, probs: torch.Tensor) -> dict:
    state.count(probs.log(), torch.arange(probs.shape[0]), torch.tensor(1.0))
    return {**state.read(), "val": {}}


def test_dafa_vectors_after_the_warm_up_by_hand_and_valid():
    m, state = make_method("trix", "method.warmup=2", "attack.eps=0.1", "attack.alpha=0.02")
    assert (m.cfg.method.warmup, m.cfg.method.dafa_lambda, m.cfg.method.weight_terms) == (2, 1.0, "ce")
    m.end_epoch(state, 0, epoch_of(state, P))  # warm-up: unweighted
    assert torch.equal(state["dafa_weight"], torch.ones(3))
    m.end_epoch(state, 1, epoch_of(state, P))
    torch.testing.assert_close(state["dafa_weight"], BY_HAND)
    torch.testing.assert_close(state["eps"], 0.1 * BY_HAND)
    torch.testing.assert_close(state["alpha"], 0.02 * BY_HAND)
    torch.testing.assert_close(state["loss_weight"], torch.ones(3))  # the code weights the natural CE only
    for name in ("dafa_weight", "eps", "alpha", "loss_weight", "kl_weight"):
        assert torch.isfinite(state[name]).all() and (state[name] >= 0).all(), name
    # the loss: W_y CE(f(x), y) + beta KL, as dafa-trades
    model = linear_model()
    x, y = torch.rand(6, 1, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    x_adv = (x + 0.05 * torch.randn_like(x)).clamp(0, 1)
    rows, _ = m.loss(model, x, x_adv, y, state)
    plain, plain_state = make_method("trades")
    base, _ = plain.loss(model, x, x_adv, y, plain_state)
    ce = nn.functional.cross_entropy(model(x), y, reduction="none")
    torch.testing.assert_close(rows - base, (BY_HAND[y] - 1) * ce)


def test_fastfair_methods_lists_trix_with_its_paper(capsys):
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("trix "))
    assert "Medi et al. 2025" in line and "method.targeted" in out
    assert "trix" in paper.PAPERS and "TRIX" in paper.PAPERS["trix"].title


def test_code_grid_resolves_every_run_with_the_authors_settings(tmp_path):
    grid, _ = load("trix-code-trades-trix")
    assert [r.point["method.name"] for r in grid.runs()] == ["trades", "trix"]
    lines = []
    assert run_grid("trix-code-trades-trix", out=str(tmp_path / "a"), dry_run=True, echo=lines.append) == 0
    for item in ("attack.eps=0.031", "attack.alpha=0.007", "train.lr_milestones=[139, 144]", "train.epochs=150"):
        assert item in lines[-1], item
    for r in grid.runs():
        cfg = config.resolve(None, None, [f"{k}={json.dumps(v)}" for k, v in {**grid.sets, **r.point}.items()])
        check_config(cfg)
        assert (cfg.attack.objective, cfg.attack.bn_mode, cfg.attack.init) == ("kl", "eval", "normal")
        assert (cfg.model.name, cfg.train.nesterov, cfg.method.kl_weight) == ("resnet18", True, 6.0)
        if cfg.method.name == "trix":
            m = cfg.method
            assert (m.warmup, m.dafa_lambda, m.weight_terms, m.targeted) == (70, 1.0, "ce", True)




@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return cifar_subset_npz(tmp_path_factory.mktemp("data"), n_train=256, n_test=60)


def small_cfg(npz, *sets):
    return small_run_config(npz, "trix", "method.warmup=1", "train.compile=off", "train.device=cpu", *sets)


def test_a_training_step_never_waits_for_the_host(npz, tmp_path):
    t = Trainer(small_cfg(npz, "train.kernels=torch"), tmp_path, quiet=True)
    t.state.set("eps_dafa", torch.linspace(0.8, 1.2, 10))  # past the warm-up: class-wise eps
    x, y = next(iter(t.train_loader))
    t.model.train()
    t.train_step(x, y)
    with NoHostSync():
        t.train_step(x, y)


@pytest.mark.slow
def test_trix_on_real_cifar10_sets_valid_vectors_and_resumes_exactly(npz, tmp_path):
    cfg = small_cfg(npz, "train.epochs=2")
    Trainer(cfg, tmp_path / "a", quiet=True).fit()
    result = final_evaluation(tmp_path / "a", cfg, quiet=True)
    first, second = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert first["vectors"]["dafa_weight"] == [1.0] * 10  # the warm-up epoch trains unweighted
    w = torch.tensor(second["vectors"]["dafa_weight"])
    assert torch.isfinite(w).all() and (w > 0).all() and not torch.equal(w, torch.ones(10))
    torch.testing.assert_close(torch.tensor(second["vectors"]["eps"]), w * cfg.attack.eps)
    assert all(v == v for v in (first["loss"], second["loss"]))
    assert set(result["results"]) == {"clean", "pgd2"}
    # killed after the warm-up epoch: --resume ends where the straight run ended, bit for bit (targets and
    # random starts come from the trainer's per-epoch seeded generator; the weights from the checkpoint)
    Trainer(cfg, tmp_path / "b", quiet=True).run_epoch(0)
    Trainer(cfg, tmp_path / "b", resume=True, quiet=True).fit()
    a, b = (load_checkpoint(p / "checkpoints" / "last.pt") for p in (tmp_path / "a", tmp_path / "b"))
    for name in ("dafa_weight", "eps_dafa", "alpha_dafa"):
        assert torch.equal(a["class_state"][name], b["class_state"][name]), name
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


REBUTTAL_T1 = {  # Table 1 of the TRIX authors' rebuttal (R/R.pdf): AA at 8/255, ResNet-18, five seeds
    "trades": ("trades", "TRADES", (81.75, 66.52), (49.22, 23.80, 1.35)),
    "trades-dafa": ("dafa-trades", "+ DAFA", (81.49, 66.66), (48.03, 31.02, 0.66)),
    "trades-wat": ("wat", "+ WAT", (79.02, 70.00), (45.92, 29.44, 1.39)),
    "trades-trix": ("trix", "+ TRIX", (81.60, 68.10), (48.80, 32.64, 0.73)),
}


@pytest.mark.parametrize("row", sorted(REBUTTAL_T1))
def test_rebuttal_presets_run_the_code_setup_and_record_its_table(row):
    preset = f"trix-rebuttal-t1-{row}"
    method, label, clean, aa = REBUTTAL_T1[row]
    cfg = config.resolve(preset)
    check_config(cfg)
    assert cfg.method.name == method and "Table 1" in cfg.preset and "follows" in cfg.preset
    assert (cfg.model.name, cfg.train.epochs, cfg.train.lr_milestones, cfg.train.nesterov, cfg.train.weight_decay) == (
        "resnet18", 150, [139, 144], True, 5e-4)
    assert (cfg.attack.eps, cfg.attack.alpha, cfg.attack.steps, cfg.attack.init) == (0.031, 0.007, 10, "normal")
    assert cfg.train.select == "worst"  # "best represents best worse robust class accuracy" (Table 1 caption)
    assert cfg.data.val_per_class == (300 if method == "wat" else 100)
    if method in ("dafa-trades", "trix"):
        assert (cfg.method.warmup, cfg.method.dafa_lambda, cfg.method.weight_terms) == (70, 1.0, "ce")
    got = paper.load(preset)
    assert (got.source, got.table, got.row, got.follows) == ("trix-rebuttal", "1", label, "code")
    assert (got.numbers["clean"].avg, got.numbers["clean"].worst) == clean
    assert (got.numbers["aa"].avg, got.numbers["aa"].worst, got.numbers["aa"].std["worst"]) == aa


# Table 1's rows in other authors' code setups (the rebuttal gives none): (preset, method, row, clean, AA)
REBUTTAL_T1_OTHERS = {
    "trix-rebuttal-t1-absld": ("absld", "+ ABSLD", (80.03, 67.87), (49.00, 31.22)),
    "trix-rebuttal-t1-bat": ("bat", "+ BAT", (85.89, 73.20), (45.82, 19.11)),
    "trix-rebuttal-t1-trades-frl": ("frl", "+ FRL", (82.02, 70.27), (44.91, 27.60)),
    "trix-rebuttal-t1-trades-cfa": ("trades", "+ CFA", (79.02, 64.01), (49.30, 27.21)),
    "trix-rebuttal-t1-fair-tat": ("fair-tat", "+ FAIRTAT", (78.93, 66.98), (48.92, 28.19)),
}


@pytest.mark.parametrize("preset", sorted(REBUTTAL_T1_OTHERS))
def test_rebuttal_rows_of_other_methods_record_their_numbers_and_the_worst_class_rule(preset):
    method, label, clean, aa = REBUTTAL_T1_OTHERS[preset]
    cfg = config.resolve(preset)
    check_config(cfg)
    assert cfg.method.name == method and cfg.model.name == "resnet18" and cfg.train.select == "worst"
    assert cfg.eval.eps == config.resolve("trix-rebuttal-t1-trades").eval.eps  # the table's rows evaluate alike
    got = paper.load(preset)
    assert (got.source, got.table, got.row, got.follows) == ("trix-rebuttal", "1", label, "code")
    assert ((got.numbers["clean"].avg, got.numbers["clean"].worst), (got.numbers["aa"].avg, got.numbers["aa"].worst)) \
        == (clean, aa)
    assert got.init_from == ("trix-rebuttal-t1-trades" if method == "frl" else "")
    if label == "+ CFA":
        assert cfg.ccm.enabled and cfg.ccr.enabled and cfg.train.averaging == "fawa"


def test_reproduce_lists_the_rebuttal_table_with_its_nine_rows():
    from fastfair.reproduce import tables

    table = tables.get("trix-rebuttal-t1")
    assert "rebuttal" in table.title and len(table.rows) == 9
    assert {r.row for r in table.rows} == {"TRADES", "+ FRL", "+ BAT", "+ WAT", "+ CFA", "+ FAIRTAT", "+ DAFA",
                                           "+ ABSLD", "+ TRIX"}
    assert table.pending == []


def test_component_grid_switches_the_targeted_split_and_the_dafa_weights(tmp_path):
    grid, _ = load("trix-code-components")
    points = [(r.point["method.targeted"], r.point["method.dafa_lambda"]) for r in grid.runs()]
    assert points == [(False, 0.0), (False, 1.0), (True, 0.0), (True, 1.0)]  # TRADES, DAFA, split only, TRIX
    assert run_grid("trix-code-components", out=str(tmp_path / "g"), dry_run=True, echo=lambda _: None) == 0
    for r in grid.runs():
        cfg = config.resolve(None, None, [f"{k}={json.dumps(v)}" for k, v in {**grid.sets, **r.point}.items()])
        check_config(cfg)
        assert (cfg.method.name, cfg.train.epochs, cfg.method.warmup) == ("trix", 150, 70)
