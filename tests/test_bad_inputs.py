"""Bad inputs and faults against the CLI as a user types them (issue 14): each ends in one
``fastfair: error: ...`` line naming the fix and exit code 2, and writes, mixes or loses nothing.

The table runs ``fastfair.cli.main`` in-process on the demo preset; cases that need a finished run
copy one trained once per test run. ``fresh`` cases must leave their ``--out`` absent; ``run`` cases
must leave the copied run byte for byte as it was.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from fastfair import cli, config
from fastfair.errors import UserError
from fastfair.rundir import RunDir, new_run_id
from fastfair.scaleout import grid as grid_module
from helpers import DEMO_FAST, DEMO_TRAIN, NPZ_TRAIN as NPZ, demo_train, fastfair, small_npz, trained_demo

ROOT = Path(__file__).resolve().parents[1]
TRAIN = DEMO_TRAIN
_train = demo_train


@pytest.fixture(scope="module")
def trained() -> Path:
    return trained_demo()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (the lock file aside) by content hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != ".lock"}


# ---- files the cases make -----------------------------------------------------------------------
def npz_case(**change) -> Callable:
    return lambda tmp, run: small_npz(tmp, **change)


class Evil:
    """A pickle that runs a command when loaded: what a refused checkpoint could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def write(name: str, content: bytes | str) -> Callable:
    def make(tmp: Path, run: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return make


def truncated_checkpoint(tmp: Path, run: Path) -> None:
    data = (run / "checkpoints" / "last.pt").read_bytes()
    (tmp / "bad.pt").write_bytes(data[: len(data) // 2])


def unsafe_checkpoint(tmp: Path, run: Path) -> None:
    torch.save({"epoch": 0, "model": Evil(tmp / "pwned")}, tmp / "bad.pt")


def foreign_checkpoint(tmp: Path, run: Path) -> None:
    torch.save({"weights": torch.ones(3)}, tmp / "bad.pt")


def npz_as_checkpoint(tmp: Path, run: Path) -> None:
    np.savez(tmp / "bad.npz", a=np.ones(3))
    (tmp / "bad.npz").rename(tmp / "bad.pt")


def npy_bytes() -> bytes:
    """A .npy file (one array): what np.save writes where np.savez was meant."""
    buf = io.BytesIO()
    np.save(buf, np.ones(3))
    return buf.getvalue()


def in_run(name: str, content: str) -> Callable:
    return lambda tmp, run: (run / name).write_text(content)


def truncate_in_run(name: str) -> Callable:
    def make(tmp: Path, run: Path) -> None:
        data = (run / name).read_bytes()
        (run / name).write_bytes(data[: len(data) // 2])
    return make


def old_run_without_checkpoint(*names: str) -> Callable:
    def make(tmp: Path, run: Path) -> None:
        (tmp / "old").mkdir()
        for name in names:
            shutil.copy(run / name, tmp / "old" / name)
    return make


def grid_file(body: str) -> Callable:
    return lambda tmp, run: (tmp / "grid.toml").write_text(
        'base = "demo"\n[set]\n"train.epochs" = 1\n"attack.steps" = 1\n' + body)


# ---- the table ----------------------------------------------------------------------------------
@dataclass
class Case:
    argv: list[str]  # {out}: a fresh folder; {run}: a copy of the trained run; {tmp}: the case's folder
    match: str  # regex the one error line must match
    setup: Callable | None = None  # (tmp, run) -> None: makes the bad file
    untouched: str = "fresh"  # fresh: {out} stays absent; run: {run} stays byte for byte


def bad_set(key_value: str, match: str) -> Case:
    return Case([*TRAIN, "--out", "{out}", "--set", key_value], match)


GRID = ["grid", "{tmp}/grid.toml", "--out", "{out}", "--gpus", "cpu"]

CASES: dict[str, Case] = {
    # 5. values out of range, checked before anything is loaded or written
    "eps-negative": bad_set("attack.eps=-0.1", r"attack.eps=-0.1 is out of range: it must be within \[0, 1\]"),
    "eps-above-1": bad_set("attack.eps=2", r"attack.eps=2.0 is out of range.*8/255"),
    "alpha-negative": bad_set("attack.alpha=-1", r"attack.alpha=-1.0 is out of range"),
    "steps-zero": bad_set("attack.steps=0", r"attack.steps=0 is out of range: it must be at least 1"),
    "eval-eps": bad_set("eval.eps=1.5", r"eval.eps=1.5 is out of range"),
    "eval-alpha": bad_set("eval.alpha=-0.5", r"eval.alpha=-0.5 is out of range"),
    "epochs-zero": Case([*TRAIN[:3], "--epochs", "0", *DEMO_FAST, "--out", "{out}"], r"train.epochs=0 .*at least 1"),
    "epochs-negative": Case([*TRAIN[:3], "--epochs", "-3", *DEMO_FAST, "--out", "{out}"],
                            r"train.epochs=-3 .*at least 1"),
    "lr-negative": bad_set("train.lr=-0.1", r"train.lr=-0.1 is out of range: it must be above 0"),
    "lr-zero": bad_set("train.lr=0", r"train.lr=0.0 is out of range"),
    "batch-zero": bad_set("data.batch_size=0", r"data.batch_size=0 is out of range: it must be at least 1"),
    "eval-batch-zero": bad_set("data.eval_batch_size=0", r"data.eval_batch_size=0 is out of range"),
    "val-zero": bad_set("data.val_per_class=0", r"data.val_per_class=0 is out of range"),
    "momentum": bad_set("train.momentum=1.5", r"train.momentum=1.5 is out of range: it must be within \[0, 1\]"),
    "weight-decay": bad_set("train.weight_decay=-1", r"train.weight_decay=-1.0 is out of range"),
    "lr-gamma": bad_set("train.lr_gamma=0", r"train.lr_gamma=0.0 is out of range"),
    "milestone-zero": bad_set("train.lr_milestones=[0]", r"train.lr_milestones=\[0\] is out of range"),
    "avg-decay": bad_set("train.avg_decay=2", r"train.avg_decay=2.0 is out of range"),
    "head-scale": bad_set("model.head_scale=0", r"model.head_scale=0.0 is out of range"),
    "classes-repeated": bad_set("data.classes=[1, 1]", r"data.classes=\[1, 1\] is out of range: .*distinct"),
    # names, also checked up front (some only failed after training before)
    "eval-split-train": bad_set("eval.split=train", r"eval.split='train' is not one of test, val"),
    "eval-attack-name": bad_set("eval.attacks=['pgd20', 'pgd-20']", r"eval.attacks: unknown attack 'pgd-20'"),
    "eval-attacks-empty": bad_set("eval.attacks=[]", r"eval.attacks: no attack is named; name at least one"),
    "val-attack-name": bad_set("train.val_attack=strong", r"train.val_attack: unknown attack 'strong'"),
    "amp-name": bad_set("train.amp=fp16", r"train.amp='fp16' is not one of auto, bf16, off"),
    "compile-word": bad_set("train.compile=maybe", r"train.compile='maybe' is not one of auto, off, on"),
    "channels-last": bad_set("model.channels_last=yes", r"model.channels_last='yes' is not one of"),
    "objective": bad_set("attack.objective=mse", r"attack.objective='mse' is not one of ce, cw, kl"),
    "init": bad_set("attack.init=zeros", r"attack.init='zeros' is not one of"),
    "bn-mode": bad_set("attack.bn_mode=frozen", r"attack.bn_mode='frozen' is not one of eval, train"),
    "model-name": bad_set("model.name=resnet9000", r"model.name='resnet9000' is not one of .*resnet18"),
    "select": bad_set("train.select=best", r"train.select='best' is not one of epoch, fair, last, pgd, worst"),
    "averaging": bad_set("train.averaging=swa", r"train.averaging='swa' is not one of .*ema"),
    "order": bad_set("data.order=shuffled", r"data.order='shuffled' is not one of"),
    "lr-not-a-number": bad_set("train.lr=fast", r"train.lr takes a float; got 'fast'"),
    "epochs-float": bad_set("train.epochs=1.5", r"train.epochs takes an integer; got 1.5"),
    "unknown-key": bad_set("train.lrr=0.1", r"unknown config key 'train.lrr'.*train.lr"),
    "set-without-value": bad_set("train.lr", r"--set takes key=value"),
    "model-too-deep-for-the-images": Case([*TRAIN, "--model", "vgg16", "--out", "{out}"],
                                          r"model vgg16 cannot take 8x8 images \(.*too small\); pick a model"),
    "unknown-dataset": Case([*TRAIN, "--dataset", "cifar11", "--out", "{out}"], r"unknown data set 'cifar11'"),
    "unknown-method": Case([*TRAIN, "--method", "trade", "--out", "{out}"], r"unknown method 'trade'.*trades"),
    # 7. suggestions that know the domain: what the papers and other code bases call things
    "method-cfa": Case([*TRAIN, "--method", "cfa", "--out", "{out}"],
                       r"unknown method 'cfa'\. Did you mean --method trades --ccm --ccr --fawa \(CFA-TRADES.*"
                       r"--method pgd-at --ccm --fawa \(CFA-AT\).*cfa-t1-trades-cfa-paper"),
    "method-spelling": Case([*TRAIN, "--method", "ME_AT", "--out", "{out}"], r"unknown method 'ME_AT'\. Did you mean "
                            r"me-at\? Known:"),
    "method-frl-name": Case([*TRAIN, "--method", "frl-reweight", "--out", "{out}"], r"Did you mean frl-rw\?"),
    "method-he": Case([*TRAIN, "--method", "trades-he", "--out", "{out}"], r"Did you mean --method pgd-at --set "
                      r"model.head=cosine --set he.margin=0.2"),
    "model-spelling": Case([*TRAIN, "--model", "PreActResNet18", "--out", "{out}"], r"model.name='PreActResNet18' is "
                           r"not one of .*wrn-34-10\. Did you mean preact-resnet18\?$"),
    "key-learning-rate": bad_set("train.learning_rate=0.1", r"unknown config key 'train.learning_rate' \(from --set\)"
                                 r"\. Did you mean train.lr\?$"),
    "key-bare-synonym": bad_set("weight-decay=0", r"Did you mean train.weight_decay\?$"),
    "key-other-section": bad_set("train.batch_size=64", r"'train.batch_size' .*Did you mean data.batch_size\?$"),
    "key-epsilon": bad_set("epsilon=0.03", r"Did you mean attack.eps \(the training attack\) or eval.eps"),
    "key-trades-beta": bad_set("beta=6", r"Did you mean method.kl_weight \(TRADES' and CFA's beta"),
    "eval-autoattack": Case(["eval", "{run}", "--attacks", "clean,autoattack", "--quiet"],
                            r"unknown attack 'autoattack'\. Did you mean aa \(AutoAttack.*aa \(AutoAttack\)", None,
                            "run"),
    "eval-apgd": Case(["eval", "{run}", "--attacks", "APGD-CE", "--quiet"], r"Did you mean aa \(AutoAttack: APGD-CE, "
                      r"APGD-T, FAB-T and Square together", None, "run"),
    "eval-pgd-spelling": Case(["eval", "{run}", "--attacks", "clean,PGD-20", "--quiet"], r"'PGD-20'\. Did you mean "
                              r"pgd20\?", None, "run"),
    # no aa: never a validation attack
    "val-attack-spelling": bad_set("train.val_attack=PGD_10", r"train.val_attack: unknown attack 'PGD_10'\. Did you "
                                   r"mean pgd10\? Use clean, .*tpgdK@tT, .*NAME/N [^,]*\), corrupt:NAME@S [^,]*\) \("),
    "eval-checkpoint-typo": Case(["eval", "{run}", "--checkpoint", "best_fiar", "--quiet"],
                                 r"run has no checkpoint 'best_fiar'\. Did you mean best_fair.*Its checkpoints: "
                                 r"best_fair, best_pgd, best_worst, last$", None, "run"),
    "eval-checkpoint-avg": Case(["eval", "{run}", "--checkpoint", "best_fair_avg", "--quiet"],
                                r"no checkpoint 'best_fair_avg' \(_avg checkpoints come from weight averaging: train "
                                r"with --ema or --fawa\)", None, "run"),
    "diagnose-checkpoint": Case(["diagnose", "{run}", "--checkpoint", "best", "--quiet"],
                                r"no checkpoint 'best'\. Did you mean best_pgd.*Its checkpoints", None, "run"),
    "unknown-preset": Case(["train", "--config", "dem0", "--out", "{out}"], r"no config file or preset 'dem0'"),
    "bad-preset-toml": Case(["train", "--config", "{tmp}/p.toml", "--out", "{out}"], r"p.toml: not valid TOML",
                            write("p.toml", "[train\nepochs = 1")),
    # 5. values that need the data: checked when it loads, before training
    "batch-above-split": bad_set("data.batch_size=100000", r"data.batch_size=100000 is more than the \d+ training"),
    "val-takes-a-class": bad_set("data.val_per_class=1000", r"data.val_per_class=1000 takes every training image"),
    # 5. npz contents
    "npz-float-labels": Case([*TRAIN, *NPZ, "--out", "{out}"], r"y_train is float64; labels must be integers",
                             npz_case(y_train=np.arange(200) % 4 + 0.5)),
    "npz-test-label-range": Case([*TRAIN, *NPZ, "--out", "{out}"], r"y_test holds labels 0..9, outside 0..3",
                                 npz_case(y_test=np.arange(40) % 10)),
    "npz-negative-label": Case([*TRAIN, *NPZ, "--out", "{out}"], r"y_train holds labels -1..3",
                               npz_case(y_train=np.arange(200) % 5 - 1)),
    "npz-lengths": Case([*TRAIN, *NPZ, "--out", "{out}"], r"y_train has shape \(150,\) for 200 images",
                        npz_case(y_train=np.arange(150) % 4)),
    "npz-float-images": Case([*TRAIN, *NPZ, "--out", "{out}"], r"x_train is float32.*uint8",
                             npz_case(x_train=np.zeros((200, 8, 8), np.float32))),
    "npz-layout": Case([*TRAIN, *NPZ, "--out", "{out}"], r"x_test has shape \(40, 5, 8, 8\)",
                       npz_case(x_test=np.zeros((40, 5, 8, 8), np.uint8))),
    "npz-shapes-differ": Case([*TRAIN, *NPZ, "--out", "{out}"], r"both splits need one image shape",
                              npz_case(x_test=np.zeros((40, 6, 6), np.uint8))),
    "npz-2d-labels": Case([*TRAIN, *NPZ, "--out", "{out}"], r"y_test has shape \(40, 1\)",
                          npz_case(y_test=(np.arange(40) % 4)[:, None])),
    "npz-missing-array": Case([*TRAIN, *NPZ, "--out", "{out}"], r"lacks arrays \['y_test'\]",
                              npz_case(y_test=None)),
    "npz-not-npz": Case([*TRAIN, *NPZ, "--out", "{out}"],  # not numpy's advice to allow pickles
                        r"^(?!.*pickle).*data.npz is not an .npz file \(what np.savez writes.*x_train, y_train",
                        write("data.npz", "hello")),
    "npz-is-npy": Case([*TRAIN, *NPZ, "--out", "{out}"], r"data.npz holds one array \(a .npy file\).*np.savez",
                       write("data.npz", npy_bytes())),
    "data-dir-a-file": Case([*TRAIN, "--dataset", "cifar10", "--data-dir", "{tmp}/README.md", "--out", "{out}"],
                            r"--data-dir .*README.md is a file; CIFAR10 needs a folder .*--dataset npz --data-dir",
                            write("README.md", "# a project\n")),
    "npz-missing-file": Case([*TRAIN, *NPZ, "--out", "{out}"], r"the npz data set needs --data-dir FILE.npz"),
    # 6. --out that cannot be a run folder
    "out-is-a-file": Case([*TRAIN, "--out", "{tmp}/f"], r"f is a file, not a folder", write("f", "x"), "none"),
    "out-under-a-file": Case([*TRAIN, "--out", "{tmp}/f/run"], r"cannot create the folder .*f/run",
                             write("f", "x"), "none"),
    "out-not-creatable": Case([*TRAIN, "--out", "/proc/fastfair-test/run"], r"cannot create the folder", None, "none"),
    # 2. a new run never goes into a folder holding run files
    "new-run-over-finished": Case(_train("{run}"), r"already holds a run \(config.toml, metrics.jsonl.*--resume",
                                  None, "run"),
    "new-run-over-metrics-only": Case(_train("{tmp}/old"), r"already holds a run \(metrics.jsonl\)",
                                      old_run_without_checkpoint("metrics.jsonl"), "none"),
    "new-run-over-config-only": Case(_train("{tmp}/old"), r"already holds a run \(config.toml",
                                     old_run_without_checkpoint("config.toml", "history.jsonl"), "none"),
    # 3. --resume continues the saved config
    "resume-changes-eps": Case(_train("{run}", "--resume", "--set", "attack.eps=0.2"),
                               r"attack.eps \(0.1 -> 0.2\) would change what the run computes.*train.epochs",
                               None, "run"),
    "resume-changes-method": Case(_train("{run}", "--resume", "--method", "trades"),
                                  r"method.name is me-trades in the saved run's config and cannot change to "
                                  r"'trades'", None, "run"),
    "resume-changes-seed": Case(_train("{run}", "--resume", "--seed", "3"), r"train.seed \(0 -> 3\)", None, "run"),
    "resume-without-run": Case(_train("{out}", "--resume"), r"--resume needs --out RUN_DIR of an earlier run"),
    "resume-damaged-config": Case(_train("{run}", "--resume"),
                                  r"config.toml names no run, though history.jsonl names run [0-9a-f]{32} .*it was "
                                  r"edited or replaced", in_run("config.toml", "[data\n"), "run"),
    "resume-damaged-metrics": Case(_train("{run}", "--resume", "--epochs", "2"),
                                   r"metrics.jsonl, line 1, is not JSON",
                                   in_run("metrics.jsonl", '{"epoch": \n{"epoch": 0}\n'), "run"),
    "resume-truncated-last": Case(_train("{run}", "--resume", "--epochs", "2"),
                                  r"cannot resume .*last.pt is truncated .*copy it again .*or move it aside and "
                                  r"`fastfair train --out \S+ --resume` trains the run again from its first epoch",
                                  truncate_in_run("checkpoints/last.pt"), "run"),
    # 6. checkpoints that are not (safe) fastfair checkpoints
    "eval-empty-pt": Case(["eval", "{tmp}/bad.pt", "--quiet"], r"bad.pt is not a checkpoint .*empty or another",
                          write("bad.pt", b""), "none"),
    "eval-text-pt": Case(["eval", "{tmp}/bad.pt", "--quiet"], r"bad.pt is not a checkpoint",
                         write("bad.pt", "weights"), "none"),
    "eval-truncated-pt": Case(["eval", "{tmp}/bad.pt", "--quiet"], r"bad.pt is truncated \(a zip",
                              truncated_checkpoint, "none"),
    "eval-unsafe-pt": Case(["eval", "{tmp}/bad.pt", "--quiet"], r"bad.pt is unsafe to load.*does not unpickle",
                           unsafe_checkpoint, "none"),
    "eval-foreign-pt": Case(["eval", "{tmp}/bad.pt", "--quiet"],
                            r"bad.pt is not a checkpoint .*lacks epoch, model.*add --model ARCH", foreign_checkpoint,
                            "none"),
    "eval-npz-as-pt": Case(["eval", "{tmp}/bad.pt", "--quiet"], r"bad.pt is damaged or not a checkpoint",
                           npz_as_checkpoint, "none"),
    "init-from-unsafe": Case([*TRAIN, "--init-from", "{tmp}/bad.pt", "--out", "{out}"], r"bad.pt is unsafe to load",
                             unsafe_checkpoint),
    "init-from-empty": Case([*TRAIN, "--init-from", "{tmp}/bad.pt", "--out", "{out}"], r"bad.pt is not a checkpoint",
                            write("bad.pt", b"")),
    # 5. + 7. grids: every run checked before the first launches
    "grid-bad-run": Case(GRID, r"grid grid, run eps=2.0: attack.eps=2.0 is out of range",
                         grid_file('[[axes]]\nkey = "attack.eps"\nvalues = [0.1, 2.0]\n')),
    "grid-no-shared-attack": Case(GRID, r"share no robust attack in eval.attacks",
                                  grid_file('[[axes]]\nkey = "eval.attacks"\nvalues = [["clean", "pgd5"], '
                                            '["clean", "cw5"]]\nlabels = ["p", "c"]\n')),
    "grid-model-too-deep": Case(GRID, r"grid grid, run vgg16: model vgg16 cannot take 8x8 images",
                                grid_file('[[axes]]\nkey = "model.name"\nvalues = ["tiny-cnn", "vgg16"]\n'
                                          'labels = ["tiny-cnn", "vgg16"]\n')),
    "grid-bad-value-type": Case(GRID, r"run lr=fast: train.lr takes a float",
                                grid_file('[[axes]]\nkey = "train.lr"\nvalues = [0.1, "fast"]\n')),
    "grid-per-gpu-zero": Case([*GRID, "--per-gpu", "0"], r"--per-gpu takes a number of runs per GPU .* or auto; "
                              r"got '0'", grid_file("")),
    "reproduce-per-gpu-word": Case(["reproduce", "me-t2", "--per-gpu", "many", "--out", "{out}"],
                                   r"--per-gpu takes a number of runs per GPU .* or auto; got 'many'"),
    "grid-out-is-a-file": Case([*GRID[:2], "--out", "{tmp}/f", "--gpus", "cpu"], r"f is a file, not a folder",
                               lambda tmp, run: (grid_file("")(tmp, run), (tmp / "f").write_text("x")), "none"),
}


@pytest.mark.fault
@pytest.mark.parametrize("name", list(CASES))
def test_a_bad_input_is_one_error_line_and_writes_nothing(name, trained, tmp_path, capsys):
    case = CASES[name]
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    if case.setup:
        case.setup(tmp_path, run)
    before = snapshot(run)
    argv = [a.format(out=tmp_path / "out", run=run, tmp=tmp_path) for a in case.argv]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    assert re.search(case.match, err[0]), err[0]
    assert not (tmp_path / "out").exists()  # a refused command makes no folder
    assert snapshot(run) == before  # and touches no run
    assert not (tmp_path / "pwned").exists()  # a refused pickle ran nothing


def test_the_table_covers_every_class_of_the_issue():
    assert len(CASES) >= 60


# ---- faults that end well: divergence, lock takeover, torn lines --------------------------------
@pytest.mark.fault
@pytest.mark.slow
def test_divergence_stops_keeps_the_last_good_epoch_and_resumes_with_a_lower_lr(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = snapshot(run)
    assert cli.main(_train(run, "--resume", "--epochs", "2", "--set", "train.lr=1e6")) == 2
    err = capsys.readouterr().err
    assert "training diverged in epoch 2 (non-finite" in err and "checkpoints/last.pt keeps epoch 1" in err
    assert "--resume --set train.lr=100000" in err and "Traceback" not in err
    after = snapshot(run)
    for kept in ("metrics.jsonl", "checkpoints/last.pt", "checkpoints/best_pgd.pt", "checkpoints/best_fair.pt"):
        assert after[kept] == before[kept]  # no non-finite model became a checkpoint; no line for the epoch
    assert not list((run / "checkpoints").glob("*.tmp"))

    assert cli.main(_train(run, "--resume", "--epochs", "2", "--set", "train.lr=0.05")) == 0
    history = RunDir(run).read_history()
    assert [h["event"] for h in history] == ["start", "resume", "resume"]
    assert history[1]["changed"] == {"train.epochs": [1, 2], "train.lr": [0.05, 1e6]}
    assert history[2]["changed"] == {"train.lr": [1e6, 0.05]}
    assert [r["epoch"] for r in RunDir(run).read_metrics()] == [1, 2]
    assert RunDir(run).read_metrics()[1]["lr"] == pytest.approx(0.05)
    assert not RunDir(run).locked_by()


@pytest.mark.fault
@pytest.mark.slow
def test_a_torn_metrics_line_and_a_stale_lock_are_repaired_on_resume(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"epoch": 2, "lo')  # killed while appending epoch 2's line
    (run / ".lock").write_text("pid 999999 on elsewhere")  # its holder died without a clean end
    assert RunDir(run).read_metrics()[-1]["epoch"] == 1  # readers skip the torn line
    assert cli.main(_train(run, "--resume", "--epochs", "2")) == 0
    err = capsys.readouterr().err
    assert "taking over the lock of pid 999999 on elsewhere, which is no longer running" in err
    assert "removed a half-written last line" in err
    assert [json.loads(line)["epoch"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert (run / ".lock").read_text() == ""


@pytest.mark.fault
def test_a_live_writer_keeps_its_run(trained, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    before = snapshot(run)
    with RunDir(run).lock():  # another process writing this run
        assert cli.main(_train(run, "--resume", "--epochs", "2")) == 2
        assert RunDir(run).locked_by() == f"pid {os.getpid()} on {os.uname().nodename}"
    err = capsys.readouterr().err
    assert f"is being written by another fastfair process (pid {os.getpid()}" in err
    assert snapshot(run) == before


@pytest.mark.fault
def test_a_grid_refuses_a_run_another_process_still_trains(tmp_path, monkeypatch, capsys):
    grid_file('[[axes]]\nkey = "train.seed"\nvalues = [0]\nlabels = ["a"]\n')(tmp_path, None)
    run = RunDir(tmp_path / "out" / "a")
    run.path.mkdir(parents=True)
    run.grid_state.write_text(json.dumps({"status": "running", "attempt": 1}))
    monkeypatch.setattr(grid_module, "DYING_S", 0.2)
    with run.lock():
        assert cli.main([a.format(tmp=tmp_path, out=tmp_path / "out") for a in GRID]) == 2
    assert "runs still being trained by another process: a (pid" in capsys.readouterr().err
    assert json.loads(run.grid_state.read_text())["attempt"] == 1  # not launched


@pytest.mark.fault
def test_two_grids_never_write_one_folder(tmp_path, capsys):
    grid_file('[[axes]]\nkey = "train.seed"\nvalues = [0]\n')(tmp_path, None)
    with RunDir(tmp_path / "out").lock():
        assert cli.main([a.format(tmp=tmp_path, out=tmp_path / "out") for a in GRID]) == 2
    assert "is being written by another fastfair process" in capsys.readouterr().err
    assert not (tmp_path / "out" / "train.seed=0").exists()


@pytest.mark.fault
@pytest.mark.slow
def test_kill_9_mid_run_then_resume_continues_where_the_checkpoint_left(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fastfair", *_train(out, "--method", "standard")]
    cmd[cmd.index("--epochs") + 1] = "3"
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (out / "checkpoints" / "last.pt").is_file():  # epoch 1 is saved
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    kept = torch.load(out / "checkpoints" / "last.pt", weights_only=True)["epoch"]
    resumed = fastfair(*cmd[3:], "--resume")  # in this process: the kill is the process boundary, not the resume
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over the lock" in resumed.stderr  # the killed process's lock was stale
    assert [r["epoch"] for r in RunDir(out).read_metrics()] == [1, 2, 3]  # none twice, none lost
    history = RunDir(out).read_history()
    assert [h["event"] for h in history] == ["start", "resume"] and history[1]["epoch"] == kept + 1
    assert not list(out.rglob("*.tmp"))


def test_a_grid_lets_started_runs_change_only_what_resume_may(tmp_path):
    grid_file('[[axes]]\nkey = "train.seed"\nvalues = [0]\nlabels = ["a"]\n')(tmp_path, None)
    sets = ["train.epochs=1", "attack.steps=1", "train.seed=0"]
    started = RunDir(tmp_path / "out" / "a")
    started.write_config(config.resolve("demo", None, [*sets, "train.lr=0.01"]).to_toml(),  # e.g. after divergence
                         new_run_id())
    lines = []
    assert grid_module.run_grid(str(tmp_path / "grid.toml"), out=str(tmp_path / "out"), dry_run=True,
                                echo=lines.append) == 0
    started.write_config(config.resolve("demo", None, [*sets, "attack.eps=0.2"]).to_toml(), new_run_id())
    with pytest.raises(UserError, match=r"the grid file changed for runs already started: a \(attack.eps\)"):
        grid_module.run_grid(str(tmp_path / "grid.toml"), out=str(tmp_path / "out"), dry_run=True, echo=lines.append)
