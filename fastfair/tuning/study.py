"""``fastfair tune``: each contender's front of average vs worst-class robust accuracy, found by Optuna at an equal
budget (docs/tune.md).

A study folder holds::

    STUDY/study.toml                       the settings (``# sha256:`` line); a re-run with others is refused
    STUDY/study.db                         Optuna's storage (default; ``--storage URL`` or ``journal:PATH`` instead)
    STUDY/trials/<contender>/<NNNN>/       one ordinary run folder per trial (train/eval/report work on it)
    STUDY/trials/<contender>/<NNNN>/tune-test.json   the test-set result of a trial on the final front
    STUDY/claims/<contender>/<number>      held (flock) by the worker running that trial
    STUDY/comparison.md, STUDY/fronts.png  the comparison (fastfair.tuning.front)

One Optuna study per contender (``<study>:<contender>``) in the one storage. A trial is ``fastfair train`` in a
child process (:func:`fastfair.scaleout.jobs.run_job`, as a grid run) with ``eval.split = val``, so no trial sees
the test set; its objectives are the validation average and worst-class accuracy under ``train.val_attack`` of the
checkpoint the run selects (``train.select``; the averaged model's where EMA/FAWA averaged one). Only the final
front is evaluated on the test set, once.

A worker that dies (kill -9, a lost node) leaves its trial RUNNING with its claim file unheld: the next worker to
look marks it failed and re-queues its parameters (Optuna's RetryHeartbeatStaleTrialCallback); the retry trains in
the same run folder with ``--resume``, so nothing is trained twice and the budget counts the trial once. A flock
rather than Optuna's heartbeat: it works on the journal storage too (which keeps no heartbeats)
and needs no grace period.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from fastfair import config
from fastfair.errors import UserError, WriteError
from fastfair.rundir import (RunDir, free_space, load_checkpoint, read_json, read_toml, write_json_atomic,
                             write_text_atomic, write_toml)
from fastfair.scaleout.grid import Grid, toml_value, check_data, prepare
from fastfair.scaleout.jobs import Job, read_state, run_job, stop_children
from fastfair.scaleout.launchers import parse_gpus, slot_envs
from fastfair.methods import METHODS
from fastfair.suggest import hint
from fastfair.tuning.front import (comparison_markdown, comparison_text, draw_fronts, images_of_counts,
                                   paper_points, pareto, parse_rule, summarize)
from fastfair.tuning.scoring import test_record
from fastfair.tuning.space import FLAGS, default_space, describe, load_space, suggest

BUDGETS = ("trials", "epochs", "time")
POLL_S = 0.5  # how often a worker reads its trial's metrics.jsonl and looks for others' dead trials
# --prune-after's default: judge a trial from half of its epochs on, when the rate and the per-class vectors of the
# fair-AT methods have acted (DAFA's warm-up, CFA's calibration); earlier epochs rank trials by noise
PRUNE_HALF = -1
UNCLAIMED_S = 60.0  # a RUNNING trial with no claim file this long after it began lost its worker before claiming it


def _optuna():
    try:
        import optuna
    except ImportError:
        raise UserError("fastfair tune needs Optuna: pip install 'fastfair[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@dataclass(frozen=True)
class Contender:
    """A method and the train flags it adds: ``trades+ccm+ccr+fawa`` (CFA-TRADES)."""

    label: str
    method: str
    flags: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> Contender:
        method, *flags = text.strip().split("+")
        try:
            METHODS.get(method)
        except UserError as err:  # the registry's message: its did-you-mean and the known methods
            raise UserError(f"--methods: {err}") from None
        bad = [f for f in flags if f not in FLAGS]
        if bad or len(set(flags)) != len(flags) or {"ema", "fawa"} <= set(flags):
            raise UserError(f"--methods: {text!r}: after '+' come train's fairness flags, each once "
                            f"({', '.join(FLAGS)}; ema or fawa), e.g. trades+ccm+ccr+fawa."
                            f"{hint(bad[0], FLAGS) if bad else ''}")
        return cls(text.strip(), method, tuple(flags))

    def sets(self) -> dict[str, Any]:
        return {"method.name": self.method, **{k: v for f in self.flags for k, v in FLAGS[f].items()}}


@dataclass(frozen=True)
class Settings:
    """What makes a study (STUDY/study.toml); the rule, workers and output are views, free to change."""

    name: str
    methods: tuple[str, ...]
    budget: str  # trials | epochs | time
    amount: float  # trials, epochs or seconds per contender
    config: str = ""
    sets: tuple[str, ...] = ()  # KEY=VALUE for every trial (--data-dir and --quick among them)
    space: str = ""  # the --space file's TOML text
    storage: str = ""
    seed: int = 0
    prune_after: int = 0  # 0: no early stop; PRUNE_HALF: from half of the trial's epochs on

    def contenders(self) -> list[Contender]:
        return [Contender.parse(m) for m in self.methods]

    def write(self, path: Path) -> None:
        import tomli_w

        text = tomli_w.dumps({k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()})
        write_toml(text, path)

    @classmethod
    def read(cls, path: Path) -> Settings:
        saved = config.tomllib.loads(read_toml(path))
        return cls(**{f.name: tuple(saved[f.name]) if isinstance(saved[f.name], list) else saved[f.name]
                      for f in fields(cls) if f.name in saved})

    def differs(self, other: Settings) -> list[str]:
        return [f"{f.name} ({getattr(other, f.name)!r}, now {getattr(self, f.name)!r})" for f in fields(self)
                if getattr(self, f.name) != getattr(other, f.name)]


def parse_time(text: str) -> float:
    """``90m``, ``2h``, ``1.5h``, ``600s`` or seconds -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        seconds = -1
    if not seconds > 0 or not math.isfinite(seconds):
        raise UserError(f"--time-budget takes a positive duration such as 90m or 2h; got {text!r}")
    return seconds


