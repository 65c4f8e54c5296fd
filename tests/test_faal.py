"""FAAL (Zhang et al. 2024; authors' code TrustAI/FAAL): the KL-ball class weights by hand and against a
brute-force search, their edge cases, the per-batch weighting of the rows, fine-tuning from a checkpoint,
resume, and a short fine-tune on the real CIFAR-10 subset."""
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from fastfair import cli, config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.methods import METHODS
from fastfair.methods.faal import batch_weights, kl_ball_weights, softmax_margin
from fastfair.rundir import load_checkpoint
from fastfair.scaleout.grid import load, run_grid
from fastfair.training.trainer import Trainer, final_evaluation

from helpers import cifar_subset_npz, make_method, small_run_config

DIVERGENCES = ("reverse", "forward")


def divergence(w: np.ndarray, u: np.ndarray, kind: str) -> np.ndarray:
    """KL(u || w) (reverse, the code's cp.kl_div(Pemp, p)) or KL(w || u) (forward), along the last axis."""
    w = np.asarray(w, dtype=np.float64)
    if kind == "reverse":
        with np.errstate(divide="ignore"):
            return np.sum(u * (np.log(u) - np.log(w)), axis=-1)
    safe = np.where(w > 0, w, 1.0)
    return np.sum(np.where(w > 0, w * np.log(safe / u), 0.0), axis=-1)


