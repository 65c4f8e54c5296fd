"""WAT (Li & Liu 2023; authors' code boqili/WAT): the Hedge update on hand-made validation losses, the
validation pass, checkpoint/resume of the weights, and a short run on the real CIFAR-10 subset."""
import json
import math

import pytest
import torch
from torch import nn

from fastfair import cli, config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.evaluation import seeds
from fastfair.training.trainer import Trainer, final_evaluation
from fastfair.methods.wat import hedge_weights
from fastfair.rundir import load_checkpoint
from fastfair.scaleout.grid import load, run_grid

from helpers import cifar_subset_npz, make_method


def epoch_end(m, state, epoch, per_class, avg):
    m.end_epoch(state, epoch, {"val": {}, "val_method": {"wat_loss_per_class": per_class, "wat_loss_avg": avg}})


def test_hedge_update_matches_a_hand_computation_on_three_classes():
    m, state = make_method("wat")  # eta 0.1, average expert on
    assert m.cfg.method.eta == 0.1 and m.cfg.method.kl_weight == 6.0 and m.cfg.attack.objective == "kl"
    # before any update: the code's weights are all ones, so every row counts w_y + w_avg = 2
    torch.testing.assert_close(state["loss_weight"], torch.full((3,), 2.0))

    # epoch 1: L = (1, 2, 3), L_avg = 2. Entries eta S = (0.1, 0.2, 0.3, 0.2);
    # w = 3 exp(entry) / (e^0.1 + e^0.2 + e^0.3 + e^0.2)
    epoch_end(m, state, 0, [1.0, 2.0, 3.0], 2.0)
    z = math.exp(0.1) + 2 * math.exp(0.2) + math.exp(0.3)  # 4.897836...
    w = [3 * math.exp(0.1) / z, 3 * math.exp(0.2) / z, 3 * math.exp(0.3) / z]  # 0.67693, 0.74813, 0.82681
    w_avg = 3 * math.exp(0.2) / z  # 0.74813
    want = torch.tensor([w[0] + w_avg, w[1] + w_avg, w[2] + w_avg])  # 1.42506, 1.49625, 1.57494
    torch.testing.assert_close(state["loss_weight"], want)
    torch.testing.assert_close(state.factors["loss_weight"]["loss_weight_wat"], want)
    assert torch.allclose(want, torch.tensor([1.42506, 1.49625, 1.57494]), atol=1e-5)

    # epoch 2: L = (2, 1, 1), L_avg = 4/3, so S = (3, 3, 4), S_avg = 10/3:
    # the weights are exp of the cumulative losses, not of the last epoch's alone
    epoch_end(m, state, 1, [2.0, 1.0, 1.0], 4 / 3)
    e = [math.exp(0.3), math.exp(0.3), math.exp(0.4), math.exp(1 / 3)]
    z = sum(e)
    want = torch.tensor([3 * (e[k] + e[3]) / z for k in range(3)])
    torch.testing.assert_close(state["loss_weight"], want)
    torch.testing.assert_close(state["wat_cum_loss"], torch.tensor([3.0, 3.0, 4.0]))
    torch.testing.assert_close(state["wat_cum_avg"], torch.full((3,), 10 / 3))


def test_without_the_average_expert_weights_are_a_k_scaled_softmax():
    m, state = make_method("wat", "method.average_expert=false", "method.eta=0.5")
    torch.testing.assert_close(state["loss_weight"], torch.ones(3))  # ones(K): factor 1 before any update
    epoch_end(m, state, 0, [0.0, 1.0, 2.0], 1.0)
    z = 1 + math.exp(0.5) + math.exp(1.0)
    want = torch.tensor([3 / z, 3 * math.exp(0.5) / z, 3 * math.exp(1.0) / z])
    torch.testing.assert_close(state["loss_weight"], want)
    assert float(state["loss_weight"].sum()) == pytest.approx(3.0)