# ---- the study folder and its storage ------------------------------------------------------------
@dataclass(frozen=True)
class Study:
    root: Path
    settings: Settings
    space_file: Path | None = None  # the --space file of a new study; STUDY/space.toml, its copy, later

    def storage_url(self) -> str:
        return self.settings.storage or f"sqlite:///{(self.root / 'study.db').resolve()}"

    def storage(self):
        optuna = _optuna()
        url = self.storage_url()
        if url.startswith("journal:"):
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(url.removeprefix("journal:")))
        # SQLite: several worker processes write one file; wait for its lock rather than fail at once
        kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
        # one process at a time makes the storage's tables: two starting a new study at once both created them, and
        # the second failed on a duplicate alembic_version row (an IntegrityError of 90 lines)
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".storage.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)

    @contextlib.contextmanager
    def storage_errors(self):
        """The storage failing (SQLAlchemy's errors: a damaged, full or failing study.db) as one line naming the file
        and what to do, where it was 100 lines of SQLAlchemy's traceback."""
        try:
            yield
        except Exception as err:
            exc = sys.modules.get("sqlalchemy.exc")
            # Optuna raises some of them as its StorageInternalError, over SQLAlchemy's
            cause = next((e for e in (err, err.__cause__) if exc and isinstance(e, exc.SQLAlchemyError)), None)
            if cause is None:
                raise
            raise self._storage_error(str(getattr(cause, "orig", None) or cause).splitlines()[0]) from None

    def _storage_error(self, why: str) -> UserError:
        url = self.storage_url()
        db = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite:///") else None
        where = str(db) if db else url
        low = why.lower()
        if db and ("full" in low or "i/o" in low):
            return WriteError(f"cannot write {db}: {'no space left on the device' if 'full' in low else why} "
                              f"({free_space(db)}); the study's finished trials are kept in it; "
                              f"{'free some space' if 'full' in low else 'fix the disk'}")
        if "not a database" in low or "malformed" in low:
            return UserError(f"{where} is damaged ({why}): Optuna cannot read the study from it; restore it from a "
                             "copy (SQLite keeps no backup of its own), or start the study again in another folder "
                             "(--out); a study on --storage journal:FILE, an append-only log, loses at most its last "
                             "line to a torn write")
        return UserError(f"the study's storage {where} failed: {why}")

    def optuna_study(self, contender: Contender, storage, sampler=None):
        """The contender's Optuna study, its objectives named (``metric_names``: what optuna-dashboard and
        ``trials_dataframe`` show)."""
        optuna = _optuna()
        ostudy = optuna.create_study(storage=storage, sampler=sampler, load_if_exists=True,
                                     study_name=f"{self.settings.name}:{contender.label}",
                                     directions=["maximize", "maximize"])
        if ostudy.metric_names is None:
            attack = self.trial_config(contender).train.val_attack
            with warnings.catch_warnings():  # experimental in Optuna since 3.2
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                ostudy.set_metric_names([f"val avg ({attack})", f"val worst ({attack})"])
        return ostudy

    def trial_config(self, contender: Contender) -> config.Config:
        """The config every trial of ``contender`` shares (its sampled keys at their defaults)."""
        return config.resolve(self.settings.config or None, None,
                              [f"{k}={toml_value(v)}" for k, v in self.base_sets(contender).items()])

    def run_dir(self, contender: Contender, number: int) -> Path:
        return self.root / "trials" / contender.label / f"{number:04d}"

    def claim(self, contender: Contender, number: int) -> Path:
        return self.root / "claims" / contender.label / str(number)

    def spaces(self) -> dict[str, dict]:
        out = {}
        for c in self.settings.contenders():
            if self.space_file:
                out[c.label] = load_space(self.space_file, c.method, c.flags)
            else:
                out[c.label] = default_space(c.method, c.flags)
        return out

    def base_sets(self, contender: Contender) -> dict[str, Any]:
        """Every trial's keys but the sampled ones: --set, the contender's, and the validation split's final
        evaluation (the test set is for the final front alone)."""
        return {**config.parse_set(list(self.settings.sets)), **contender.sets(), "eval.split": "val"}

    def job(self, contender: Contender, number: int, params: dict[str, Any]) -> tuple[Job, config.Config]:
        sets = {**self.base_sets(contender), **params}
        job, cfg, changed = prepare(f"{contender.label}/{number:04d}", self.settings.config, sets,
                                    self.run_dir(contender, number))
        if changed:
            raise UserError(f"trial {contender.label}/{number:04d} was started with other keys ({changed})")
        return job, cfg