def test_two_classes_by_hand():
    """K = 2, c = (0, 1): the solution is the largest w_1 the ball allows, so w = (0.25, 0.75) exactly when
    rho is the divergence of (0.25, 0.75) from (0.5, 0.5):
    forward KL(w || u) = log 2 + 0.75 log 0.75 + 0.25 log 0.25 = 0.1308120...
    reverse KL(u || w) = -log 2 - 0.5 (log 0.75 + log 0.25)   = 0.1438410..."""
    forward = math.log(2) + 0.75 * math.log(0.75) + 0.25 * math.log(0.25)
    reverse = -math.log(2) - 0.5 * (math.log(0.75) + math.log(0.25))
    assert forward == pytest.approx(0.1308120, abs=1e-7) and reverse == pytest.approx(0.1438410, abs=1e-7)
    for kind, rho in (("forward", forward), ("reverse", reverse)):
        w = kl_ball_weights(torch.tensor([0.0, 1.0]), rho, divergence=kind)
        torch.testing.assert_close(w, torch.tensor([0.25, 0.75]), atol=1e-5, rtol=0)
        # the scores' scale and offset do not matter, only their order
        w2 = kl_ball_weights(torch.tensor([-3.0, 7.0]), rho, divergence=kind)
        torch.testing.assert_close(w2, w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", DIVERGENCES)
@pytest.mark.parametrize("rho", [0.01, 0.1, 0.5, 1.5])
def test_weights_match_a_brute_force_search_over_the_simplex(kind, rho):
    """Three classes: every point of a 1/400 grid on the simplex inside the ball; none beats the solver."""
    c = np.array([0.3, -0.2, 0.9])
    g = np.arange(401) / 400
    a, b = np.meshgrid(g, g, indexing="ij")
    pts = np.stack([a.ravel(), b.ravel(), 1 - a.ravel() - b.ravel()], 1)
    pts = pts[pts[:, 2] >= -1e-12].clip(0, 1)
    u = np.full(3, 1 / 3)
    inside = divergence(pts, u, kind) <= rho
    best = (pts[inside] @ c).max()
    w = kl_ball_weights(torch.tensor(c), rho, divergence=kind).double().numpy()
    assert divergence(w, u, kind) <= rho + 1e-6
    assert w @ c >= best - 1e-9  # at least as good as any grid point in the ball
    assert w @ c <= best + 0.01  # and the grid comes close to it (1/400 steps)
    assert w[1] <= w[0] <= w[2] and w[2] > 1 / 3  # weights follow the losses; the worst class weighs most


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_weights_match_a_general_solver_on_ten_classes(kind):
    """SLSQP on the same problem (K = 10, the constraint as the code states it) finds no better objective."""
    optimize = pytest.importorskip("scipy.optimize")
    torch.manual_seed(0)
    c = torch.randn(10).double().numpy()
    u = np.full(10, 0.1)
    for rho in (0.05, 0.5):
        res = optimize.minimize(lambda w: -(w @ c), u, method="SLSQP", bounds=[(1e-9, 1)] * 10,
                                constraints=[{"type": "eq", "fun": lambda w: w.sum() - 1},
                                             {"type": "ineq", "fun": lambda w: rho - divergence(w, u, kind)}],
                                options={"ftol": 1e-12, "maxiter": 500})
        w = kl_ball_weights(torch.tensor(c), rho, divergence=kind).double().numpy()
        assert divergence(w, u, kind) <= rho + 1e-6
        assert w @ c == pytest.approx(-res.fun, abs=1e-5)
        np.testing.assert_allclose(w, res.x, atol=2e-3)


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_edge_cases(kind):
    c = torch.tensor([0.2, -0.5, 0.7, 0.1])
    uniform = torch.full((4,), 0.25)
    # rho = 0: the ball is the uniform distribution; rho -> 0: it tends to it
    assert torch.equal(kl_ball_weights(c, 0.0, divergence=kind), uniform)
    torch.testing.assert_close(kl_ball_weights(c, 1e-10, divergence=kind), uniform, atol=1e-4, rtol=0)
    # a huge ball: all weight on the worst class (forward reaches it; reverse KL(u || w) only in the limit)
    w = kl_ball_weights(c, 1e6, divergence=kind)
    assert float(w[2]) > 1 - 1e-9 and float(w.sum()) == pytest.approx(1.0)
    # equal losses: nothing to prefer, whatever rho
    for rho in (0.1, 10.0):
        torch.testing.assert_close(kl_ball_weights(torch.full((4,), 0.3), rho, divergence=kind), uniform)
    # two tied worst classes share the weight a large ball gives them
    w = kl_ball_weights(torch.tensor([1.0, 0.0, 1.0]), 1e6, divergence=kind)
    torch.testing.assert_close(w, torch.tensor([0.5, 0.0, 0.5]), atol=1e-9, rtol=0)


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_classes_outside_the_batch_get_no_weight(kind):
    """present: u is uniform over the classes in the batch and the others weigh 0 (aggregate = mean)."""
    c = torch.tensor([0.4, 9.0, -0.1, 0.2])  # class 1 is absent: its (meaningless) score must not matter
    present = torch.tensor([True, False, True, True])
    for rho in (0.0, 0.2, 1e6):
        w = kl_ball_weights(c, rho, present, divergence=kind)
        assert float(w[1]) == 0.0 and float(w.sum()) == pytest.approx(1.0)
        three = kl_ball_weights(c[present], rho, divergence=kind)
        torch.testing.assert_close(w[present], three)
    assert torch.equal(kl_ball_weights(c, 0.0, present, divergence=kind), torch.tensor([1 / 3, 0, 1 / 3, 1 / 3]))
    # a batch of one class: it takes all the weight
    one = torch.tensor([False, False, True, False])
    assert torch.equal(kl_ball_weights(c, 0.5, one, divergence=kind), torch.tensor([0.0, 0.0, 1.0, 0.0]))


@pytest.mark.parametrize("kind", DIVERGENCES)
def test_weights_are_valid_on_random_and_extreme_scores(kind):
    torch.manual_seed(0)
    cases = [torch.randn(10) * s for s in (1e-9, 1e-3, 1.0, 1e3, 1e6)]
    cases += [torch.tensor([0.0] * 9 + [1e-7]), torch.tensor([5.0] * 9 + [-5.0])]
    for c in cases:
        for rho in (1e-6, 0.05, 0.5, 2.0, 50.0):
            w = kl_ball_weights(c, rho, divergence=kind)
            assert torch.isfinite(w).all() and (w >= 0).all(), (c, rho, w)
            assert float(w.sum()) == pytest.approx(1.0, abs=1e-5)
            assert divergence(w.double().numpy(), np.full(10, 0.1), kind) <= rho + 1e-5
            # never worse than uniform weights, and the worst class never weighs less than another
            assert float(w.double() @ c.double()) >= float(c.double().mean()) - 1e-6 * float(c.abs().max())
            assert float(w[c.argmax()]) >= float(w.max()) - 1e-6


def test_the_solver_is_one_graph_with_no_host_read():
    """fullgraph: any .item() or Python branch on a tensor value would break the graph."""
    solve = torch.compile(kl_ball_weights, fullgraph=True, backend="eager")
    c = torch.tensor([0.3, -0.2, 0.9, 0.0])
    for kind in DIVERGENCES:
        torch.testing.assert_close(solve(c, 0.3, divergence=kind), kl_ball_weights(c, 0.3, divergence=kind))


def test_softmax_margin_by_hand():
    """max_{j != y} p_j - p_y on probabilities (code cw): p = softmax(log(0.7, 0.2, 0.1))."""
    z = torch.log(torch.tensor([[0.7, 0.2, 0.1], [0.7, 0.2, 0.1]]))
    torch.testing.assert_close(softmax_margin(z, torch.tensor([0, 2])), torch.tensor([0.2 - 0.7, 0.7 - 0.1]))


def test_code_scores_are_class_sums_over_all_classes():
    """aggregate = sum (code ft_prn.py): c_k = n_k x class mean = the class's sum, u over all K, rows x K w_y."""
    y = torch.tensor([0, 0, 1, 0])
    margins = torch.tensor([0.2, 0.4, -0.5, 0.0])
    w, factor = batch_weights(margins, y, 3, 0.5, "reverse", "sum")
    c = torch.tensor([0.6, -0.5, 0.0])  # class 2 is absent: its score is 0, as in the cvxpy objective
    torch.testing.assert_close(w, kl_ball_weights(c, 0.5, divergence="reverse"))
    torch.testing.assert_close(factor, 3 * w[y])
    assert float(w[2]) > 0  # the code's u covers the absent class too
    # mean: class means over the classes present; the weighted mean of rows is sum_k w_k (class k's mean row)
    w, factor = batch_weights(margins, y, 3, 0.5, "reverse", "mean")
    torch.testing.assert_close(w[:2], kl_ball_weights(torch.tensor([0.2, -0.5]), 0.5, divergence="reverse"))
    assert float(w[2]) == 0.0
    rows = torch.tensor([1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close((rows * factor).mean(), w[0] * (1 + 2 + 4) / 3 + w[1] * 3)


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(12, 3))


@pytest.mark.parametrize("base", ["pgd-at", "trades"])
def test_rows_are_the_base_rows_times_constant_weights(base):
    """FAAL rows = base rows x K w_y; rho = 0 is the base method; the weights carry no gradient (code detaches)."""
    x, y = torch.rand(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 1])
    x_adv = x.clamp(0.1, 0.9)
    model = linear_model()
    plain, s0 = make_method(base)
    rows, _ = plain.loss(model, x, x_adv, y, s0)
    faal, s1 = make_method(f"faal-{base.split('-')[-1]}")
    assert faal.cfg.method.rho == 0.5 and faal.cfg.attack.bn_mode == "eval"
    got, z_adv = faal.loss(model, x, x_adv, y, s1)
    w, _ = batch_weights(softmax_margin(z_adv, y), y, 3, 0.5, "reverse", "sum")
    torch.testing.assert_close(got, rows * 3 * w[y])
    # the gradient is that of the rows with the weights held constant
    model.zero_grad()
    faal.objective(model, x, x_adv, y, s1)[0].backward()
    grad = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    (plain.loss(model, x, x_adv, y, s0)[0] * 3 * w[y].detach()).mean().backward()
    for g, want in zip(grad, (p.grad for p in model.parameters())):
        torch.testing.assert_close(g, want)
    zero, s2 = make_method(f"faal-{base.split('-')[-1]}", "method.rho=0")
    torch.testing.assert_close(zero.objective(model, x, x_adv, y, s2)[0], rows.mean())


def test_keys_are_checked_and_methods_listed(capsys):
    for bad in ("method.divergence=chi2", "method.class_loss=ce", "method.aggregate=max", "method.rho=-1"):
        with pytest.raises(UserError, match=bad.split("=")[0]):
            make_method("faal-at", bad)
    m, _ = make_method("faal-trades")
    assert (m.cfg.attack.objective, m.cfg.attack.init, m.cfg.method.kl_weight) == ("kl", "normal", 6.0)
    for name in ("faal-at", "faal-trades"):
        assert "Zhang et al. 2024" in METHODS.doc(name)
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    assert "method.rho" in out and "method.divergence" in out


def test_code_grid_resolves_every_run_with_the_authors_settings(tmp_path):
    grid, _ = load("faal-code-prn")
    runs = grid.runs()
    assert [r.point["train.init_from"] for r in runs] == ["runs/faal-pretrained/prn-pgd-at.pt",
                                                          "runs/faal-pretrained/prn-trades.pt"]
    lines = []
    assert run_grid("faal-code-prn", out=str(tmp_path / "g"), dry_run=True, echo=lines.append) == 0
    for r in runs:
        cfg = config.resolve(None, None, [f"{k}={json.dumps(v)}" for k, v in {**grid.sets, **r.point}.items()])
        check_config(cfg)
        m, t, a = cfg.method, cfg.train, cfg.attack
        assert (m.name, m.rho, m.divergence, m.class_loss, m.aggregate) == ("faal-at", 0.5, "reverse", "margin", "sum")
        assert t.select == "worst"  # run_prn.py evaluates the best worst-class checkpoint (worst_best)
        assert (t.epochs, t.lr, t.lr_milestones, t.weight_decay, cfg.model.name) == (2, 0.01, [1], 5e-4,
                                                                                      "preact-resnet18")
        assert (a.objective, a.init, a.bn_mode, a.steps) == ("ce", "uniform", "eval", 10)
        assert a.alpha == pytest.approx(2 / 255) and a.eps == pytest.approx(8 / 255)




@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return cifar_subset_npz(tmp_path_factory.mktemp("data"), n_train=400, n_test=100)


small_cfg = small_run_config


@pytest.fixture(scope="module")
def pretrained(npz, tmp_path_factory):
    """A robust model to fine-tune: one epoch of PGD-AT on the real subset."""
    out = tmp_path_factory.mktemp("pretrain")
    Trainer(small_cfg(npz, "pgd-at", "train.epochs=1"), out, quiet=True).fit()
    return out / "checkpoints" / "last.pt"


def test_fine_tuning_starts_from_the_checkpoint_and_refuses_a_bad_one(npz, pretrained, tmp_path):
    t = Trainer(small_cfg(npz, "faal-at", "train.epochs=2", f"train.init_from={pretrained}"), tmp_path / "ft",
                quiet=True)
    start = load_checkpoint(pretrained)["model"]
    for k, v in t.model.state_dict().items():
        assert torch.equal(v.cpu(), start[k]), k
    with pytest.raises(UserError, match="train.init_from: no checkpoint"):
        Trainer(small_cfg(npz, "faal-at", f"train.init_from={tmp_path / 'missing.pt'}"), tmp_path / "x", quiet=True)
    with pytest.raises(UserError, match="holds a different model"):
        Trainer(small_cfg(npz, "faal-at", f"train.init_from={pretrained}", "model.width=4"), tmp_path / "y",
                quiet=True)


@pytest.mark.slow
def test_faal_fine_tunes_on_real_cifar10_and_resumes(npz, pretrained, tmp_path):
    cfg = small_cfg(npz, "faal-at", "train.epochs=2", "train.lr=0.01", "train.lr_milestones=[1]",
                    f"train.init_from={pretrained}")
    Trainer(cfg, tmp_path / "a", quiet=True).fit()
    records = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(math.isfinite(r["loss"]) and r["loss"] > 0 for r in records)
    assert records[0]["vectors"]["loss_weight"] == [1.0] * 10  # FAAL weights rows per batch, not the class state
    result = final_evaluation(tmp_path / "a", cfg, quiet=True)
    assert set(result["results"]) == {"clean", "pgd2"}
    # FAAL keeps no state of its own: a run killed after epoch 1 resumes and ends with the same class state
    Trainer(cfg, tmp_path / "b", quiet=True).run_epoch(0)
    resumed = Trainer(cfg, tmp_path / "b", resume=True, quiet=True)
    assert resumed.start_epoch == 1
    resumed.fit()
    a, b = (load_checkpoint(p / "checkpoints" / "last.pt") for p in (tmp_path / "a", tmp_path / "b"))
    assert a["class_state"].keys() == b["class_state"].keys()
    for k in a["class_state"]:
        assert torch.equal(a["class_state"][k], b["class_state"][k]), k
    assert a["epoch"] == b["epoch"] == 2
    for k in a["model"]:
        torch.testing.assert_close(a["model"][k], b["model"][k], msg=k)


@pytest.mark.slow
def test_faal_trades_weights_the_worst_class_most_on_real_data(npz, pretrained, tmp_path):
    """On a real batch, the class whose adversarial margin is largest gets the largest weight."""
    cfg = small_cfg(npz, "faal-trades", f"train.init_from={pretrained}")
    t = Trainer(cfg, tmp_path, quiet=True)
    x, y = next(iter(t.train_loader))
    t.model.train()
    x_adv = t.method.perturb(t.model, x, y, t.state)
    with torch.no_grad():
        rows, z_adv = t.method.loss(t.model, x, x_adv, y, t.state)
    margins = softmax_margin(z_adv, y)
    w, factor = batch_weights(margins, y, 10, 0.5, "reverse", "sum")
    sums = torch.zeros(10).index_add_(0, y, margins)
    assert int(w.argmax()) == int(sums.argmax()) and torch.isfinite(rows).all()
    assert divergence(w.double().numpy(), np.full(10, 0.1), "reverse") <= 0.5 + 1e-6
