"""Per-class evaluation attacks: FGSM known answer, the Temperature-PGD grid, PGD restarts, CW, and names."""

import numpy as np
import pytest
import torch
from evalreport_helpers import digits_run

from fastfair.attacks import names as named_attacks
from fastfair.errors import UserError
from fastfair.evaluation.per_class import check_attack_names, evaluate, progress_units


class Linear2(torch.nn.Module):
    """Two-class linear model on 4 pixels: z = W x, w_1 = -w_0, so CE's input gradient has sign -sign(w_y)."""

    def __init__(self):
        super().__init__()
        w0 = torch.tensor([1.0, -2.0, 0.5, 3.0])
        self.lin = torch.nn.Linear(4, 2, bias=False)
        self.lin.weight.data = torch.stack([w0, -w0])

    def forward(self, x):
        return self.lin(x.flatten(1))


def _loader(x, y, batch=4):
    from fastfair.data import DeviceLoader

    return DeviceLoader(x, y, batch, device="cpu", train=False)


def test_tpgd_grid_expands_to_tian_inverse_temperatures():
    assert named_attacks.members("tpgd20@grid") == ["tpgd20@t0.5", "tpgd20@t0.2", "tpgd20@t0.1", "tpgd20@t0.02"]
    assert named_attacks.expand(["clean", "tpgd10@grid", "clean"])[0] == "clean"
    assert len(named_attacks.expand(["clean", "tpgd10@grid", "clean"])) == 5
    results = {n: {"summary": {"avg": a}} for n, a in zip(named_attacks.members("tpgd20@grid"), [40, 35, 37, 50])}
    named_attacks.add_best(results, ["tpgd20@grid"])
    assert results["tpgd20@grid"]["chosen"] == "tpgd20@t0.2" and results["tpgd20@grid"]["inverse_temperature"] == 5


def test_attack_names_are_checked_and_counted():
    check_attack_names(["clean", "fgsm", "pgd50x5", "cw20", "tpgd20@grid", "aa"])
    with pytest.raises(UserError, match="unknown attack"):
        check_attack_names(["pgd20", "autoatack"])
    # a model pass each: a PGD step a forward and a backward (1 + 2), a prediction a forward; AutoAttack's plan
    aa = 1 + 3 * 100 + 9 * 3 * 100 + 9 * 4 * 100 + 5000  # clean pass, apgd-ce, apgd-t, fab-t, square (10 classes)
    assert progress_units(["clean", "aa", "tpgd20@grid"], 10) == 1 + aa + 4 * (3 * 20 + 1)
    assert progress_units(["aa"], 4) == 1 + 3 * 100 + 3 * 3 * 100 + 3 * 4 * 100 + 5000  # 3 targets for 4 classes


def test_fgsm_per_class_matches_the_hand_computed_step():
    model = Linear2()
    x = torch.full((4, 1, 2, 2), 128, dtype=torch.uint8)  # 0.502 in [0, 1]
    y = torch.tensor([0, 0, 1, 1])
    eps = 0.3
    res = evaluate(model, _loader(x, y), ["clean", "fgsm"], eps=eps, alpha=0.01, classes=["a", "b"])
    x0 = 128 / 255
    w0 = model.lin.weight[0].detach()
    # class 0 moves by -eps sign(w0): z0 - z1 = 2 w0.x'; class 1 by +eps sign(w0)
    margin0 = 2 * float(w0 @ (x0 - eps * w0.sign()))
    margin1 = -2 * float(w0 @ (x0 + eps * w0.sign()))
    assert margin0 < 0 and margin1 < 0  # both classes are fooled by the hand-computed step
    assert res["clean"]["per_class"] == [100.0, 0.0]  # w0.x > 0 at x = 0.5: everything is class 0 when clean
    assert res["fgsm"]["per_class"] == [0.0, 0.0]


def test_every_attack_reports_per_class_and_grid_best():
    from fastfair import build, data
    from fastfair.rundir import load_checkpoint

    out, cfg = digits_run()
    ck = load_checkpoint(out / "checkpoints" / "best_pgd.pt")
    model = build.model_from_spec(ck["spec"], torch.device("cpu"), False)
    model.load_state_dict(ck["model"])
    b = data.load("digits")
    loader = _loader(b.x_test[:100], b.y_test[:100], 50)
    names = ["clean", "fgsm", "pgd10", "cw10", "tpgd10@grid"]
    kw = dict(eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=b.classes)
    res = evaluate(model, loader, names, **kw)
    for name in names:
        assert len(res[name]["per_class"]) == 10 and res[name]["summary"]["avg"] <= res["clean"]["summary"]["avg"]
        assert int(np.asarray(res[name]["confusion"]).sum()) == 100
    avgs = {n: res[n]["summary"]["avg"] for n in named_attacks.members("tpgd10@grid")}
    assert res["tpgd10@grid"]["summary"]["avg"] == min(avgs.values())
    # from the same RNG state the first restart is PGD-10 itself, and later restarts only replace points
    # that are still robust, so restarts never raise any class's accuracy
    torch.manual_seed(1)
    one = evaluate(model, loader, ["pgd10"], **kw)["pgd10"]["per_class"]
    torch.manual_seed(1)
    three = evaluate(model, loader, ["pgd10x3"], **kw)["pgd10x3"]["per_class"]
    assert all(r <= p for r, p in zip(three, one))


def test_clip_start_key_switches_the_uniform_start_of_evaluation_attacks():
    """eval.clip_start=false: the TRADES/MART code's PGD-20 start, x + U(-eps, eps) not clipped to [0, 1]."""
    from fastfair import config
    from fastfair.ops.steps import random_start

    assert config.resolve(None, {"method.name": "trades", "data.dataset": "cifar10"}).eval.clip_start is True
    cfg = config.resolve(None, {"method.name": "trades", "data.dataset": "cifar10"}, ["eval.clip_start=false"])
    assert cfg.eval.clip_start is False
    assert named_attacks.parse_attack("pgd20").pgd.init == "uniform"
    assert named_attacks.parse_attack("cw20", clip_start=False).pgd.init == "uniform_unclipped"
    assert named_attacks.parse_attack("fgsm", clip_start=False).pgd.init == "none"
    x, y, eps = torch.zeros(2, 3, 4, 4), torch.tensor([0, 1]), torch.full((2,), 0.1)
    torch.manual_seed(0)
    raw = random_start(x, y, eps, "uniform_unclipped")
    torch.manual_seed(0)
    clipped = random_start(x, y, eps, "uniform")
    assert raw.min() < 0 and raw.abs().max() <= 0.1 and torch.equal(clipped, raw.clamp(0, 1))
    # through evaluate(): the same seed, the same numbers for each setting
    model, xs, ys = Linear2(), torch.full((4, 1, 2, 2), 3, dtype=torch.uint8), torch.tensor([0, 0, 1, 1])
    runs = [evaluate(model, _loader(xs, ys), ["pgd5"], eps=0.05, alpha=0.01, classes=["a", "b"], clip_start=c)
            for c in (False, False, True)]
    assert runs[0]["pgd5"]["confusion"] == runs[1]["pgd5"]["confusion"]