def open_study(root: Path, given: Settings | None, space_file: str | None) -> Study:
    """The study in ``root``: made with ``given``, or continued (``given`` None, or the same settings); other
    settings for a study that exists are one error naming what differs."""
    toml = root / "study.toml"
    if toml.is_file():
        saved = Settings.read(toml)
        if given is not None:
            differs = given.differs(saved)
            if differs:
                raise UserError(f"{root} is a study made with other settings: {'; '.join(differs)}. Run "
                                f"`fastfair tune {root}` to continue it, or give another --out for a new study")
        return Study(root, saved, root / "space.toml" if saved.space else None)
    if given is None:
        raise UserError(f"{root} holds no study (no study.toml); start one with fastfair tune --methods ... "
                        f"--out {root}")
    return Study(root, given, Path(space_file) if space_file else None)


def check(study: Study) -> dict[str, dict]:
    """Before any trial: each contender's space, and one point of it resolved, checked and its data split as
    training will (grid's checks); a config without a validation split is refused."""
    spaces = study.spaces()
    configs = {}
    for c in study.settings.contenders():
        point = {key: t.choices[0] if t.choices else t.low for key, t in spaces[c.label].items()}
        try:
            _, cfg, _ = prepare(c.label, study.settings.config, {**study.base_sets(c), **point},
                                study.root / ".check")
        except UserError as err:
            raise UserError(f"contender {c.label}: {err}") from None
        if cfg.train.select_split != "val":
            raise UserError(f"contender {c.label}: a study measures trials on the validation split, and with "
                            "train.select_split = test this config trains on it; set train.select_split = val")
        if not [a for a in cfg.eval.attacks if a != "clean"]:
            raise UserError(f"contender {c.label}: eval.attacks = {cfg.eval.attacks} has no robust attack to test "
                            "the final fronts with; add one, e.g. --set \"eval.attacks=['clean', 'pgd20']\"")
        configs[c.label] = cfg
    check_data(Grid(study.settings.name, study.settings.config, {}, []), configs)
    return spaces


# ---- budget -------------------------------------------------------------------------------------
def origin(trial) -> int:
    """The trial's own number, or the number of the trial a retry re-runs (the run folder's)."""
    return trial.system_attrs.get("failed_trial", trial.number)


def live_trials(trials) -> list:
    """The trials that count: a failed trial that was retried (the original, or a retry that failed again) counts as
    its last retry."""
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", ())}
    return [t for t in trials if not (t.state.name == "FAIL" and t.number in retried)]


def spent(settings: Settings, trials, epochs: int) -> float:
    """The budget a contender's trials used: trials (a retry is its original), epochs trained (a running trial
    counts its whole ``epochs``, a pruned or failed one the epochs it trained) or seconds of training (a retry's own:
    a dead worker's trial has no end Optuna knows, it is marked failed when found)."""
    counted = [t for t in live_trials(trials) if t.state.name != "WAITING"]
    if settings.budget == "trials":
        return len({origin(t) for t in counted})
    if settings.budget == "epochs":
        return sum(t.user_attrs["pruned_at"] if "pruned_at" in t.user_attrs else
                   len(t.user_attrs["curve"]) if t.state.name == "FAIL" and "curve" in t.user_attrs else epochs
                   for t in counted)
    now = time.time()
    return sum(((t.datetime_complete.timestamp() if t.datetime_complete else now) - t.datetime_start.timestamp())
               for t in counted if t.datetime_start)


