"""Every command fastfair prints works as printed (issue 49, items 5-8): the ``continue with:`` line after each kind
of stop (SIGTERM, SIGUSR1, a full disk) of a run shortened with ``--epochs``, and the ``next:`` lines the resumed run
ends with, each run as a user would paste it (the signals' cases in test_signals, which stops real processes).

Each run is test_signals' TRAIN: the demo preset (learning-rate milestones at epochs 10 and 13) cut to 2 epochs of
4 steps: the milestones lie past its end, a warning when it starts, and ``--resume`` (which takes every setting from
the run folder) must not refuse what its start accepted.
"""
from __future__ import annotations

import os
import signal
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

import torch

import fastfair
from fastfair import build, checks, cli, config, rundir
from fastfair.rundir import init_model
from fastfair.training.teacher import load_teacher
from fastfair.errors import UserError
from fastfair.rundir import RunDir
from helpers import trained_demo
from test_reliability import fail_writes
from test_signals import TRAIN, as_printed, continue_with, ended, held, release, start, wait_held

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.fault
def test_the_continue_with_line_of_a_run_stopped_by_a_full_disk_works_as_printed(tmp_path, monkeypatch, capsys):
    """No last.pt can be written: epoch 1 ends without its checkpoint; once space is freed, the continue with: line,
    pasted as printed, finishes the shortened run, the milestones' warning said again. The same line after SIGTERM
    and SIGUSR1, and the next: lines the resumed run ends with: test_signals, where those signals stop a real
    process."""
    out = tmp_path / "run"
    fail_writes(monkeypatch, which=lambda path: path.name.startswith(".last.pt."))
    assert cli.main([*TRAIN, "--out", str(out)]) == 74
    monkeypatch.undo()  # space was freed
    resumed = as_printed(continue_with(capsys.readouterr().err))
    assert resumed.returncode == 0, resumed.stderr
    assert [m["epoch"] for m in RunDir(out).read_metrics()] == [1, 2]  # the run ended as started: 2 epochs
    assert "(the saved run's value; to see it act: --set train.lr_milestones=[1])" in resumed.stderr  # still said


def test_resume_accepts_what_the_run_was_warned_about_and_refuses_what_it_sets_anew():
    """--resume takes every setting from the run folder: what its start accepted with a warning (a preset's
    milestones cut short by --epochs) is said again, not refused; a milestone the resume itself sets past the
    end is refused, as at a start."""
    started = config.resolve("demo", {"train.epochs": 2})
    assert any("the preset's value, cut short by train.epochs from the command line" in w
               for w in checks.check_config(started))
    saved = tomllib.loads(started.to_toml())
    said = checks.check_config(config.resolve(None, {}, [], base=saved))
    assert [w for w in said if "lr_milestones" in w] == [
        "train.lr_milestones = [10, 13] (the learning-rate decay from epoch 11) is past train.epochs = 2, so this run "
        "goes without it (the saved run's value; to see it act: --set train.lr_milestones=[1])"]
    with pytest.raises(UserError, match=r"train.lr_milestones = \[5\] .* is past train.epochs = 2"):
        checks.check_config(config.resolve(None, {}, ["train.lr_milestones=[5]"], base=saved))
    shorter = checks.check_config(config.resolve(None, {"train.epochs": 1}, [], base=saved))  # --resume --epochs 1
    assert any("the saved run's value, cut short by train.epochs from the command line" in w for w in shorter)


# ---- item 7: the Python API ends on a stop signal as the CLI does ---------------------------------------------

# the model and images of the call, made alike in the process signalled and in this one (its rerun)
API_SETUP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10))
x, y = torch.rand(20, 3, 4, 4), torch.arange(20) % 10
"""
API_SCRIPT = API_SETUP + """
import sys, fastfair
from fastfair.errors import Interrupted
try:
    result = fastfair.evaluate(model, (x, y), attacks="clean,aa", eps=0.05, out=sys.argv[1], progress=False)
except Interrupted as err:
    print(f"Interrupted {err.signum}: {err}")
else:
    print("done", result.record.get("path"))
