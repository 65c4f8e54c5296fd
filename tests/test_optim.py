"""Optimisers and learning-rate schedules (train.optimizer, train.lr_schedule; fastfair/training/optim.py).

Each schedule's rate against its formula, computed independently (torch's own schedulers stepped per batch, or
numbers worked out by hand); Adam's and AdamW's first update against Kingma & Ba's and Loshchilov & Hutter's
algorithms by hand; a run stopped after epoch 1 and resumed against an uninterrupted one (Adam's moments in
the checkpoint); bad inputs as a user types them; a real-data run with adam + cosine from the CLI.
"""
from __future__ import annotations

import json
import math
import re
import warnings

import numpy as np
import pytest
import torch

from fastfair import cli, config
from fastfair.checks import check_config
from fastfair.rundir import load_checkpoint
from fastfair.training import optim
from fastfair.training.trainer import Trainer
from helpers import cifar_subset_npz, fastfair



def train_cfg(*sets: str, preset: str | None = None):
    return config.resolve(preset, {}, list(sets)).train


def torch_rates(make, steps: int, epochs: int, lr: float) -> list[float]:
    """A torch scheduler stepped once per batch, read after each step: the rate of batch k + 1."""
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=lr)
    sched = make(opt)
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sched.step() without opt.step(): nothing trains here
        for _ in range(steps * epochs):
            sched.step()
            out.append(opt.param_groups[0]["lr"])
    return out


def ours(t, steps: int) -> list[float]:
    rate = optim.schedule(t)
    return [rate(e, (i + 1) / steps) for e in range(t.epochs) for i in range(steps)]


# ---- the schedules ----------------------------------------------------------------------------------------------
def test_step_equals_multisteplr_to_the_bit_per_epoch():
    t = train_cfg("train.epochs=8", "train.lr=0.1", "train.lr_milestones=[2, 2, 5]", "train.lr_gamma=0.1")
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, [2, 2, 5], 0.1)
    theirs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(8):
            theirs.append(opt.param_groups[0]["lr"])
            sched.step()
    rate = optim.schedule(t)
    assert [rate(e, d) for e in range(8) for d in (0.25, 1.0)] == [r for r in theirs for _ in range(2)]
    assert theirs[2] == 0.1 * 0.1 ** 2 and theirs[5] == theirs[2] * 0.1  # a repeated milestone: gamma squared


def test_cosine_is_sgdr_eq_5_per_step():
    t = train_cfg("train.lr_schedule=cosine", "train.epochs=10", "train.lr=0.1", "train.lr_min=0.001",
                  "train.lr_milestones=[]")
    rate = optim.schedule(t)
    # by hand: 0.001 + 0.099 (1 + cos(pi t / 10)) / 2
    assert rate(2, 0.5) == pytest.approx(0.001 + 0.099 * (1 + math.sqrt(0.5)) / 2, abs=1e-15)  # t = 2.5
    assert rate(4, 1.0) == pytest.approx(0.0505, abs=1e-15) and rate(9, 1.0) == pytest.approx(0.001, abs=1e-15)
    steps = 4
    theirs = torch_rates(lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10 * steps, eta_min=0.001),
                         steps, 10, 0.1)
    assert ours(t, steps) == pytest.approx(theirs, abs=1e-12)


def test_cyclic_is_smiths_triangle_as_torch_cycliclr():
    t = train_cfg("train.lr_schedule=cyclic", "train.epochs=10", "train.lr=0.2", "train.lr_min=0.02",
                  "train.lr_cycle_epochs=4", "train.lr_milestones=[]")
    rate = optim.schedule(t)
    assert [rate(0, 1.0), rate(1, 1.0), rate(2, 1.0), rate(4, 0.5), rate(9, 1.0)] == pytest.approx(
        [0.11, 0.2, 0.11, 0.065, 0.2], abs=1e-15)  # up 0.09 an epoch from 0.02 at 0, 4, 8; the peak at 2, 6, 10
    steps = 5
    theirs = torch_rates(lambda o: torch.optim.lr_scheduler.CyclicLR(
        o, base_lr=0.02, max_lr=0.2, step_size_up=2 * steps, cycle_momentum=False), steps, 10, 0.2)
    assert ours(t, steps) == pytest.approx(theirs, abs=1e-12)
    # 0: one cycle over the run, as Wong et al.'s train_fgsm.py (CyclicLR, half the steps up, half down)
    whole = optim.schedule(train_cfg("train.lr_schedule=cyclic", "train.epochs=10", "train.lr=0.2",
                                     "train.lr_milestones=[]"))
    assert [whole(4, 1.0), whole(9, 1.0), whole(7, 0.5)] == pytest.approx([0.2, 0.0, 0.2 * 2.5 / 5], abs=1e-15)