# ---- early stop ----------------------------------------------------------------------------------
def running(curve: list[list[float]], epochs: int) -> tuple[float, float]:
    """The mean (avg, worst) over a curve's first ``epochs`` epochs: the running average the median stopping rule
    compares (Golovin et al. KDD 2017 Sec. 3.2.2), steadier than one epoch of a small validation split."""
    points = curve[:epochs]
    return (sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points))


def hopeless(point: tuple[float, float], others: list[tuple[float, float]]) -> bool:
    """Whether a trial's (avg, worst) up to an epoch (:func:`running`) is dominated by the same of at least half of
    the complete trials, when there are at least 3 (a median stopping rule, Golovin et al. KDD 2017 Sec. 3.2.2, on the
    Pareto order of the two objectives)."""
    if len(others) < 3:
        return False
    beaten = sum(a >= point[0] and w >= point[1] and (a, w) != tuple(point) for a, w in others)
    return 2 * beaten >= len(others)


def _curve(run: Path, attack: str) -> list[list[float]]:
    try:
        records = RunDir(run).read_metrics()
    except (UserError, OSError, ValueError):  # not there yet, or a line being written
        return []
    return [[r["val"][attack]["avg"], r["val"][attack]["worst"]] for r in records]


# ---- one trial ------------------------------------------------------------------------------------
def objectives(run: Path, cfg: config.Config) -> dict[str, Any]:
    """Validation avg and worst under train.val_attack of the checkpoint the run selects (the averaged model's when
    one exists), with their 95 % intervals from its per-class counts (:func:`fastfair.tuning.front.summarize`), the
    split's size and its clean validation accuracy, in percent."""
    rd = RunDir(run)
    averaged = rd.selected_checkpoint(cfg.train.select, averaged=True)
    path = averaged if averaged.is_file() else rd.selected_checkpoint(cfg.train.select)
    ck = load_checkpoint(path, needs=("epoch", "val_robust"))
    line = rd.read_metrics()[ck["epoch"] - 1]
    val = (line["average"] if averaged.is_file() else line)["val"]
    out = {"avg": float(ck["val_robust"]["avg"]), "worst": float(ck["val_robust"]["worst"]),
           "clean": float(val["clean"]["avg"]), "attack": cfg.train.val_attack}
    counts = val_counts(val[cfg.train.val_attack]["per_class"], cfg.data.val_per_class)
    if counts:
        present = [n for n in counts[1] if n]
        out.update(images=sum(present), per_class=[min(present), max(present)],
                   ci=summarize(*images_of_counts(*counts), len(counts[1]))["ci"])
    return out


def val_counts(per_class: list, images: int) -> tuple[list[int], list[int]] | None:
    """(correct, total) per class from a validation's per-class accuracies (%; None for an absent class) on
    ``images`` images a class (``data.val_per_class``: the split takes that many of every class); None where an
    accuracy is not a whole number of images (a split of another size)."""
    correct = [0 if a is None else a * images / 100.0 for a in per_class]
    if any(abs(k - round(k)) > 1e-6 for k in correct):
        return None
    return [round(k) for k in correct], [0 if a is None else images for a in per_class]


