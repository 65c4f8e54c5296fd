"""fastfair tune's budgets (:func:`fastfair.tuning.study.spent`) on fake trials: what a trial, an epoch and a second of
the equal budget are when trials are pruned, fail, run, wait or are retried after their worker died."""
from datetime import datetime, timezone
from types import SimpleNamespace

from fastfair.tuning import study
from fastfair.tuning.study import Settings, spent

EPOCHS = 8


def _trial(number, state, *, retry_of=(), start=None, end=None, **user_attrs):
    """A trial as Optuna's storage returns it; ``retry_of`` the trials it re-runs, oldest first (Optuna's
    ``retry_history``, its ``failed_trial`` the first)."""
    system = {"failed_trial": retry_of[0], "retry_history": list(retry_of)} if retry_of else {}
    stamp = (lambda s: None if s is None else datetime.fromtimestamp(s, tz=timezone.utc))
    return SimpleNamespace(number=number, state=SimpleNamespace(name=state), system_attrs=system,
                           user_attrs=user_attrs, datetime_start=stamp(start), datetime_complete=stamp(end))


def _budget(kind: str) -> Settings:
    return Settings("s", ("trades",), kind, 100)


def test_the_epochs_budget_counts_a_pruned_trial_s_trained_epochs_and_a_waiting_one_not_at_all():
    trials = [_trial(0, "COMPLETE"), _trial(1, "PRUNED", pruned_at=3), _trial(2, "RUNNING"), _trial(3, "WAITING")]
    assert spent(_budget("epochs"), trials, EPOCHS) == 8 + 3 + 8  # a running trial holds its whole epochs


def test_the_epochs_budget_counts_a_failed_trial_s_trained_epochs():
    trials = [_trial(0, "COMPLETE"), _trial(1, "FAIL", curve=[[10, 2], [11, 3]])]  # crashed in its third epoch
    assert spent(_budget("epochs"), trials, EPOCHS) == 8 + 2


def test_a_trial_retried_twice_counts_once_in_every_budget():
    # trial 1's worker died; its retry 2 died too; retry 3 (of 1, after 2) finished in trial 1's run folder
    trials = [_trial(0, "COMPLETE", start=0, end=10), _trial(1, "FAIL", start=10, end=500),
              _trial(2, "FAIL", retry_of=(1,), start=500, end=900),
              _trial(3, "COMPLETE", retry_of=(1, 2), start=900, end=920)]
    assert spent(_budget("trials"), trials, EPOCHS) == 2
    assert spent(_budget("epochs"), trials, EPOCHS) == 2 * 8
    assert spent(_budget("time"), trials, EPOCHS) == 10 + 20


def test_the_time_budget_is_the_trials_wall_time_and_a_running_trial_s_time_so_far(monkeypatch):
    monkeypatch.setattr(study.time, "time", lambda: 1000.0)
    trials = [_trial(0, "COMPLETE", start=0, end=30), _trial(1, "PRUNED", start=30, end=40),
              _trial(2, "RUNNING", start=900), _trial(3, "WAITING")]
    assert spent(_budget("time"), trials, EPOCHS) == 30 + 10 + 100


def test_a_time_budget_is_the_study_s_wall_time_split_equally_between_its_contenders():
    settings = study._settings("trades,mart", None, None, None, [], None, None, None, "2h", None, None, 0, 0)
    assert (settings.budget, settings.amount) == ("time", 3600)
