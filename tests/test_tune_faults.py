"""fastfair tune under what stops a trial: the early stop of a hopeless trial while it trains, a full disk under a
trial, and Optuna missing."""
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastfair import cli
from fastfair.rundir import RunDir, load_checkpoint
from fastfair.scaleout.jobs import read_state
from fastfair.tuning import study as tuning
from helpers import fastfair, jobs_in_process, needs_extra

optuna = needs_extra("tune", "optuna")

ROOT = Path(__file__).parents[1]
# tests/test_tune.py's TINY trials, with 20 epochs so a trial stopped after its first is far from its end whatever the
# load (a poll every 0.5 s), and the progress lines shown
TINY = ["--config", "demo", "--quick", "10", "--set", "model.width=4", "--set", "attack.steps=1",
        "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean','fgsm']", "--set", "data.batch_size=50"]
KL = optuna.distributions.FloatDistribution(1.0, 15.0, log=True)  # trades' declared method.kl_weight range


def _tune(monkeypatch, *args, env=None) -> subprocess.CompletedProcess:
    """``fastfair tune ARGS`` in this process (a process of its own costs ~7 CPU s), its trials in processes of their
    own as always, with ``env`` (and PYTHONPATH, to find this fastfair) in their environment."""
    for name, value in {"PYTHONPATH": str(ROOT), **(env or {})}.items():
        monkeypatch.setenv(name, value)
    return fastfair("tune", *args)


def _perfect_trials(storage: str, name: str, epochs: int) -> None:
    """Three complete trials at 100 % average and worst-class accuracy every epoch, tested already: beside them any
    real trial of the demo is hopeless from its first epoch on, so the rule's verdict does not hang on a training's
    numbers (which differ between CPUs) or on the sampler's draws."""
    study = optuna.create_study(storage=storage, study_name=name, directions=["maximize", "maximize"])
    for n, kl in enumerate((2.0, 6.0, 12.0)):
        study.add_trial(optuna.trial.create_trial(
            params={"method.kl_weight": kl}, distributions={"method.kl_weight": KL}, values=[100.0, 100.0],
            user_attrs={"curve": [[100.0, 100.0]] * epochs, "run_number": n, "run": f"elsewhere/{n}",
                        "val": {"avg": 100.0, "worst": 100.0, "clean": 100.0}}))
        study.set_user_attr(f"test/{n:04d}", {"clean": 100.0, "attacks": {"fgsm": {"avg": 99.0, "worst": 98.0}}})


@pytest.mark.slow
def test_a_hopeless_trial_is_stopped_while_it_trains_and_its_run_folder_can_resume(tmp_path, monkeypatch):
    out = tmp_path / "s"
    out.mkdir()
    _perfect_trials(f"sqlite:///{out / 'study.db'}", "s:trades", 20)
    done = _tune(monkeypatch, "--methods", "trades", "--trials", 4, "--prune-after", 1, "--out", out, *TINY,
                 "--set", "train.epochs=20")
    assert done.returncode == 0, done.stderr
    (trial,) = [t for t in optuna.load_study(study_name="s:trades", storage=f"sqlite:///{out / 'study.db'}")
                .get_trials() if t.number == 3]
    assert trial.state == optuna.trial.TrialState.PRUNED
    epoch = trial.user_attrs["pruned_at"]
    assert 1 <= epoch < 20 and "trades #3 method.kl_weight=" in done.stdout
    assert f": pruned at epoch {epoch}  [3 done, 0 running, 1 pruned, 0 failed" in done.stdout
    run = RunDir(out / "trials" / "trades" / "0003")
    state = read_state(run.path)
    assert state["status"] == "interrupted" and state["returncode"] == 143  # stopped by SIGTERM, saved
    trained = len(run.read_metrics())
    assert epoch <= trained < 20 and load_checkpoint(run.checkpoints / "last.pt", needs=("epoch",))["epoch"] == trained
    assert f"continue with: fastfair train --out {run.path} --resume" in run.train_log.read_text()
    assert trial.user_attrs["curve"] == [
        [r["val"]["fgsm"]["avg"], r["val"]["fgsm"]["worst"]] for r in run.read_metrics()]


