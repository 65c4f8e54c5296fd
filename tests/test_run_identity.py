"""Files that belong to their run (issue 58, items 1-3; docs/reliability.md, "Files of another run, and edits"):
a checkpoint names its run and is refused in one line when read as part of another; following the damage message
of ``last.pt`` never deletes intact state; a file of a run that signs its files is refused without its checksum,
and nothing read without a checksum (an older fastfair's file) is signed when written again. Each case runs on a
copy of the shared tiny digits run (tests/evalreport_helpers.py: PGD-AT, 4 epochs), as the issue describes it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import re
import shlex
import shutil
import signal
import zipfile
from pathlib import Path

import numpy as np
import pytest

import fastfair
from fastfair import cli, rundir, stopping
from fastfair.errors import UserError
from fastfair.rundir import RUN_ID, RunDir, load_checkpoint, new_run_id, read_json, save_atomic, write_json_atomic
from fastfair.training.trainer import Trainer
from evalreport_helpers import digits_run

FASTFAIR = Path(fastfair.__file__).parent


def _copy(tmp_path: Path, name: str = "run") -> Path:
    return Path(shutil.copytree(digits_run()[0], tmp_path / name))


def _one_error(err: str) -> str:
    """The one ``fastfair: error:`` line of ``err``, after checking it is alone and no traceback came with it."""
    errors = [line for line in err.splitlines() if line.startswith("fastfair: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0].removeprefix("fastfair: error: ")


def _files(run: Path) -> dict[str, str]:
    """Every file of ``run`` (the lock file aside) by content hash: what a refused command must leave as it was."""
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*")) if p.is_file() and p.name != ".lock"}


def _resume(run: Path, *extra: str) -> list[str]:
    return ["train", "--out", str(run), "--resume", "--quiet", *extra]


def _moved_out(run: Path) -> str:
    return (f"move it out of {run / 'checkpoints'} (to evaluate it on purpose, `fastfair eval FILE` on it there writes "
            f"its result beside it)")


# ---- 1. a checkpoint carries its run's id, and is refused as part of another run ----------------------------------
@pytest.mark.fault
def test_another_runs_checkpoint_copied_into_a_run_is_refused_by_eval_and_evaluated_on_purpose_as_a_file(tmp_path,
                                                                                                        capsys):
    """The issue's case: another run's checkpoints copied into ``checkpoints/`` were evaluated on this run's data and
    filed as its result (the real one moved to ``eval/previous/``)."""
    run = _copy(tmp_path)
    ours, best = RunDir(run).run_id(), run / "checkpoints" / "best_pgd.pt"
    assert load_checkpoint(best)[RUN_ID] == ours  # every checkpoint names its run
    other = new_run_id()  # a run of the same settings in another folder: only its id tells it apart
    save_atomic({**load_checkpoint(best), RUN_ID: other}, best)
    kept = _files(run)
    assert cli.main(["eval", str(run), "--attacks", "clean", "--quiet"]) == 2
    assert _one_error(capsys.readouterr().err) == (
        f"{best} belongs to another run ({other}; {run} is run {ours}): it was copied in from elsewhere, so fastfair "
        f"does not read it as this run's; {_moved_out(run)}")
    assert _files(run) == kept  # the run's own result stays where it was, nothing in eval/previous/

    # evaluated on purpose: the file out of the run's checkpoints/, its result beside it, the run untouched
    foreign = tmp_path / "foreign" / "best_pgd.pt"
    foreign.parent.mkdir()
    best.rename(foreign)
    assert cli.main(["eval", str(foreign), "--attacks", "clean", "--quiet"]) == 0
    assert read_json(tmp_path / "foreign" / "eval" / "best_pgd-test.json")["images"] == 360
    assert {k: v for k, v in _files(run).items() if k != "checkpoints/best_pgd.pt"} == {
        k: v for k, v in kept.items() if k != "checkpoints/best_pgd.pt"}


@pytest.mark.fault
def test_resume_refuses_a_last_pt_of_another_run_of_another_data_set_or_past_the_runs_epochs(tmp_path, capsys):
    """The issue's case: --resume took a last.pt of epoch 4 into a 3-epoch run (and one of another data set) and said
    training was complete. Each is one line now, and nothing is written."""
    run = _copy(tmp_path)
    ours, last = RunDir(run).run_id(), run / "checkpoints" / "last.pt"
    own = load_checkpoint(last)
    other = new_run_id()
    another_data = own["config"].replace('dataset = "digits"', 'dataset = "npz"')
    cases = {  # what last.pt is -> what --resume says
        "another run's epoch 5": ({**own, RUN_ID: other, "epoch": 5},
                                  f"{last} belongs to another run ({other}; {run} is run {ours}): it was copied in "
                                  f"from elsewhere, so fastfair does not read it as this run's; {_moved_out(run)}"),
        "epoch 5 of a 4-epoch run": ({**own, "epoch": 5},
                                     f"{last} holds epoch 5, past the 4 epochs of {run} (train.epochs): it is "
                                     f"another run's checkpoint, so fastfair does not read it as this run's; "
                                     f"{_moved_out(run)}"),
        "another data set": ({**own, "config": another_data},
                             f"{last} was trained with other settings than {run / 'config.toml'} (data.dataset "
                             f"'npz', the run's 'digits'): it is another run's checkpoint, so fastfair does not read "
                             f"it as this run's; {_moved_out(run)}"),
    }
    for case, (ck, said) in cases.items():
        save_atomic(ck, last)
        kept = _files(run)
        assert cli.main(_resume(run)) == 2, case
        assert _one_error(capsys.readouterr().err) == said, case
        assert _files(run) == kept, case
    # its own last.pt (epoch 4) with fewer epochs asked for: the epochs trained stay trained
    save_atomic(own, last)
    assert cli.main(_resume(run, "--epochs", "3")) == 2
    assert _one_error(capsys.readouterr().err) == (
        f"{last} holds epoch 4, and --resume was given 3 epochs: the epochs trained stay trained; pass --epochs 4 or "
        f"more, or leave it out")


def _older(run: Path) -> None:
    """Make ``run`` an older fastfair's: config.toml, history and metrics lines and eval records without checksums
    or run id, checkpoints without their run's id (as written before issue 49's checksums and issue 58's ids)."""
    rd = RunDir(run)
    rd.config.write_text(rd.read_config())
    for log in (rd.history, rd.metrics):
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        log.write_text("".join(json.dumps({k: v for k, v in r.items() if k not in (rundir.JSON_CHECKSUM, "run")})
                               + "\n" for r in lines))
    for record in rd.eval_files():
        record.write_text(json.dumps({k: v for k, v in json.loads(record.read_text()).items()
                                      if k != rundir.JSON_CHECKSUM}))
    for ck in rd.checkpoints.glob("*.pt"):
        save_atomic({k: v for k, v in load_checkpoint(ck).items() if k != RUN_ID}, ck)