def test_weights_are_hedge_multiplicative_updates_and_stay_finite_and_positive():
    """exp(eta S^t) normalised equals w^t proportional to w^{t-1} exp(eta L^t): Hedge from uniform weights."""
    torch.manual_seed(0)
    losses = torch.rand(50, 4) * 20  # 50 epochs of large losses: exp(eta S) alone would overflow fp32
    w_prev = torch.ones(4) / 4
    cum = torch.zeros(4)
    for loss in losses:
        cum += loss
        w, w_avg = hedge_weights(cum[:3], cum[3], 1.0, True)
        w_prev = w_prev * torch.exp(loss - loss.max())
        w_prev = w_prev / w_prev.sum()
        full = torch.cat([w, w_avg.reshape(1)])
        assert torch.isfinite(full).all() and (full >= 0).all()
        assert float(full.sum()) == pytest.approx(3.0, rel=1e-5)  # the code scales the simplex by K
        torch.testing.assert_close(full / 3, w_prev, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("divisor", ["batches", "count"])
def test_validation_pass_returns_per_class_trades_loss_sums_over_the_divisor(divisor):
    """count: the class means; batches (the default, WAT code validate): class sum x K / (batches x batch size),
    batches of data.batch_size = 4 over the 6 images: 2, so D = 8 (the last batch is partial)."""
    torch.manual_seed(0)
    m, state = make_method("wat", "attack.steps=1", "data.batch_size=4", f"method.val_divisor={divisor}")
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    batches = [(torch.rand(4, 3, 2, 2), torch.tensor([0, 1, 2, 0])), (torch.rand(2, 3, 2, 2), torch.tensor([0, 2]))]
    out = m.validation_pass(model, batches, state, epoch=0)
    assert model.training  # the mode it was in comes back
    # the same attack under the same seeds, then CE(f(x)) + 6 KL(p(x) || p(x')) averaged by class by hand
    rows = {0: [], 1: [], 2: []}
    for i, (x, y) in enumerate(batches):
        model.eval()
        with seeds.seeded(0, "wat-val", 0, i, device=torch.device("cpu")):
            x_adv = m.perturb(model, x, y, state)
        with torch.no_grad():
            z, za = model(x), model(x_adv)
        ce = nn.functional.cross_entropy(z, y, reduction="none")
        kl = (z.softmax(1) * (z.log_softmax(1) - za.log_softmax(1))).sum(1)
        for yi, r in zip(y.tolist(), (ce + 6 * kl).tolist()):
            rows[yi].append(r)
        model.train()
    total = sum(sum(r) for r in rows.values())
    if divisor == "count":
        want, want_avg = [sum(rows[k]) / len(rows[k]) for k in range(3)], total / 6
    else:
        want, want_avg = [sum(rows[k]) * 3 / 8 for k in range(3)], total / 8
    assert out["wat_loss_per_class"] == pytest.approx(want, rel=1e-5)
    assert out["wat_loss_avg"] == pytest.approx(want_avg, rel=1e-5)


def test_unknown_val_divisor_is_one_error_line():
    with pytest.raises(UserError, match="method.val_divisor must be one of batches, count"):
        make_method("wat", "method.val_divisor=mean")


BASE = ["model.name=tiny-cnn", "model.width=8", "data.batch_size=64", "data.val_per_class=5", "attack.steps=2",
        "train.epochs=2", "train.val_attack=pgd2", "train.progress=false", "train.lr_milestones=[]",
        'eval.attacks=["clean", "pgd2"]']


@pytest.mark.slow
def test_wat_trains_on_the_cifar10_subset_and_resumes_its_weights(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=300, n_test=100)
    cfg = config.resolve(None, {"method.name": "wat", "data.dataset": "npz", "data.data_dir": str(npz)}, BASE)
    straight = tmp_path / "straight"
    Trainer(cfg, straight, quiet=True).fit()
    records = [json.loads(line) for line in (straight / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(math.isfinite(r["loss"]) for r in records)
    assert records[0]["vectors"]["loss_weight"] == [pytest.approx(2.0)] * 10  # the code's ones(K+1) start
    w = torch.tensor(records[1]["vectors"]["loss_weight_wat"])  # from epoch 1's validation loss
    assert torch.isfinite(w).all() and (w > 0).all() and w.std() > 0
    loss1 = torch.tensor(records[1]["vectors"]["wat_cum_loss"])  # epoch 1's per-class validation loss
    assert torch.equal(w.argsort(), loss1.argsort())  # the class that loses most weighs most
    # the Hedge weights of the last epoch's factor sum to K over the K + 1 entries
    ck = load_checkpoint(straight / "checkpoints" / "last.pt")["class_state"]
    w, w_avg = hedge_weights(ck["wat_cum_loss"], ck["wat_cum_avg"][0], 0.1, True)
    torch.testing.assert_close(ck["loss_weight_wat"], w + w_avg)
    assert float(w.sum() + w_avg) == pytest.approx(10.0, rel=1e-5)
    assert set(final_evaluation(straight, cfg, quiet=True)["results"]) == {"clean", "pgd2"}

    # killed after epoch 1: --resume restores the cumulative losses and the weights and ends where the
    # straight run ended
    killed = Trainer(cfg, tmp_path / "resumed", quiet=True)
    killed.run_epoch(0)
    del killed
    resumed = Trainer(cfg, tmp_path / "resumed", resume=True, quiet=True)
    assert resumed.start_epoch == 1
    torch.testing.assert_close(resumed.state.factors["loss_weight"]["loss_weight_wat"].cpu(),
                               torch.tensor(records[1]["vectors"]["loss_weight_wat"]))
    resumed.fit()
    again = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["class_state"]
    for name in ("wat_cum_loss", "wat_cum_avg", "loss_weight_wat"):
        torch.testing.assert_close(again[name], ck[name])


def test_code_grids_resolve_every_run_with_the_authors_settings(tmp_path):
    grid, _ = load("wat-code-trades-wat")
    assert [r.point["method.name"] for r in grid.runs()] == ["trades", "wat"]
    lines = []
    assert run_grid("wat-code-trades-wat", out=str(tmp_path / "a"), dry_run=True, echo=lines.append) == 0
    cmd = lines[-1]
    for item in ("attack.eps=0.031", "attack.alpha=0.007", "train.lr_milestones=[74, 89, 99]",
                 "train.weight_decay=0.0002", "data.val_per_class=300", "model.name=\"resnet18\""):
        assert item in cmd, item
    eta, _ = load("wat-code-eta")
    assert [r.point["method.eta"] for r in eta.runs()] == [0.02, 0.05, 0.1, 0.2, 0.5]
    assert run_grid("wat-code-eta", out=str(tmp_path / "b"), dry_run=True, echo=lines.append) == 0
    for g in (grid, eta):
        for r in g.runs():
            cfg = config.resolve(None, None, [f"{k}={json.dumps(v)}" for k, v in {**g.sets, **r.point}.items()])
            check_config(cfg)
            if cfg.method.name == "wat":
                assert cfg.attack.objective == "kl" and cfg.attack.bn_mode == "eval" and cfg.attack.init == "normal"
                assert cfg.method.eta == r.point.get("method.eta", 0.1) and cfg.method.kl_weight == 6.0
                assert cfg.method.val_divisor == "batches"  # the code's validate divisor


def test_fastfair_methods_lists_wat_with_its_paper_and_keys(capsys):
    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("wat "))
    assert "Li & Liu 2023" in line
    assert "method.eta" in out and "method.average_expert" in out


def test_wat_weights_multiply_with_other_class_weights():
    """Method.objective scales TRADES rows by WAT's factor times any option's (cost-sensitive here)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3))
    x, y = torch.rand(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    m, state = make_method("wat", "cost_sensitive.weights=[0, 1, 3]")
    epoch_end(m, state, 0, [1.0, 2.0, 3.0], 2.0)
    wat = state.factors["loss_weight"]["loss_weight_wat"]
    rows, _ = m.loss(model, x, x.clamp(0.1, 0.9), y, state)
    loss, _ = m.objective(model, x, x.clamp(0.1, 0.9), y, state)
    torch.testing.assert_close(loss, (rows * (wat * torch.tensor([0.0, 1, 3]))[y]).mean())


def test_dafa_table_1_wat_row_runs_wat_in_dafas_setup():
    from fastfair.reproduce import paper

    cfg = config.resolve("dafa-t1-trades-wat")
    check_config(cfg)
    assert (cfg.method.name, cfg.method.eta, cfg.method.average_expert, cfg.method.kl_weight) == ("wat", 0.1, True, 6.0)
    assert cfg.data.val_per_class == 300  # WAT's validation split (data_loader.py: 300 per class)
    assert cfg.method.val_divisor == "batches"  # WAT's validate: class sums x K / (batches x batch size)
    base = config.resolve("dafa-t1-trades")  # the table's shared setup
    for section in ("model", "attack", "train", "eval"):
        assert getattr(cfg, section) == getattr(base, section), section
    row = paper.load("dafa-t1-trades-wat")
    assert (row.source, row.table, row.row) == ("dafa", "1", "TRADES + WAT")
    assert (row.numbers["clean"].avg, row.numbers["clean"].worst) == (80.97, 70.57)
    assert (row.numbers["aa"].avg, row.numbers["aa"].worst, row.numbers["aa"].std["avg"]) == (46.30, 28.55, 0.27)
