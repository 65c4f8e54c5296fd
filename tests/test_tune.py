"""fastfair tune: the study's checks before anything runs, the early-stop rule, and (slow) whole studies: workers on
one storage, a kill and a re-run, the final front evaluated once on the test set."""
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from fastfair import cli
from fastfair.tuning import study as tuning
from fastfair.tuning.study import Settings, hopeless, running
from helpers import fastfair, needs_extra
from shared_runs import trials_in_process

optuna = needs_extra("tune", "optuna")

ROOT = Path(__file__).parents[1]
# trials of seconds: the demo digits, a 4-channel CNN, one attack step, FGSM validation, one epoch, 10 images a class
TINY = ["--config", "demo", "--quick", "10", "--set", "model.width=4", "--set", "attack.steps=1",
        "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean','fgsm']", "--set", "data.batch_size=50",
        "--set", "train.epochs=1", "--quiet"]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _tune(monkeypatch, *args) -> subprocess.CompletedProcess:
    """``fastfair tune ARGS`` in this process (a process of its own costs ~7 CPU s; the trials and the second worker
    are processes of their own anyway, found by PYTHONPATH): its exit code, what it printed, and the warnings it
    raised or Optuna logged, in ``.warned``."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    warned = []
    optuna_log = logging.getLogger("optuna")  # Optuna's logger does not propagate to pytest's
    handler = logging.Handler(logging.WARNING)
    handler.emit = warned.append
    optuna_log.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # what fastfair itself silences stays silenced: its filters come first
            done = fastfair("tune", *args)
    finally:
        optuna_log.removeHandler(handler)
    done.warned = [str(w.message) for w in caught] + [r.getMessage() for r in warned]
    return done


def _error(capsys, *args) -> str:
    assert cli.main(["tune", *map(str, args)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    return err[0]


def _completed(storage: str, name: str) -> set:
    study = optuna.load_study(study_name=name, storage=storage)
    return {(tuple(sorted(t.params.items())), tuple(t.values))
            for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}


# ---- refused before anything runs ------------------------------------------------------------------------

def test_bad_inputs_are_one_line_before_any_folder_is_made(tmp_path, capsys):
    out = tmp_path / "s"
    assert "unknown method 'nope'" in _error(capsys, "--methods", "nope", "--out", out)
    assert "trades+ccm+ccm" in _error(capsys, "--methods", "trades+ccm+ccm", "--out", out)
    assert "rule" in _error(capsys, "--methods", "trades", "--rule", "best", "--out", out)
    assert "--trials takes a positive number" in _error(capsys, "--methods", "trades", "--trials", 0, "--out", out)
    assert "--time-budget" in _error(capsys, "--methods", "trades", "--time-budget", "soon", "--out", out)
    assert "--gpus takes" in _error(capsys, "--methods", "trades", "--gpus", "first", "--out", out)
    assert "one budget" in _error(capsys, "--methods", "trades", "--trials", 2, "--epochs-budget", 4, "--out", out)
    space = tmp_path / "space.toml"
    space.write_text('[space."method.kl_weight"]\nlow = 10\nhigh = 1\n')
    assert "space.toml" in _error(capsys, "--methods", "trades", "--space", space, "--out", out, *TINY)
    space.write_text('[space."ccm.lambda_1"]\nlow = 0.1\nhigh = 1\n')  # trades alone ignores CCM
    assert "ccm.lambda_1" in _error(capsys, "--methods", "trades", "--space", space, "--out", out, *TINY)
    assert "validation split" in _error(capsys, "--methods", "trades", "--out", out, *TINY,
                                        "--set", "train.select_split=test")
    assert "no robust attack" in _error(capsys, "--methods", "trades", "--out", out, *TINY,
                                        "--set", "eval.attacks=['clean']")
    assert not out.exists()


def test_the_python_api_checks_what_the_command_checks(tmp_path):
    import fastfair

    with pytest.raises(fastfair.UserError, match="no option 'trial'. Did you mean trials?"):
        fastfair.tune("trades", trial=3)
    with pytest.raises(fastfair.UserError, match="unknown method 'nope'"):  # a list is the comma-separated contenders
        fastfair.tune(["trades", "nope"], out=tmp_path / "s")
    with pytest.raises(fastfair.UserError, match="--trials takes a positive number"):
        fastfair.tune("trades", trials=0, out=tmp_path / "s")
    assert not (tmp_path / "s").exists()


def test_a_study_continued_with_other_settings_is_refused_naming_them(tmp_path, capsys):
    out = tmp_path / "s"
    out.mkdir()
    Settings("s", ("trades",), "trials", 3, "demo").write(out / "study.toml")
    said = _error(capsys, "--methods", "trades", "--trials", 4, "--config", "demo", "--out", out)
    assert "amount (3, now 4)" in said and f"fastfair tune {out}" in said
    assert "--methods" in _error(capsys, out, "--trials", 4)


def test_a_trial_is_hopeless_when_half_the_complete_trials_beat_it_at_that_epoch():
    assert not hopeless((10, 5), [(20, 9), (30, 8)])  # fewer than 3 complete trials judge nothing
    assert hopeless((10, 5), [(20, 9), (30, 8), (5, 1)])  # 2 of 3 dominate it
    assert not hopeless((10, 5), [(20, 9), (5, 8), (5, 1), (9, 9)])  # 1 of 4: not half
    assert hopeless((10, 5), [(20, 9), (10, 6), (5, 1), (9, 9)])  # 2 of 4 (an equal avg, a better worst, counts)
    assert not hopeless((10, 5), [(10, 5)] * 4)  # an equal point does not beat it


def test_trials_are_compared_on_their_running_means_up_to_the_epoch():
    curve = [[10, 0], [20, 10], [60, 50]]
    assert running(curve, 2) == (15, 5) and running(curve, 3) == (30, 20)
    # one lucky epoch of a small validation split does not save a trial the others beat all along, nor sink one
    others = [running(c, 2) for c in ([[30, 20], [31, 21]], [[29, 19], [30, 20]], [[5, 5], [5, 5]])]
    lucky, unlucky = [[10, 5], [40, 30]], [[40, 30], [20, 15]]
    assert not hopeless(tuple(lucky[-1]), others) and hopeless(running(lucky, 2), others)
    assert hopeless(tuple(unlucky[-1]), others) and not hopeless(running(unlucky, 2), others)


def test_prune_after_and_at_avg_are_checked(capsys):
    assert "--prune-after takes an epoch" in _error(capsys, "--methods", "trades", "--prune-after", 0)
    assert "--at-avg takes an average accuracy" in _error(capsys, "--methods", "trades", "--at-avg", 120)
    assert "--no-prune" in _error(capsys, "--methods", "trades", "--prune-after", 2, "--no-prune")


# ---- whole studies (slow: each trial is a training in its own process) -------------------------------------

@pytest.mark.slow
@pytest.mark.fault
def test_two_methods_two_workers_on_sqlite_then_the_front_alone_on_the_test_set(tmp_path, monkeypatch):
    out = tmp_path / "s"
    trials_in_process(monkeypatch)  # this worker's trials; the second worker is a process, with its trials its own
    in_process = tuning.run_job

    def after_the_other_worker_claims(job, *args, **kw):
        # a trial here takes a second, the second worker's start several: this worker's trades trial waits for the
        # second worker's claim on mart's, as the trial's own process outlasted that start
        deadline = time.time() + 300
        while not (out / "claims" / "mart" / "0").is_file() and time.time() < deadline:
            time.sleep(0.1)
        return in_process(job, *args, **kw)

    monkeypatch.setattr(tuning, "run_job", after_the_other_worker_claims)
    # a trial each: the second worker, once started, finds the first contender's trial taken and takes the other's
    done = _tune(monkeypatch, "--methods", "trades,mart", "--trials", 1, "--workers", 2, "--out", out, *TINY)
    assert done.returncode == 0, done.stderr
    assert (out / "study.db").is_file() and (out / "fronts.png").stat().st_size > 10_000
    text = (out / "comparison.md").read_text()
    assert "## trades\n" in text and "## mart\n" in text
    storage = f"sqlite:///{out / 'study.db'}"
    for label in ("trades", "mart"):
        study = optuna.load_study(study_name=f"s:{label}", storage=storage)
        trials = study.get_trials()
        runs = [t.user_attrs["run"] for t in trials]
        assert len(trials) == 1 and len(set(runs)) == 1  # two workers never took one trial, nor asked for more
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
        tested = {n for n in (0,) if (out / "trials" / label / f"{n:04d}" / "tune-test.json").is_file()}
        assert tested == {int(k.split("/")[1]) for k in study.user_attrs}  # recorded where written
        # only the front's points saw the test set: the others have no test record and no test evaluation
        assert tested and not list(out.glob(f"trials/{label}/*/eval/*-test.json"))
        assert study.metric_names == ["val avg (fgsm)", "val worst (fgsm)"]
    assert "## Worst class at a common average" in text and "validation split: 100 images (10 a class)" in text
    shown = _tune(monkeypatch, out, "--show")  # from the storage, at any time
    assert shown.returncode == 0 and "picks:" in shown.stdout and "mart" in shown.stdout, shown.stderr
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("trials/*/*/tune-test.json")}
    again = _tune(monkeypatch, out, "--quiet")
    assert again.returncode == 0, again.stderr
    assert {p: p.stat().st_mtime_ns for p in out.glob("trials/*/*/tune-test.json")} == stamps  # not again


@pytest.mark.slow
@pytest.mark.fault
def test_a_worker_killed_mid_trial_and_run_again_gives_the_uninterrupted_trials_on_journal_storage(tmp_path,
                                                                                                    monkeypatch):
    # two trials: the first finishes, the second is killed as it starts (both of the sampler's seeded random start)
    whole = tmp_path / "whole"
    trials_in_process(monkeypatch)  # the uninterrupted study and the re-run; the killed worker is a real process
    done = _tune(monkeypatch, "--methods", "trades", "--trials", 2, "--seed", 7, "--out", whole,
                 "--storage", f"journal:{tmp_path / 'whole.log'}", *TINY)
    assert done.returncode == 0, done.stderr
    cut = tmp_path / "cut"
    args = ["--methods", "trades", "--trials", 2, "--seed", 7, "--out", cut, "--storage",
            f"journal:{tmp_path / 'cut.log'}", *TINY]
    proc = subprocess.Popen([sys.executable, "-m", "fastfair", "tune", *map(str, args)], env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    second = cut / "trials" / "trades" / "0001" / "config.toml"
    while not second.is_file() and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)  # the worker's process, with its claim and its trial's child (which dies with it)
    proc.wait()
    again = _tune(monkeypatch, *args)  # the same command again, on the same journal
    assert again.returncode == 0, again.stderr
    cut_trials = _completed(
        optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "cut.log"))),
        "cut:trades")
    whole_trials = _completed(
        optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "whole.log"))),
        "whole:trades")
    assert cut_trials == whole_trials and len(whole_trials) == 2
    retried = optuna.load_study(study_name="cut:trades", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "cut.log")))).get_trials()
    assert [t.state.name for t in retried].count("FAIL") == 1  # the killed trial, re-queued and resumed
    assert "Warning" not in again.stderr and not again.warned  # none of Optuna's either
