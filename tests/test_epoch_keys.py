"""Keys naming an epoch the run never reaches (issue 28, item 2), as a user types them.

A setting that would never act is one ``fastfair: error:`` line naming the fix before any run folder
exists; a preset's or default's value that a shorter ``--epochs`` only cuts short (a quick look), a
milestone past the end while others act, and a schedule cut short are warnings, said once on the
console and in ``train.log``. One test per family of such keys (fastfair/checks.py, check_epochs).
"""
import re
from pathlib import Path

import pytest

from fastfair import cli, config
from fastfair.checks import check_config, epoch_keys
from fastfair.evaluation.per_class import wants_substitute
from fastfair.methods import keys_markdown
from fastfair.rundir import RunDir

ROOT = Path(__file__).resolve().parents[1]
# the demo (digits, tiny CNN) cut to seconds: 4 channels, one attack step, FGSM validation and evaluation
FAST = ["--quiet", "--set", "model.width=4", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm",
        "--set", "eval.attacks=['clean', 'fgsm']", "--set", "data.batch_size=256"]


def refused(capsys, tmp_path, *argv) -> str:
    """The one error line of ``fastfair train ARGV``, after checking nothing was written."""
    out = tmp_path / "run"
    assert cli.main(["train", *argv, "--out", str(out), *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    assert not out.exists()  # refused before the run folder, so before any epoch
    return err[0]


def test_options_switched_on_with_too_few_epochs_are_one_error_naming_every_key(capsys, tmp_path):
    err = refused(capsys, tmp_path, "--method", "trades", "--dataset", "digits", "--ccm", "--ccr", "--fawa",
                  "--epochs", "2")
    for said in ("ccm.begin = 10 (CCM's calibrated eps_k from epoch 11)",
                 "ccr.begin = 10 (CCR's calibrated TRADES beta_k from epoch 11)",
                 "train.avg_begin = 50 (EMA/FAWA weight averaging from epoch 51)",
                 "are past train.epochs = 2, so this run would go without them",
                 "--set train.avg_begin=1 --set ccm.begin=1 --set ccr.begin=1 (or lower)",
                 "train for 51 epochs or more (--epochs 51)"):
        assert said in err, said


def test_an_option_the_user_adds_to_a_shortened_preset_is_an_error(capsys, tmp_path):
    err = refused(capsys, tmp_path, "--config", "demo", "--ccm", "--epochs", "3")
    assert "ccm.begin = 10 (CCM's calibrated eps_k from epoch 11) is past train.epochs = 3" in err
    assert "set --set ccm.begin=2 (or lower), or train for 11 epochs or more (--epochs 11)" in err
    # CCM reads A_k of a finished epoch, so in a 1-epoch run no ccm.begin acts: only more epochs help
    assert re.search(r"go without it; train for 11 epochs or more \(--epochs 11\)$",
                     refused(capsys, tmp_path, "--config", "demo", "--ccm", "--epochs", "1"))


@pytest.mark.parametrize("argv, said", [
    (["--config", "demo", "--set", "train.lr_milestones=[20, 30]"],  # the demo trains 15 epochs
     r"train.lr_milestones = \[20, 30\] \(the learning-rate decay from epoch 21\) is past train.epochs = 15.*"
     r"--set train.lr_milestones=\[14\]"),
    (["--method", "fat", "--dataset", "digits", "--epochs", "5", "--set", "method.tau_milestones=[5]"],
     r"method.tau_milestones = \[5\] \(FAT's tau increase from epoch 6\) is past train.epochs = 5"),
    (["--method", "dafa-trades", "--dataset", "digits", "--epochs", "3"],  # the user chose DAFA: its 70 warm-up
     r"method.warmup = 70 \(DAFA's class weights from epoch 71\).*--set method.warmup=2"),
    (["--method", "trix", "--dataset", "digits", "--epochs", "3", "--set", "method.warmup=3"],
     r"method.warmup = 3 \(DAFA's class weights from epoch 4\)"),
    (["--method", "frl", "--dataset", "digits", "--set", "method.halve_every=41"],  # FRL trains 40 epochs
     r"method.halve_every = 41 \(FRL's halving of rate_weight from epoch 41\).*--set method.halve_every=40"),
    (["--config", "demo", "--ema", "--set", "train.avg_begin=15"],
     r"train.avg_begin = 15 \(EMA/FAWA weight averaging from epoch 16\) is past train.epochs = 15"),
    # no best_fair.pt to evaluate: refused even for a quick look
    (["--config", "demo", "--set", "train.select=fair", "--set", "train.select_begin=15"],
     r"train.select_begin = 15 \(the best_\* checkpoints train.select evaluates from epoch 16\).*select_begin=14"),
])
def test_each_key_family_past_the_end_is_refused_naming_the_fix(capsys, tmp_path, argv, said):
    assert re.search(said, refused(capsys, tmp_path, *argv))


def test_a_shortened_preset_warns_once_on_the_console_and_in_train_log(capsys, tmp_path):
    """A preset's own values cut short by --epochs (a quick look) train, saying what the run goes without."""
    preset = tmp_path / "cfa-like.toml"
    preset.write_text((ROOT / "configs" / "demo.toml").read_text().replace("lr_milestones = [10, 13]", """\
lr_milestones = [1, 13]
averaging = "fawa"
avg_begin = 10
avg_threshold = 0.0

[ccm]
enabled = true
begin = 10

[he]
schedule = "cmp"
""").replace('name = "tiny-cnn"', 'name = "tiny-cnn"\nhead = "cosine"'))
    out = tmp_path / "run"
    assert cli.main(["train", "--config", str(preset), "--epochs", "2", "--out", str(out), *FAST]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fastfair: warning: ")]
    log = RunDir(out).train_log.read_text()
    expected = [
        "train.lr_milestones = [1, 13]: 13 is past train.epochs = 2, so this run leaves out the learning-rate decay "
        "there",
        "train.avg_begin = 10 (EMA/FAWA weight averaging from epoch 11) is past train.epochs = 2, so this run goes "
        "without it (the preset's value, cut short by train.epochs from the command line; to see it act: "
        "--set train.avg_begin=1)",
        "ccm.begin = 10 (CCM's calibrated eps_k from epoch 11) is past train.epochs = 2, so this run goes without it",
        "he.pmax_epoch = 90 is past train.epochs = 2: HE-CMP's rise of the maximum probability to he.pmax_end would "
        "end in epoch 91, so this run stops it part-way",
    ]
    assert len(warnings) == len(expected), warnings
    for said in expected:
        assert sum(said in w for w in warnings) == 1, said  # once on the console
        assert log.count(said) == 1, said  # and once in the run's log
    assert len(RunDir(out).read_metrics()) == 2  # and it trained


def test_a_default_cut_short_by_epochs_is_a_warning():
    """``fastfair train --epochs 2`` is a quick look at the default schedule (lr decays at 75 and 90)."""
    cfg = config.resolve(None, {"train.epochs": 2})
    assert check_config(cfg) == [
        "train.lr_milestones = [75, 90] (the learning-rate decay from epoch 76) is past train.epochs = 2, so this run "
        "goes without it (a default's value, cut short by train.epochs from the command line; to see it act: "
        "--set train.lr_milestones=[1])"]
    assert check_config(config.resolve(None, {"train.epochs": 100})) == []


def test_a_grid_refuses_a_run_that_never_reaches_its_epoch_before_any_launch(capsys, tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('base = "demo"\n[set]\n"train.epochs" = 2\n"model.width" = 4\n'
                    '[[axes]]\nkey = "ccm.enabled"\nvalues = [false, true]\n')
    assert cli.main(["grid", str(grid), "--out", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.match(r"fastfair: error: grid g, run enabled=\w+: ccm.begin = 10 .* is past "
                                      r"train.epochs = 2", err[0]), err
    assert not list((tmp_path / "g").glob("*/train.log"))  # the good run did not launch either


def test_every_shipped_preset_reaches_the_epochs_its_keys_name():
    for path in sorted((ROOT / "configs").glob("*.toml")):
        cfg = config.resolve(str(path))
        if wants_substitute(cfg.eval.attacks):  # reproduce sets it to the substitute row's run (Tian et al.'s tables)
            cfg = config.resolve(str(path), None, ["eval.substitute=runs/substitute"])
        check_config(cfg)  # raises for a key its own run never reaches


def test_help_numbers_epochs_from_1():
    """Help says which epoch a key names, counted from 1 as every printed and written epoch is."""
    assert "0-based" not in keys_markdown()
    assert "from epoch begin + 1 on" in keys_markdown() and "from epoch tau + 1 on" in keys_markdown()
    assert {"ccm.begin", "ccr.begin", "method.warmup", "method.tau_milestones", "method.halve_every",
            "he.pmax_epoch", "train.lr_milestones", "train.avg_begin", "train.select_begin"} <= set(epoch_keys())


@pytest.mark.parametrize("flags, what", [
    ({"method.name": "wat"}, "WAT's class weights"),
    ({"method.name": "trades", "cost_sensitive.auto": True}, "cost_sensitive.auto's class weights"),
])
def test_what_only_an_epoch_s_end_sets_is_a_warning_in_a_one_epoch_run(flags, what):
    """WAT's weights and cost_sensitive.auto's are set after each epoch: a one-epoch run trains without them."""
    warned = check_config(config.resolve(None, {**flags, "train.epochs": 1, "train.lr_milestones": []}))
    assert len(warned) == 1 and warned[0].startswith(what) and warned[0].endswith(
        ": set at the end of each epoch, they act from epoch 2 on, so this one-epoch run trains without them "
        "(--epochs 2 or more to see them act)")
    assert check_config(config.resolve(None, {**flags, "train.epochs": 2, "train.lr_milestones": []})) == []
    given = {"method.name": "trades", "cost_sensitive.weights": [1.0] * 10}  # given weights act from epoch 1
    assert check_config(config.resolve(None, {**given, "train.epochs": 1, "train.lr_milestones": []})) == []