def _held(path: Path) -> bool:
    """Whether a process holds the flock on ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def reap(study: Study, contender: Contender, ostudy, echo) -> None:
    """Fail the RUNNING trials whose worker is gone (their claim unheld) and re-queue their parameters."""
    optuna = _optuna()
    for t in ostudy.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        claim = study.claim(contender, t.number)
        if _held(claim) or (not claim.is_file() and time.time() - t.datetime_start.timestamp() < UNCLAIMED_S):
            continue
        claim.parent.mkdir(parents=True, exist_ok=True)
        with open(claim, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # one reaper per trial
            except BlockingIOError:
                continue
            now = ostudy._storage.get_trial(t._trial_id)
            if now.state.name != "RUNNING":
                continue
            ostudy._storage.set_trial_state_values(t._trial_id, optuna.trial.TrialState.FAIL)
            with warnings.catch_warnings():  # experimental in Optuna, as the heartbeat it was made for
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                retry = optuna.storages.RetryHeartbeatStaleTrialCallback()
            retry(ostudy, ostudy._storage.get_trial(t._trial_id))
            echo(f"{contender.label} #{origin(t)}: its worker stopped or is gone; re-queued (it resumes in its run "
                 "folder)")


@contextlib.contextmanager
def claimed(claim: Path):
    """Hold ``claim`` for the trial's life; it appears already held (locked, then renamed into place), so no
    reaper ever sees it unheld while its worker lives."""
    claim.parent.mkdir(parents=True, exist_ok=True)
    temporary = claim.with_name(f".{claim.name}.{os.getpid()}")
    with open(temporary, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        os.replace(temporary, claim)
        yield


def _seed(settings: Settings, contender: Contender, asked: int) -> int:
    """The sampler's seed for the ``asked``-th trial: a function of the study's seed, the contender and how many
    trials came before, so a study resumed after a kill samples what the uninterrupted one would."""
    text = f"{settings.seed}:{contender.label}:{asked}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "little")


def sampler(settings: Settings, contender: Contender, asked: int, budget_trials: int):
    """Multi-objective TPE (Ozaki et al. GECCO 2020; multivariate: Falkner et al. ICML 2018): it models from the
    first trials on, where NSGA-II (Deb et al. 2002) needs generations of a population larger than the 8-100
    trials a study affords. The first quarter of the trials (at least 2; Optuna's 10 when the number of trials is
    not known, under a time budget) are random."""
    startup = max(2, min(10, int(budget_trials) // 4)) if budget_trials else 10
    return _optuna().samplers.TPESampler(multivariate=True, seed=_seed(settings, contender, asked),
                                         n_startup_trials=startup)


def run_trial(study: Study, contender: Contender, ostudy, trial, space: dict, echo, env: dict | None = None) -> str:
    """Train one asked trial in its run folder while watching its validation curve; tell Optuna how it ended."""
    optuna = _optuna()
    params = suggest(trial, space)
    number = trial.user_attrs.get("run_number", trial.number)
    trial.set_user_attr("run_number", number)
    job, cfg = study.job(contender, number, params)
    attack, epochs = cfg.train.val_attack, cfg.train.epochs
    trial.set_user_attr("run", job.run_dir)
    finished = [t.user_attrs["curve"] for t in ostudy.get_trials(deepcopy=False)
                if t.state.name == "COMPLETE" and "curve" in t.user_attrs]
    box: dict[str, str] = {}
    thread = threading.Thread(target=lambda: box.update(status=run_job(job, env)), daemon=True)
    thread.start()
    pruned_at = 0
    after = study.settings.prune_after
    after = max(1, epochs // 2) if after == PRUNE_HALF else after
    while thread.is_alive():
        thread.join(POLL_S)
        curve = _curve(Path(job.run_dir), attack)
        e = len(curve)
        if after and not pruned_at and after <= e < epochs:
            if hopeless(running(curve, e), [running(c, e) for c in finished if len(c) >= e]):
                pruned_at = e
                pid = read_state(job.run_dir).get("pid")
                if pid:
                    os.killpg(pid, signal.SIGTERM)  # a run saves at its next step boundary and survives
    status = box.get("status", "failed")
    state = read_state(job.run_dir)
    if status == "failed" and state.get("returncode") == WriteError.exit_code:
        # a full or failing disk fails every trial after this one alike: the study stops, writing nothing to its
        # storage (which may be on that disk); the trial, left RUNNING with its claim let go, is re-queued by the
        # next run's reaper and resumes in its run folder, counted once
        why = state.get("error", "").removeprefix("fastfair: error: ").partition(", then continue with:")[0]
        raise WriteError(f"trial {contender.label} #{number} stopped: {why}", f"continue with: fastfair tune "
                                                                             f"{study.root}")
    curve = _curve(Path(job.run_dir), attack)
    trial.set_user_attr("curve", curve)
    if pruned_at and status != "done":
        trial.set_user_attr("pruned_at", pruned_at)
        ostudy.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return "pruned"
    if status != "done":
        trial.set_user_attr("error", state.get("error", status))
        ostudy.tell(trial, state=optuna.trial.TrialState.FAIL)
        return "failed"
    val = objectives(Path(job.run_dir), cfg)
    trial.set_user_attr("val", val)
    ostudy.tell(trial, [val["avg"], val["worst"]])
    return "complete"


# ---- workers --------------------------------------------------------------------------------------
def _epochs(study: Study, contender: Contender) -> int:
    return study.trial_config(contender).train.epochs


def work(study: Study, spaces: dict[str, dict], echo=print, env: dict | None = None) -> None:
    """Take and train trials until every contender's budget is spent and no trial runs anywhere (a running one
    may yet fail and be re-queued)."""
    storage = study.storage()
    s = study.settings
    contenders = s.contenders()
    epochs = {c.label: _epochs(study, c) for c in contenders}
    # the trials a contender will get, for the sampler's random start; unknown under a time budget
    trials_budget = {"trials": s.amount, "epochs": s.amount // max(epochs.values()), "time": 0}[s.budget]
    started = time.time()
    while True:
        open_ = []
        running = False
        for c in contenders:
            ostudy = study.optuna_study(c, storage)
            reap(study, c, ostudy, echo)
            trials = ostudy.get_trials(deepcopy=False)
            waiting = any(t.state.name == "WAITING" for t in trials)
            used = spent(s, trials, epochs[c.label])
            running = running or any(t.state.name == "RUNNING" for t in trials)
            if waiting or used < s.amount:
                open_.append((0 if waiting else used / s.amount, c, len({origin(t) for t in live_trials(trials)})))
        if not open_:
            if not running:
                return
            time.sleep(POLL_S)
            continue
        _, c, asked = min(open_, key=lambda x: x[0])
        ostudy = study.optuna_study(c, storage, sampler(s, c, asked, trials_budget))
        trial = ostudy.ask()
        with claimed(study.claim(c, trial.number)):
            result = run_trial(study, c, ostudy, trial, spaces[c.label], echo, env)
        echo(progress_line(study, storage, c, trial.number, result, started))


def progress_line(study: Study, storage, contender: Contender, number: int, result: str, started: float) -> str:
    """One line per finished trial: what it was, how it did, the counts, the front's size and the time left."""
    ostudy = study.optuna_study(contender, storage)
    every = ostudy.get_trials(deepcopy=False)
    t = next(x for x in every if x.number == number)
    trials = live_trials(every)
    counts = {k: sum(x.state.name == k for x in trials) for k in ("COMPLETE", "RUNNING", "PRUNED", "FAIL")}
    front = pareto([r for r in records(study, storage) if r["contender"] == contender.label])
    params = " ".join(f"{k}={_short(v)}" for k, v in t.params.items())
    val = t.user_attrs.get("val")
    how = f"val avg {val['avg']:.1f} worst {val['worst']:.1f}" if val else result + (
        f" at epoch {t.user_attrs['pruned_at']}" if "pruned_at" in t.user_attrs else "")
    s = study.settings
    used = spent(s, every, _epochs(study, contender))
    done_share = min(1.0, used / s.amount)
    elapsed = time.time() - started
    left = f", ~{(elapsed / done_share - elapsed) / 60:.0f} min left" if 0 < done_share < 1 else ""
    return (f"{contender.label} #{t.user_attrs.get('run_number', number)} {params}: {how}  [{counts['COMPLETE']} done, "
            f"{counts['RUNNING']} running, {counts['PRUNED']} pruned, {counts['FAIL']} failed; front "
            f"{len(front)}{left}]")