@pytest.mark.fault
def test_an_older_runs_checkpoints_without_ids_are_read_as_before_said_once_and_checked_against_its_config(tmp_path,
                                                                                                          capsys):
    run = _copy(tmp_path)
    _older(run)
    result = run / "eval" / "best_pgd-test.json"
    old_result = result.read_bytes()
    assert cli.main(["eval", str(run), "--attacks", "clean", "--quiet"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("fastfair: ")]
    assert said == [f"fastfair: {run} is an older fastfair's run (its config.toml names no run id): its files are read "
                    f"as before, those without a checksum unchecked, and its checkpoints checked against its config "
                    f"only"]
    # the earlier result, which no checksum vouched for, is kept as it was beside the new one, not merged into it
    (previous,) = (run / "eval" / "previous").iterdir()
    assert previous.read_bytes() == old_result and rundir.JSON_CHECKSUM in json.loads(result.read_text())

    last = run / "checkpoints" / "last.pt"  # one of another data set, copied in: its config tells it apart
    ck = load_checkpoint(last)
    save_atomic({**ck, "config": ck["config"].replace('dataset = "digits"', 'dataset = "npz"')}, last)
    assert cli.main(_resume(run)) == 2
    assert "was trained with other settings than" in _one_error(capsys.readouterr().err)
    save_atomic({**ck, RUN_ID: new_run_id()}, last)  # one of a newer run
    assert cli.main(_resume(run)) == 2
    assert f"and {run} is an older fastfair's run, without an id" in _one_error(capsys.readouterr().err)


# ---- 2. following the damage message never destroys intact state ---------------------------------------------
def _zero_member(path: Path) -> None:
    """Zero 64 bytes inside the largest member of the zip ``path`` (its data), in place: a disk's damage."""
    with zipfile.ZipFile(path) as z:
        info = max(z.infolist(), key=lambda i: i.file_size)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name, extra = np.frombuffer(f.read(4), dtype="<u2")
        f.seek(info.header_offset + 30 + int(name) + int(extra) + info.compress_size // 2)
        f.write(bytes(64))


@pytest.mark.fault
def test_moving_a_damaged_last_pt_aside_as_told_continues_from_interrupted_pt_and_deletes_nothing(tmp_path, capsys,
                                                                                                  monkeypatch):
    """The issue's case: after moving a damaged last.pt aside as the message said, --resume removed interrupted.pt
    ("its epoch is whole in last.pt", which was gone) and trained the run again from its first epoch."""
    run = _copy(tmp_path)
    rd = RunDir(run)
    steps = []  # a stop signal after the third step of epoch 5: interrupted.pt holds epoch 5 after step 3
    step = Trainer.train_step
    monkeypatch.setattr(Trainer, "train_step", lambda self, x, y: (step(self, x, y), steps.append(1)))
    monkeypatch.setattr(stopping, "requested", lambda: signal.SIGTERM if len(steps) >= 3 else 0)
    assert cli.main(_resume(run, "--epochs", "5")) == 143
    monkeypatch.undo()
    capsys.readouterr()
    interrupted = load_checkpoint(rd.interrupted)
    assert (interrupted["epoch"], interrupted["step"]) == (4, 3)
    _zero_member(rd.last)

    assert cli.main(_resume(run)) == 2
    said = _one_error(capsys.readouterr().err)
    advice = re.search(r"or move it aside and `(.+?)` (.+?);", said)
    assert advice and advice[2] == f"continues from interrupted.pt (epoch 5, after step 3 of {interrupted['steps']})"

    # with a process count that cannot continue it, interrupted.pt is the run's latest state: refused, kept
    other = Path(shutil.copytree(run, tmp_path / "two-ranks"))
    save_atomic({**interrupted, "ranks": interrupted["ranks"] * 2}, RunDir(other).interrupted)
    RunDir(other).last.rename(other / "last.pt.damaged")
    assert cli.main(_resume(other)) == 2
    assert _one_error(capsys.readouterr().err).startswith(
        f"{RunDir(other).interrupted} holds the run's latest state (epoch 5, after step 3 of {interrupted['steps']}), "
        f"written by 2 processes, and this run has 1")
    assert RunDir(other).interrupted.is_file()

    # exactly as told: move it aside, then the command
    rd.last.rename(run / "last.pt.damaged")
    assert cli.main(shlex.split(advice[1])[1:]) == 0
    log = rd.train_log.read_text()
    assert f"{rd.last} is not there: continuing from interrupted.pt, the run's latest state" in log
    assert "removed" not in log and "starting it again" not in log and "again from its first epoch" not in log
    assert f"resuming {run} in epoch 5 of 5 after step 3 of {interrupted['steps']}" in log
    assert [r["epoch"] for r in rd.read_metrics()] == [1, 2, 3, 4, 5]
    assert load_checkpoint(rd.last)["epoch"] == 5 and not rd.interrupted.exists()  # replaced once its epoch ended
    assert [(h["event"], h["epoch"], h.get("step")) for h in rd.read_history()][-1] == ("resume", 5, 3)
    assert {p.name for p in rd.checkpoints.glob("best_*.pt")} == {"best_fair.pt", "best_pgd.pt", "best_worst.pt"}


# ---- 3. a file of a run that signs its files is refused without its checksum, and nothing is re-signed -----------
@pytest.mark.fault
def test_a_config_toml_edited_without_its_checksum_line_is_refused_and_never_trained_or_signed_again(tmp_path, capsys):
    """The issue's case: learning rate 0.05 -> 0.5 and the checksum line deleted (as the damage message said to do
    for an edit): resume trained at 0.5, history recorded no change, and the file was signed again."""
    run = _copy(tmp_path)
    toml = run / "config.toml"
    checksum, named, body = toml.read_text().split("\n", 2)
    ours = RunDir(run).run_id()
    assert checksum.startswith(rundir.TOML_CHECKSUM) and named.startswith(f"# fastfair run {ours}: ")
    assert "lr = 0.05\n" in body
    toml.write_text(f"{named}\n{body.replace('lr = 0.05', 'lr = 0.5')}")
    kept = _files(run)
    fix = rundir.CONFIG_FIX.format(run=run)
    for command in (_resume(run), ["eval", str(run), "--attacks", "clean", "--quiet"],
                    ["report", str(run), "--out", str(tmp_path / "report")]):
        assert cli.main(command) == 2, command
        assert _one_error(capsys.readouterr().err) == (
            f"{toml} has no checksum line, which fastfair writes with the config of every run that names its id (this "
            f"one: {ours}): it was edited or damaged, so fastfair does not read it; {fix}"), command
        assert _files(run) == kept, command  # not trained, no history line, not signed again
    toml.write_text(body.replace("lr = 0.05", "lr = 0.5"))  # the run's line deleted too: its history names the run
    assert cli.main(_resume(run)) == 2
    assert _one_error(capsys.readouterr().err) == (
        f"{toml} names no run, though history.jsonl names run {ours} (its config.toml names it on its second line, "
        f"under the checksum): it was edited or replaced, so fastfair does not read it; {fix}")
    # the way to change a setting: --resume --set, recorded (it trains; here asked for no more epochs than done)
    toml.write_text(f"{checksum}\n{named}\n{body}")
    assert cli.main(_resume(run, "--set", "train.lr=0.5")) == 0
    assert RunDir(run).read_history()[-1]["changed"] == {"train.lr": [0.05, 0.5]}


@pytest.mark.fault
def test_a_metrics_line_history_line_or_eval_record_without_its_checksum_is_refused_and_left_as_it_is(tmp_path,
                                                                                                      capsys):
    """The issue's case: a metrics.jsonl line or an eval JSON with its checksum key removed was read (one showed a
    class at 95.0) and written back with a valid checksum. And history.jsonl, which docs/reliability.md said report
    and resume check, was read by nothing."""
    run = _copy(tmp_path)
    rd = RunDir(run)
    report = ["report", str(run), "--out", str(tmp_path / "report")]

    lines = rd.metrics.read_text().splitlines()
    edited = json.loads(lines[1])
    del edited[rundir.JSON_CHECKSUM]
    edited["val"]["clean"]["per_class"][3] = 95.0
    rd.metrics.write_text("\n".join([lines[0], json.dumps(edited), *lines[2:]]) + "\n")
    kept = _files(run)
    for command in (report, _resume(run)):
        assert cli.main(command) == 2, command
        assert _one_error(capsys.readouterr().err) == (
            f"{rd.metrics}, line 2, has no checksum ({rundir.JSON_CHECKSUM}), which every line fastfair writes in this "
            f"run carries: it was edited or damaged; restore metrics.jsonl from a copy, or delete that line to read "
            f"the run without that epoch's numbers (its checkpoints do not depend on them)"), command
        assert _files(run) == kept, command
    rd.metrics.write_text("\n".join(lines) + "\n")

    history = rd.history.read_text()
    for edit, says in ((history.replace('"start"', '"stass"'), "is damaged: its content does not match its checksum"),
                       (json.dumps({k: v for k, v in json.loads(history).items() if k != rundir.JSON_CHECKSUM}) + "\n",
                        "has no checksum")):
        rd.history.write_text(edit)
        for command in (report, _resume(run)):
            assert cli.main(command) == 2, command
            assert _one_error(capsys.readouterr().err).startswith(f"{rd.history}, line 1, {says}"), command
    rd.history.write_text(history)

    record = run / "eval" / "best_pgd-test.json"
    edited = json.loads(record.read_text())
    del edited[rundir.JSON_CHECKSUM]
    edited["results"]["clean"]["per_class"][3] = 95.0
    record.write_text(json.dumps(edited))
    kept = _files(run)
    said = (f"{record} has no checksum ({rundir.JSON_CHECKSUM}), which every record fastfair writes in this run "
            f"carries: it was edited or damaged; ")
    assert cli.main(report) == 2
    assert _one_error(capsys.readouterr().err).startswith(said)
    assert cli.main(["eval", str(run), "--attacks", "clean", "--quiet"]) == 2  # which merges into an earlier result
    assert _one_error(capsys.readouterr().err).startswith(said)
    with pytest.raises(UserError, match=re.escape(said)):
        fastfair.load_result(record)
    assert _files(run) == kept


@pytest.mark.fault
def test_resuming_an_older_run_signs_none_of_what_it_read_unchecked(tmp_path, capsys):
    """An older fastfair's run resumes as before, and what it read without a checksum stays without one: its
    config.toml, its metrics and history lines (rewritten 1-based or cut back on resume), a result saved again."""
    run = _copy(tmp_path)
    _older(run)
    rd = RunDir(run)
    old_metrics = rd.metrics.read_text().splitlines()
    assert cli.main(_resume(run, "--epochs", "5")) == 0
    capsys.readouterr()
    text = rd.config.read_text()
    assert not text.startswith(rundir.TOML_CHECKSUM) and "# fastfair run" not in text and "epochs = 5" in text
    lines = rd.metrics.read_text().splitlines()
    assert lines[:4] == old_metrics and rundir.JSON_CHECKSUM in json.loads(lines[4])  # epoch 5 was written now
    history = [json.loads(line) for line in rd.history.read_text().splitlines()]
    assert rundir.JSON_CHECKSUM not in history[0] and rundir.JSON_CHECKSUM in history[1]
    assert all("run" not in h for h in history) and RUN_ID not in load_checkpoint(rd.last)
    assert rd.truncate_metrics(4) is False  # cut back: the older lines stay as they were
    assert rd.metrics.read_text().splitlines() == old_metrics

    previous = run / "eval" / "previous"
    (older,) = previous.iterdir()  # the final evaluation kept the older result aside, as it was
    fastfair.load_result(older).save(tmp_path / "saved.json")
    assert rundir.JSON_CHECKSUM not in json.loads((tmp_path / "saved.json").read_text())


def test_the_writers_sign_no_content_read_unchecked(tmp_path):
    """:func:`rundir.write_json_atomic` and :func:`rundir.jsonl_line` sign a record only when nothing in it came
    from a file read without its checksum (:class:`rundir.Unchecked`, which the readers make every object of such a
    file), however it was taken apart and put together again."""
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"results": {"clean": {"per_class": [90.0, 95.0]}}, "classes": ["a", "b"]}))
    old = read_json(path)
    assert isinstance(old, rundir.Unchecked) and isinstance(old["results"]["clean"], rundir.Unchecked)
    for built in ({"results": {**old["results"], "pgd": {"per_class": [1.0, 2.0]}}}, {"rows": [old["results"]]}):
        write_json_atomic(built, tmp_path / "new.json")
        assert rundir.JSON_CHECKSUM not in json.loads((tmp_path / "new.json").read_text())
        assert rundir.JSON_CHECKSUM not in json.loads(rundir.jsonl_line(built, tmp_path / "log.jsonl"))
    write_json_atomic({"results": {"pgd": {"per_class": [1.0, 2.0]}}}, tmp_path / "new.json")
    assert rundir.JSON_CHECKSUM in json.loads((tmp_path / "new.json").read_text())