def test_onecycle_is_wongs_cifar_interp():
    t = train_cfg("train.lr_schedule=onecycle", "train.epochs=15", "train.lr=0.2", "train.lr_milestones=[]")
    rate = optim.schedule(t)
    # train_cifar.py: np.interp([t], [0, epochs * 2 // 5, epochs], [0, lr_max, 0]) at epoch + (i + 1) / steps
    assert optim.peak_epoch(t) == 6
    assert [rate(2, 0.5), rate(5, 1.0), rate(9, 1.0), rate(14, 1.0)] == pytest.approx(
        [0.2 * 2.5 / 6, 0.2, 0.2 * 5 / 9, 0.0], abs=1e-15)
    set_peak = optim.schedule(train_cfg("train.lr_schedule=onecycle", "train.epochs=10", "train.lr=0.1",
                                        "train.lr_min=0.01", "train.lr_peak_epoch=2.5", "train.lr_milestones=[]"))
    assert [set_peak(0, 0.5), set_peak(2, 0.5), set_peak(6, 0.25)] == pytest.approx(
        [0.01 + 0.09 * 0.5 / 2.5, 0.1, 0.1 - 0.09 * 3.75 / 7.5], abs=1e-15)


def test_piecewise_is_wongs_imagenet_points():
    t = config.resolve("tian-kdd-t5-imagenet-fgsm-rs").train
    rate = optim.schedule(t)
    assert [rate(0, 0.5), rate(0, 1.0), rate(3, 0.5), rate(14, 1.0)] == pytest.approx(
        [0.2, 0.4, 0.4 - 0.36 * 2.5 / 5, 0.0004], abs=1e-15)


def test_saved_runs_from_before_lr_schedule_load_their_points_as_piecewise():
    saved = config.Config("standard")
    config.apply(saved, {"train.lr_epochs": [0, 1, 2], "train.lr_values": [0, 0.4, 0.04], "train.lr_milestones": []},
                 "test")
    text = saved.to_toml().replace('lr_schedule = "step"\n', "")
    assert "lr_schedule" not in text
    assert config.load_saved_text(text).train.lr_schedule == "piecewise"