def _short(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


# ---- records, the final front, the comparison ------------------------------------------------------------
STATES = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "RUNNING": "running"}


def records(study: Study, storage) -> list[dict]:
    """Every counted trial of every contender as fastfair.tuning.front's plain record."""
    out = []
    for c in study.settings.contenders():
        ostudy = study.optuna_study(c, storage)
        tested = ostudy.user_attrs
        for t in live_trials(ostudy.get_trials(deepcopy=False)):
            if t.state.name not in STATES:
                continue
            number = t.user_attrs.get("run_number", t.number)
            out.append({"contender": c.label, "number": number, "params": dict(t.params),
                        "state": STATES[t.state.name],
                        "val": t.user_attrs.get("val", {"avg": math.nan, "worst": math.nan, "clean": None}),
                        "test": _current(tested.get(_test_attr(number))), "run": t.user_attrs.get("run", "")})
    return out


def _test_attr(number: int) -> str:
    """The study attribute holding a front trial's test result: Optuna refuses to change a finished trial
    (``check_trial_is_updatable``), and a trial is known to be on the final front only after every trial finished."""
    return f"test/{number:04d}"


def _current(test: dict | None) -> dict | None:
    """A stored test record in :mod:`fastfair.tuning.front`'s form; one of an older fastfair (one attack's avg and
    worst, no intervals, no images) as far as it goes: its attack's two numbers."""
    if test is None or "attacks" in test:
        return test
    return {"clean": test.get("clean"), "attacks": {test["attack"]: {"avg": test["avg"], "worst": test["worst"]}},
            "older": True}


def test_attacks(cfg: config.Config) -> list[str]:
    """The attacks the final fronts are tested under: the validation's (the fronts' own axis), the first robust
    evaluation attack, and AutoAttack where ``eval.attacks`` asks for it."""
    robust = [a for a in cfg.eval.attacks if a != "clean"]
    return list(dict.fromkeys([cfg.train.val_attack, *robust[:1], *(["aa"] if "aa" in robust else [])]))