"""


@pytest.mark.fault
def test_sigterm_during_evaluate_raises_interrupted_and_the_same_call_resumes_autoattack(tmp_path, capsys):
    out = tmp_path / "eval.json"
    env, markers = held(tmp_path, "fastfair.attacks.autoattack:Flags.save", 2)  # after AutoAttack's first sub-attack
    proc = start([sys.executable, "-c", API_SCRIPT, str(out)], env)
    (pid,) = wait_held(markers, proc)
    os.kill(pid, signal.SIGTERM)
    code, printed, err = ended(proc)
    assert code == 0 and printed.strip() == (
        "Interrupted 15: interrupted by SIGTERM; this evaluation returned no result; with out=, AutoAttack's "
        "per-image progress is kept beside it and the same call resumes it"), (printed, err)
    assert not out.exists() and out.with_suffix(".aa.npz").is_file()  # AutoAttack's first sub-attack, whole

    release(markers)
    made = {}
    exec(API_SETUP, made)  # the same call, in this process
    again = fastfair.evaluate(made["model"], (made["x"], made["y"]), attacks="clean,aa", eps=0.05, out=str(out),
                              progress=True)
    assert again.record.get("path") == str(out)
    printed = capsys.readouterr()
    assert f"AutoAttack: resuming {out.with_suffix('.aa.npz')}" in printed.out + printed.err


# ---- item 8: messages a user can act on ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained() -> Path:
    return trained_demo()


def test_evaluate_takes_a_run_folder_or_checkpoint_as_fastfair_eval_does(trained):
    x, y = torch.rand(20, 1, 8, 8), torch.arange(20) % 10  # digits' shape
    module = build.checkpoint_model(trained, torch.device("cpu"))[0]
    want = fastfair.evaluate(module, (x, y), attacks="clean", progress=False).record["results"]
    for model in (trained, str(trained / "checkpoints" / "best_pgd.pt")):
        assert fastfair.evaluate(model, (x, y), attacks="clean", progress=False).record["results"] == want
    with pytest.raises(UserError, match=r"^model must be a torch.nn.Module mapping images in \[0, 1\] to logits, or "
                                        r"the path of a fastfair run or checkpoint; got dict$"):
        fastfair.evaluate({"model": 1}, (x, y), attacks="clean")


def test_a_model_file_fastfair_did_not_write_is_refused_naming_what_each_path_takes(tmp_path):
    """Only fastfair eval has --model ARCH: the API, train.init_from and method.teacher name what they take."""
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    x, y = torch.rand(4, 1, 8, 8), torch.arange(4)
    calls = {"evaluate": lambda: fastfair.evaluate(str(foreign), (x, y), attacks="clean"),
             "init_from": lambda: init_model(torch.nn.Linear(2, 2), foreign),
             "teacher": lambda: load_teacher(str(foreign), dataset="digits", num_classes=10, device="cpu")}
    said = {"evaluate": "for a model file fastfair did not write, build its nn.Module, load the weights and pass "
                        "the module",
            "init_from": "train.init_from takes a checkpoint of a fastfair run (RUN/checkpoints/*.pt)",
            "teacher": "method.teacher takes a fastfair run, its checkpoint or rb:NAME (a RobustBench model)"}
    for name, call in calls.items():
        with pytest.raises(UserError) as err:
            call()
        assert "--model" not in str(err.value) and str(err.value).startswith(f"{foreign} is not a checkpoint written "
                                                                             "by fastfair train"), str(err.value)
        assert str(err.value).endswith(f"; {said[name]}"), str(err.value)


@pytest.mark.fault
def test_a_checkpoint_the_disk_refused_leaves_no_metrics_line_and_its_error_is_in_train_log(tmp_path, monkeypatch,
                                                                                           capsys):
    out = tmp_path / "run"
    fail_writes(monkeypatch, which=lambda path: path.name.startswith(".last.pt."))  # epoch 1's last.pt
    assert cli.main([*TRAIN, "--out", str(out)]) == 74
    error = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fastfair: error: ")]
    assert len(error) == 1 and "continue with: fastfair train" in error[0], error
    assert RunDir(out).metrics.read_text() == ""  # epoch 1's line went with its checkpoint
    assert RunDir(out).train_log.read_text().splitlines()[-1] == error[0]  # the log says how the run ended


@pytest.mark.parametrize("protocol", [3, 4])
def test_a_model_file_of_another_pickle_protocol_loads_or_is_one_line_and_torch_warns_nothing(protocol, tmp_path,
                                                                                              capsys):
    """torch's safe loader warns about any pickle protocol but its own (2), reads 3, and fails on 4 and 5 with the
    error it gives a file holding code: fastfair said "unsafe to load" of plain weights, and the warning leaked."""
    from test_api_checks import model_file
    model_file(tmp_path)
    path = tmp_path / "model.pt"
    torch.save(torch.load(path, weights_only=True), path, pickle_protocol=protocol)
    argv = ["eval", str(path), "--model", "tiny-cnn", "--dataset", "npz", "--data-dir", str(tmp_path / "data.npz"),
            "--attacks", "clean", "--quiet"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the command
        code = cli.main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line]
    if protocol == 3:
        assert code == 0 and err == [], err
        return
    assert code == 2 and err == [f"fastfair: error: {path} was saved with pickle protocol 4, which torch's safe loader "
                                 f"(weights_only=True) cannot read, and fastfair unpickles nothing; save it again "
                                 f"with torch.save's default protocol: torch.save(torch.load(\"{path}\", "
                                 f"weights_only=False), \"NEW.pt\") for a file you trust"], err


@pytest.mark.parametrize("protocol", [3, 4])
def test_a_checkpoint_saved_again_with_another_pickle_protocol_loads_or_is_one_line(protocol, tmp_path):
    """The same for fastfair's own checkpoints (rundir.load_checkpoint: resume, eval, report, init_from, teacher)."""
    path = tmp_path / "best.pt"
    torch.save({"epoch": 1, "model": {"w": torch.ones(2)}, "spec": {}, "config": ""}, path, pickle_protocol=protocol)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if protocol == 3:
            assert rundir.load_checkpoint(path)["model"]["w"].tolist() == [1.0, 1.0]
            return
        with pytest.raises(UserError, match="saved with pickle protocol 4, which torch's safe loader"):
            rundir.load_checkpoint(path)


def test_no_warning_leaks_from_train_resume_and_eval(tmp_path, capsys):
    """A tiny run, its resume and its evaluation with every warning an error: fastfair's own are its lines, not
    Python warnings, and torch's (its loader's pickle-protocol notice among them) are not the user's news."""
    out = tmp_path / "run"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.main([*TRAIN, "--epochs", "1", "--out", str(out)]) == 0
        assert cli.main([*TRAIN, "--out", str(out), "--resume"]) == 0
        assert cli.main(["eval", str(out), "--attacks", "clean,fgsm", "--quiet"]) == 0
    assert [m["epoch"] for m in RunDir(out).read_metrics()] == [1, 2]