def _full_disk(monkeypatch) -> None:
    """The full disk of tests/test_reliability.py's fail_writes: rundir's lowest layer refuses every write under
    $FULL_UNDER (a part of a path), while it is set."""
    from fastfair import rundir

    open_ = rundir._open

    def _open(path, mode):
        if os.environ.get("FULL_UNDER") and os.environ["FULL_UNDER"] in str(path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return open_(path, mode)

    monkeypatch.setattr(rundir, "_open", _open)


@pytest.mark.slow
@pytest.mark.fault
def test_a_full_disk_under_a_trial_stops_the_study_in_one_line_and_the_rerun_resumes_the_trial(tmp_path,
                                                                                                 monkeypatch):
    # the trial in this process (what the study does with its error line, not its process), on a full disk
    jobs_in_process(monkeypatch, tuning)
    _full_disk(monkeypatch)
    out = tmp_path / "s"
    args = ["--methods", "trades", "--trials", 1, "--out", out, *TINY, "--set", "train.epochs=1", "--quiet"]
    full = _tune(monkeypatch, *args, env={"FULL_UNDER": str(out / "trials" / "trades" / "0000" / "checkpoints")})
    assert full.returncode == 74, full.stderr
    (line,) = full.stderr.strip().splitlines()
    assert line.startswith("fastfair: error: trial trades #0 stopped: cannot write ") and "no space left" in line
    assert line.endswith(f"free some space, then continue with: fastfair tune {out}")
    storage = f"sqlite:///{out / 'study.db'}"
    trials = optuna.load_study(study_name="s:trades", storage=storage).get_trials()
    # neither a result nor a failure: the trial waits for the re-run, which resumes it
    assert [t.state.name for t in trials] == ["RUNNING"]
    assert read_state(out / "trials" / "trades" / "0000")["returncode"] == 74
    monkeypatch.delenv("FULL_UNDER")  # the disk has room again
    again = _tune(monkeypatch, out, "--quiet")
    assert again.returncode == 0, again.stderr
    trials = optuna.load_study(study_name="s:trades", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].params == trials[0].params and trials[1].user_attrs["run_number"] == 0
    state = read_state(out / "trials" / "trades" / "0000")
    assert state["status"] == "done" and state["attempt"] == 2 and "--resume" in state["command"]


def test_without_optuna_the_command_is_one_line_naming_the_extra_before_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "optuna", None)  # what `import optuna` meets where it is not installed
    out = tmp_path / "s"
    for args in (["--methods", "trades", "--out", out, *TINY], [out, "--show"]):
        assert cli.main(["tune", *map(str, args)]) == 2
        assert capsys.readouterr().err == "fastfair: error: fastfair tune needs Optuna: pip install 'fastfair[tune]'\n"
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.fault
def test_sigterm_to_a_study_saves_its_trial_at_a_step_and_the_rerun_resumes_it_counted_once(tmp_path, monkeypatch):
    out = tmp_path / "s"
    args = ["--methods", "trades", "--trials", 1, "--out", out, *TINY, "--set", "train.epochs=4", "--quiet"]
    proc = subprocess.Popen([sys.executable, "-m", "fastfair", "tune", *map(str, args)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    run = RunDir(out / "trials" / "trades" / "0000")
    while proc.poll() is None and not (run.metrics.is_file() and run.metrics.read_text().strip()):
        time.sleep(0.1)  # until the trial has trained an epoch: the signal then lands in training
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    assert err == ("fastfair: interrupted by SIGTERM; the study's runs stopped with it; run the same command again to "
                   "go on (finished runs are skipped, interrupted ones resume)\n")
    storage = f"sqlite:///{out / 'study.db'}"
    assert [t.state.name for t in optuna.load_study(study_name="s:trades", storage=storage).get_trials()] == [
        "RUNNING"]  # neither a result nor a failure
    assert read_state(run.path)["status"] == "interrupted"  # the trial's train saved where the signal found it
    jobs_in_process(monkeypatch, tuning)  # the re-run's trial in this process: the signal above was the processes'
    again = _tune(monkeypatch, out, "--quiet")
    assert again.returncode == 0, again.stderr
    trials = optuna.load_study(study_name="s:trades", storage=storage).get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"] and trials[1].user_attrs["run_number"] == 0
    state = read_state(run.path)
    assert state["status"] == "done" and state["attempt"] == 2 and "--resume" in state["command"]
    assert [r["epoch"] for r in run.read_metrics()] == [1, 2, 3, 4]  # resumed, no epoch trained twice