def evaluate_front(study: Study, storage, echo) -> None:
    """Evaluate each contender's front on the test set, once (:func:`fastfair.tuning.scoring.test_record`): a trial
    with a test record keeps it; one whose record an older fastfair wrote (no intervals, no images) is evaluated
    again, which the test set's role allows (it still chooses nothing)."""
    for c in study.settings.contenders():
        ostudy = study.optuna_study(c, storage)
        for rec in pareto([r for r in records(study, storage) if r["contender"] == c.label]):
            if rec["test"] is not None and not rec["test"].get("older"):
                continue
            run = RunDir(rec["run"])
            saved = run.path / "tune-test.json"
            test = read_json(saved)["test"] if saved.is_file() else None
            if test is None or "attacks" not in test:
                if test is not None:
                    echo(f"{c.label} #{rec['number']}: its test record predates intervals and per-image results; "
                         "testing it again")
                cfg = config.load_run(run.path)
                averaged = run.selected_checkpoint(cfg.train.select, averaged=True)
                ck = averaged if averaged.is_file() else run.selected_checkpoint(cfg.train.select)
                test = test_record(ck, test_attacks(cfg), cfg.train.device)
                write_json_atomic({"test": test, "checkpoint": str(ck)}, saved)
                echo(f"{c.label} #{rec['number']}: test " + ", ".join(
                    f"{a} avg {m['avg']:.1f} worst {m['worst']:.1f}" for a, m in test["attacks"].items()))
            ostudy.set_user_attr(_test_attr(rec["number"]), test)


def compare(study: Study, storage, rule_text: str, write: bool, at: float | None = None) -> str:
    """The comparison as terminal text (and, with ``write``, STUDY/comparison.md and STUDY/fronts.png); ``at``:
    the common average of the worst-class slice (default: :func:`fastfair.tuning.front.common_slice`'s)."""
    rule = parse_rule(rule_text)
    contenders = study.settings.contenders()
    by: dict[str, list[dict]] = {c.label: [] for c in contenders}
    for r in records(study, storage):
        by[r["contender"]].append(r)
    configs = {c.label: study.trial_config(c) for c in contenders}
    papers = {label: paper_points(label, cfg.data.dataset, cfg) for label, cfg in configs.items()}
    if write:
        write_text_atomic(comparison_markdown(by, rule, papers, at) + "\n", study.root / "comparison.md")
        draw_fronts(by, papers, study.root / "fronts.png", attack=configs[contenders[0].label].train.val_attack,
                    rule=rule)
    return comparison_text(by, rule, papers, at)


# ---- the command --------------------------------------------------------------------------------------
def tune(study_dir: str | None = None, *, methods: str | None = None, out: str | None = None,
         config_name: str | None = None, data_dir: str | None = None, sets: list[str] | None = None,
         quick: int | None = None, trials: int | None = None, epochs_budget: int | None = None,
         time_budget: str | None = None, space: str | None = None, storage: str | None = None, seed: int = 0,
         rule: str = "worst@avg-1", at_avg: float | None = None, workers: int = 1, gpus: str = "auto",
         prune_after: int | None = None, prune: bool = True, show: bool = False, worker: bool = False,
         quiet: bool = False, echo=print) -> Path:
    """``fastfair tune``: make or continue a study, work its trials (with ``workers`` processes), then evaluate
    the final fronts on the test set and write the comparison; returns the study folder. ``worker``: only work
    trials (SLURM arrays); ``show``: print the front and comparison from the storage; ``at_avg``: the common average
    of the comparison's worst-class slice."""
    say = (lambda *_: None) if quiet else echo
    _optuna()  # an optional dependency: missing, it is said before any check or folder
    parse_rule(rule)  # a bad rule is refused before anything runs
    if at_avg is not None and not 0 <= at_avg <= 100:
        raise UserError(f"--at-avg takes an average accuracy in percent, 0 to 100; got {at_avg:g}")
    if workers < 1:
        raise UserError(f"--workers takes a positive number; got {workers}")
    # K workers a GPU (or K on the CPU), as grid's --per-gpu: this process trains in the first slot
    envs = [{}] if worker else slot_envs(parse_gpus(gpus), workers)
    if prune_after is not None and (prune_after < 1 or not prune):
        raise UserError(f"--prune-after takes an epoch of 1 or more; got {prune_after}" if prune_after < 1 else
                        "--prune-after has nothing to do with --no-prune: give one of them")
    given = None
    if methods is not None:
        given = _settings(methods, out or study_dir, config_name, data_dir, sets or [], quick, trials, epochs_budget,
                          time_budget, space, storage, seed,
                          (PRUNE_HALF if prune_after is None else prune_after) if prune else 0)
    elif sets or any(v is not None for v in (config_name, data_dir, quick, trials, epochs_budget, time_budget, space,
                                     storage)):
        raise UserError("these options describe a new study: give --methods with them, or only STUDY to continue one")
    root = Path(out or study_dir or (f"runs/tune/{given.name}" if given else ""))
    if not str(root) or str(root) == ".":
        raise UserError("give --methods for a new study, or the study folder to continue or --show one")
    study = open_study(root, given, space)
    with study.storage_errors():
        return _tune(study, root, rule=rule, at_avg=at_avg, envs=envs, show=show, worker=worker, say=say, echo=echo)