# Every module of fastfair/ that reads a file fastfair signs and writes one, and why what it writes signs nothing it
# read unchecked. A new module doing both fails the test below until it is looked at and named here.
READERS = {"read_json", "read_jsonl", "read_toml", "read_config", "saved_config", "read_metrics", "read_history",
           "load_run", "load_saved", "load_result"}
SIGNERS = {"write_json_atomic", "jsonl_line", "append_jsonl", "append_metrics", "append_history", "write_toml",
           "write_config"}
REVIEWED = {
    "fastfair.rundir": "truncate_metrics writes lines read unchecked without a checksum (jsonl_line); write_config "
                       "signs an older run's config only where its checksum line was there and matched",
    "fastfair.training.trainer": "the config it writes on resume is config.toml's as read (rundir.write_config)",
    "fastfair.evaluation.per_class": "an earlier result read unchecked goes to eval/previous/ as its bytes",
    "fastfair.evaluation.result": "Result.save of a record read unchecked holds Unchecked objects: written unsigned",
    "fastfair.evaluation.homing": "a stored prediction read unchecked is not used (measured again)",
    "fastfair.reports.zoo": "zoo.json is unsigned where a model's result was read unchecked",
    "fastfair.scaleout.jobs": "grid-state.json is written new; only the attempt count is read from the old one",
    "fastfair.tuning.study": "study.toml and space.toml are written from the command's settings, tune-test.json "
                             "from a new evaluation",
    "fastfair.data.ffcv": "meta.json and the .beton sidecars are written from files hashed anew",
}


def _called(tree: ast.AST) -> set[str]:
    return {n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            for n in ast.walk(tree) if isinstance(n, ast.Call)}


def test_every_module_that_reads_and_writes_signed_files_is_reviewed_for_re_signing():
    both = {}
    for path in sorted(FASTFAIR.rglob("*.py")):
        called = _called(ast.parse(path.read_text()))
        if called & READERS and called & SIGNERS:
            both[".".join(path.relative_to(FASTFAIR.parent).with_suffix("").parts)] = sorted(called & SIGNERS)
    assert sorted(both) == sorted(REVIEWED), both