# ---- the optimisers ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_the_trainer_steps_adam_and_adamw_as_their_papers_first_update(tmp_path, name):
    cfg = config.resolve("demo", {}, [f"train.optimizer={name}", "train.lr=0.01", "train.weight_decay=0.1",
                                      "train.adam_betas=[0.8, 0.99]", "train.adam_eps=1e-3", "train.epochs=1",
                                      "train.lr_milestones=[]", "train.momentum=0", "model.width=4"])
    t = Trainer(cfg, tmp_path / "run", quiet=True)
    assert type(t.opt) is {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    params = [p for p in t.model.parameters()]
    before = [p.detach().clone() for p in params]
    grads = [torch.randn_like(p, generator=torch.Generator().manual_seed(k)) for k, p in enumerate(params)]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    t.opt.step()
    lr, wd, eps = 0.01, 0.1, 1e-3
    for p, w, g in zip(params, before, grads):
        if name == "adam":  # Kingma & Ba Alg. 1 on g + wd w (L2): m^ = g', v^ = g'^2 after bias correction
            g = g + wd * w
            want = w - lr * g / (g.abs() + eps)
        else:  # Loshchilov & Hutter Alg. 2: the decay outside the moments, scaled by the rate (torch's AdamW)
            want = w * (1 - lr * wd) - lr * g / (g.abs() + eps)
        torch.testing.assert_close(p.detach(), want, rtol=1e-5, atol=1e-7)


def test_adam_with_cosine_resumed_after_epoch_1_equals_an_uninterrupted_run(tmp_path):
    cfg = config.resolve("demo", {}, ["train.optimizer=adam", "train.lr=0.003", "train.lr_schedule=cosine",
                                      "train.lr_min=0.0003", "train.lr_milestones=[]", "train.epochs=2",
                                      "model.width=4", "attack.steps=1", "train.val_attack=fgsm",
                                      "data.batch_size=64", "data.train_per_class=30", "train.progress=false"])
    Trainer(cfg, tmp_path / "straight", quiet=True).fit()
    first = Trainer(cfg, tmp_path / "resumed", quiet=True)
    first.run_epoch(0)
    del first
    ck = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")  # weights_only: no pickle runs
    moments = next(iter(ck["optimizer"]["state"].values()))
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(moments) and "scheduler" not in ck
    resumed = Trainer(cfg, tmp_path / "resumed", resume=True, quiet=True)
    assert resumed.start_epoch == 1
    resumed.fit()

    def lines(run):
        return [{k: r[k] for k in ("epoch", "lr", "loss", "train_robust_acc_per_class", "val")}
                for r in map(json.loads, (tmp_path / run / "metrics.jsonl").read_text().splitlines())]

    a, b = lines("straight"), lines("resumed")
    assert a == b and [r["epoch"] for r in a] == [1, 2]
    assert a[0]["lr"] > a[1]["lr"] > 0.0003  # cosine, per step
    wa, wb = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt") for run in ("straight", "resumed"))
    assert all(torch.equal(wa["model"][k], wb["model"][k]) for k in wa["model"])
    sa, sb = wa["optimizer"]["state"], wb["optimizer"]["state"]
    assert all(torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"]) for i in sa)
    # a longer run redraws a curve spread over train.epochs: --resume --epochs 3 says so before training
    longer = config.resolve(None, {}, ["train.epochs=3"], base=config.load_saved(tmp_path / "straight" / "config.toml"))
    Trainer(longer, tmp_path / "straight", resume=True, quiet=True)
    assert ("train.epochs 2 -> 3: train.lr_schedule=cosine is drawn over the run, so epoch 3 on follows the 3-epoch "
            "curve (its rate there 0.000975, 0.0003 before)") in (tmp_path / "straight" / "train.log").read_text()


# ---- bad inputs -------------------------------------------------------------------------------------------------
def test_a_misspelt_optimizer_from_the_command_line_is_one_error_line(tmp_path):
    done = fastfair("train", "--config", "demo", "--out", tmp_path / "r", "--set", "train.optimizer=adma")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == ["fastfair: error: train.optimizer='adma' is not one of adam, adamw, sgd. "
                                        "Did you mean adam, adamw?"]
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("sets, said", [
    (["train.lr_schedule=cosin"], r"train.lr_schedule='cosin' is not one of cosine, cyclic, onecycle, piecewise, "
                                  r"step. Did you mean cosine\?"),
    (["train.optimizer=adam", "train.momentum=0.8"], r"train.momentum = 0.8 is read by train.optimizer=sgd only, so "
                                                     r"it would do nothing with train.optimizer=adam; drop it"),
    (["train.optimizer=adamw", "train.nesterov=true"], r"train.nesterov = True is read by train.optimizer=sgd only"),
    (["train.adam_betas=[0.9, 0.99]"], r"read by train.optimizer=adam or adamw only.*set train.optimizer=adam"),
    (["train.lr_schedule=cosine", "train.lr_milestones=[5]"], r"train.lr_milestones = \[5\] is read by "
                                                              r"train.lr_schedule=step only"),
    (["train.lr_epochs=[0, 5]", "train.lr_values=[0.1, 0]"], r"set train.lr_schedule=piecewise"),
    (["train.lr_min=0.01"], r"train.lr_min = 0.01 is read by train.lr_schedule=cosine or cyclic or onecycle only"),
    (["train.lr_schedule=cyclic", "train.lr_min=0.2"], r"cyclic runs between train.lr_min = 0.2 and its peak "
                                                       r"train.lr = 0.05, so it would have no peak"),
    (["train.lr_schedule=onecycle", "train.lr=0"], r"train.lr=0.0 is out of range"),
    (["train.optimizer=adam", "train.adam_betas=[0.9, 1.0]"], r"train.adam_betas=\[0.9, 1.0\] is out of range: it "
                                                              r"must be two values in \[0, 1\)"),
    (["train.optimizer=adam", "train.adam_eps=0"], r"train.adam_eps=0.0 is out of range: it must be above 0"),
    (["train.eps=1e-6"], r"Did you mean train.adam_eps"),
    (["train.scheduler=cosine"], r"Did you mean train.lr_schedule\?"),
])
def test_bad_settings_are_one_error_naming_the_fix(sets, said, capsys, tmp_path):
    out = tmp_path / "never-written"
    assert cli.main(["train", "--config", "demo", "--out", str(out), *[a for s in sets for a in ("--set", s)]]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("fastfair: error: ")
    assert re.search(said, err), err
    assert not out.exists()


def test_a_presets_keys_that_a_later_choice_does_not_read_are_a_warning():
    # the demo preset sets milestones [10, 13]: --set train.lr_schedule=cosine overrides the choice, not the preset
    warned = check_config(config.resolve("demo", {}, ["train.lr_schedule=cosine"]))
    assert warned == ["train.lr_schedule=cosine does not read train.lr_milestones = [10, 13] (the preset's): it does "
                      "nothing in this run"]
    # defaults are nobody's choice: silent; "none" values (false, 0, []) say nothing is asked
    assert check_config(config.resolve(None, {}, ["train.optimizer=adam", "train.lr_schedule=onecycle"])) == []
    assert check_config(config.resolve("demo", {}, ["train.lr_schedule=cosine", "train.lr_milestones=[]",
                                                    "train.optimizer=adamw", "train.momentum=0"])) == []


# ---- a real run -------------------------------------------------------------------------------------------------
def test_adam_with_cosine_trains_on_real_cifar10_from_the_cli(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=200, n_test=50)
    out = tmp_path / "run"
    done = fastfair(
        "train", "--method", "pgd-at", "--dataset", "npz", "--data-dir", npz, "--model", "tiny-cnn", "--epochs", "2",
        "--out", out, "--set", "model.width=8", "--set", "train.optimizer=adam", "--set", "train.lr=0.003",
        "--set", "train.lr_schedule=cosine", "--set", "train.lr_milestones=[]", "--set", "data.batch_size=64",
        "--set", "data.val_per_class=5", "--set", "attack.steps=2", "--set", "train.val_attack=pgd2",
        "--set", 'eval.attacks=["clean", "pgd2"]')
    assert done.returncode == 0, done.stderr
    said = "optimizer adam (betas 0.9, 0.999, eps 1e-08, weight decay 0.0005 (L2)); lr_schedule cosine (0.003 down " \
           "to 0, per step)"
    assert said in done.stdout and said in (out / "train.log").read_text()
    saved = config.load_saved(out / "config.toml")["train"]
    assert (saved["optimizer"], saved["lr_schedule"]) == ("adam", "cosine")
    # each line records its first step's rate: batches of 64 of the images after 5 a class went to validation
    steps = sum(max(0, n - 5) for n in np.bincount(np.load(npz)["y_train"])) // 64
    lrs = [json.loads(line)["lr"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.0015 * (1 + np.cos(np.pi * (e + 1 / steps) / 2)) for e in (0, 1)], abs=1e-12)
    result = json.loads((out / "eval" / "best_pgd-test.json").read_text())
    assert [len(result["results"][a]["per_class"]) for a in ("clean", "pgd2")] == [10, 10]