def _tune(study: Study, root: Path, *, rule: str, at_avg: float | None, envs: list[dict],
          show: bool, worker: bool, say, echo) -> Path:
    """:func:`tune` once its study is open: show it, or work its trials, evaluate its fronts and compare."""
    if show:
        if not (root / "study.toml").is_file():
            raise UserError(f"{root} holds no study yet (no study.toml)")
        st = study.storage()
        echo(compare(study, st, rule, write=False, at=at_avg))
        return root
    spaces = check(study)
    if not worker:
        for label, sp in spaces.items():
            say(f"{label}: " + "; ".join(describe(sp)))
    if not (root / "study.toml").is_file():  # checked: the study begins
        root.mkdir(parents=True, exist_ok=True)
        if study.settings.space:
            write_toml(study.settings.space, root / "space.toml")
        study.settings.write(root / "study.toml")
    others = _spawn(root, envs[1:])
    try:
        work(study, spaces, say, envs[0])
    except BaseException:  # a stop signal or an error: the trial being trained saves and resumes on re-run
        stop_children()
        raise
    finally:
        for proc in others:
            if proc.poll() is None and sys.exc_info()[0] is not None:
                proc.terminate()
            proc.wait()
    if worker:
        return root
    st = study.storage()
    evaluate_front(study, st, say)
    text = compare(study, st, rule, write=True, at=at_avg)
    say("\n" + text + f"\n\nwritten: {root / 'comparison.md'}, {root / 'fronts.png'}")
    return root


def _spawn(root: Path, envs: list[dict]) -> list[subprocess.Popen]:
    """A worker on this machine for each slot's environment (its GPU, its share of the cores), its output in
    STUDY/workers/<i>.log."""
    procs = []
    (root / "workers").mkdir(exist_ok=True)
    for i, env in enumerate(envs, start=1):
        with open(root / "workers" / f"{i}.log", "a") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "fastfair", "tune", str(root), "--worker"],
                                          stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env}))
    return procs


def _settings(methods: str, out: str | None, config_name, data_dir, sets, quick, trials, epochs_budget,
              time_budget, space, storage, seed, prune_after) -> Settings:
    labels = [m.strip() for m in methods.split(",") if m.strip()]
    if not labels or len(set(labels)) != len(labels):
        raise UserError(f"--methods takes comma-separated contenders, each once (trades,trades+ccm+ccr+fawa); got "
                        f"{methods!r}")
    for label in labels:
        Contender.parse(label)
    given = [(n, v) for n, v in (("trials", trials), ("epochs", epochs_budget), ("time", time_budget)) if v is not None]
    if len(given) > 1:
        raise UserError("give one budget: --trials, --epochs-budget or --time-budget")
    kind, value = given[0] if given else ("trials", 8)
    # a time budget is the whole study's wall time, split equally
    amount = parse_time(value) / len(labels) if kind == "time" else value
    if kind != "time" and (not isinstance(amount, int) or amount < 1):
        raise UserError(f"--{'trials' if kind == 'trials' else 'epochs-budget'} takes a positive number; got {value}")
    extra = list(sets)
    if data_dir:
        extra.append(f"data.data_dir={toml_value(str(Path(data_dir).expanduser().resolve()))}")
    if quick is not None:
        extra.append(f"data.train_per_class={quick}")
    text = ""
    if space:
        try:
            text = Path(space).read_text()
        except OSError as err:
            raise UserError(f"--space {space}: cannot read it ({err.strerror})") from None
    if storage and not storage.startswith("journal:") and "://" not in storage:
        raise UserError(f"--storage takes a database URL (postgresql://..., sqlite:///...) or journal:PATH; got "
                        f"{storage!r}")
    if storage and storage.startswith("journal:"):
        storage = "journal:" + str(Path(storage.removeprefix("journal:")).expanduser().resolve())
    name = Path(out).name if out else "_".join(labels)
    return Settings(name, tuple(labels), kind, amount, config_name or "", tuple(extra), text, storage or "", seed,
                    prune_after)

