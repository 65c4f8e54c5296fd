"""Faults a run meets on a cluster (issue 40): a full or failing disk under every writer, torn and stale state,
a lock held on another host; and docs/reliability.md, whose table of faults and the tests that prove them this
file checks against the tests (every test it names exists, every test marked ``fault`` is named).

Disk faults are injected at rundir's lowest layer (``rundir._open``: the write that crosses the room left is cut
short, the next fails), and, where this machine lets a test mount one, on a real 1 MB tmpfs.
"""
from __future__ import annotations

import ast
import errno
import io
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fastfair import cli, rundir
from fastfair.data import ffcv as ffcv_module
from fastfair.errors import UserError, WriteError
from fastfair.reports import figures
from fastfair.reports.report import load_run
from fastfair.rundir import (RunDir, append_jsonl, append_text, load_checkpoint, save_atomic, write_json_atomic,
                             write_npz_atomic)
from fastfair.scaleout import jobs
from helpers import demo_train, fastfair, trained_demo

ROOT = Path(__file__).resolve().parents[1]
_train = demo_train


@pytest.fixture(scope="module")
def trained() -> Path:
    return trained_demo()


def _copy(trained: Path, to: Path) -> Path:
    shutil.copytree(trained, to)
    return to


def fail_writes(monkeypatch, code: int = errno.ENOSPC, room: int = 0, which=lambda path: True,
                times: int = -1) -> None:
    """Writes through rundir's lowest layer to the files ``which`` picks fail with ``code`` once ``room`` more
    bytes are written: the write that crosses it is cut short, as a filling disk cuts it, the next one fails
    (``times`` failures, then the disk has room again; -1: it never has)."""
    left, failures = [room], [times]

    class Failing(io.FileIO):
        def write(self, data) -> int:
            if left[0] <= 0 and failures[0]:
                failures[0] -= 1
                raise OSError(code, os.strerror(code))
            if failures[0] == 0:
                return super().write(data)
            part = bytes(memoryview(data).cast("B")[: left[0]])
            left[0] -= len(part)
            return super().write(part)

    monkeypatch.setattr(rundir, "_open", lambda path, mode: (Failing if which(Path(path)) else io.FileIO)(path, mode))


def _one_error(err: str) -> str:
    """The one ``fastfair: error:`` line of ``err``, after checking it is alone and no traceback came with it."""
    errors = [line for line in err.splitlines() if line.startswith("fastfair: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0].removeprefix("fastfair: error: ")


def _temporary_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.tmp"))


# ---- item 4: a full or failing disk ------------------------------------------------------------
WHY = {errno.ENOSPC: ("no space left on the device", "free some space"),
       errno.EIO: ("input/output error, from a failing disk or a network filesystem gone away", "fix the disk")}
WRITERS = {  # every kind of file a run writes, by the helper that writes it
    "checkpoint": ("last.pt", lambda path: save_atomic({"epoch": 2, "model": {"w": torch.ones(100_000)}}, path)),
    "json": ("best_pgd-test.json", lambda path: write_json_atomic({"results": list(range(1000))}, path)),
    "npz": ("best_pgd-test.aa.npz", lambda path: write_npz_atomic({"pred": np.arange(1000)}, path)),
    "figure": ("per-class.png", lambda path: figures.save_figure(figures.plt.figure(), path)),
    "metrics line": ("metrics.jsonl", lambda path: append_jsonl({"epoch": 2, "loss": 0.5}, path)),
    "log line": ("train.log", lambda path: append_text("epoch   2  loss 0.5000\n", path)),
}


@pytest.mark.fault
@pytest.mark.parametrize("code", list(WHY), ids=["ENOSPC", "EIO"])
@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_failed_write_is_one_line_and_keeps_the_previous_file(writer, code, tmp_path, monkeypatch):
    name, write = WRITERS[writer]
    path = tmp_path / name
    path.write_bytes(b"the previous, complete file\n")
    fail_writes(monkeypatch, code, room=10)  # ten bytes go down, then the disk refuses
    with pytest.raises(WriteError) as err:
        write(path)
    assert path.read_bytes() == b"the previous, complete file\n"  # an append is cut back, a replace never happens
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left
    why, fix = WHY[code]
    assert re.fullmatch(rf"cannot write {re.escape(str(path))}: {why} \([\d.]+ [kMGT]?B free on /\S*\); the previous "
                        rf"{re.escape(name)} is kept as it was; {fix}, then run the same command again", str(err.value))


@pytest.mark.fault
def test_a_checkpoint_write_that_fails_once_is_one_line_though_the_disk_had_room_again(tmp_path, monkeypatch):
    """torch.save turns its file's failed write into a RuntimeError; where the file's buffer then closes cleanly
    (space freed meanwhile), that error is the one seen, and still a failed write of the file."""
    path = tmp_path / "last.pt"
    path.write_bytes(b"the previous, complete file\n")
    fail_writes(monkeypatch, times=1)
    with pytest.raises(WriteError, match=rf"cannot write {re.escape(str(path))}: no space left on the device"):
        save_atomic({"w": torch.ones(100_000)}, path)  # its data bypasses the 8 kB buffer: torch sees the failure
    assert path.read_bytes() == b"the previous, complete file\n" and [p.name for p in tmp_path.iterdir()] == ["last.pt"]


@pytest.mark.fault
def test_a_missing_file_says_none_was_written_and_other_errors_pass_through(tmp_path, monkeypatch):
    fail_writes(monkeypatch)
    with pytest.raises(WriteError, match=r"; no new.json was written; free some space"):
        write_json_atomic({}, tmp_path / "new.json")

    def broken(f):  # not a write that failed: torch's own error, unchanged
        raise RuntimeError("not a disk fault")
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="not a disk fault"):
        rundir._replace_atomic(broken, tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.fault
@pytest.mark.slow
def test_a_full_disk_at_a_checkpoint_stops_training_in_one_line_and_resume_ends_as_without_it(trained, tmp_path,
                                                                                           monkeypatch, capsys):
    run, reference = _copy(trained, tmp_path / "run"), _copy(trained, tmp_path / "reference")
    last = (run / "checkpoints" / "last.pt").read_bytes()
    fail_writes(monkeypatch, which=lambda path: path.name.startswith(".last.pt."))  # epoch 2's last.pt
    assert cli.main(_train(run, "--resume", "--epochs", "2")) == 74
    line = _one_error(capsys.readouterr().err)
    assert re.fullmatch(rf"cannot write {run}/checkpoints/last.pt: no space left on the device \(.* free on /\S*\); "
                        rf"the previous last.pt is kept as it was; free some space, then continue with: fastfair "
                        rf"train --out {run} --resume", line), line
    assert (run / "checkpoints" / "last.pt").read_bytes() == last and not _temporary_files(run)
    assert not RunDir(run).locked_by() and (run / ".lock").read_text() == ""  # released
    monkeypatch.undo()  # space was freed
    assert cli.main(_train(run, "--resume", "--epochs", "2")) == 0
    assert cli.main(_train(reference, "--resume", "--epochs", "2")) == 0  # the same resume, with a disk that had room
    assert [r["epoch"] for r in RunDir(run).read_metrics()] == [1, 2]  # epoch 2 redone once, not twice
    ours, theirs = (load_checkpoint(r / "checkpoints" / "last.pt")["model"] for r in (run, reference))
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


@pytest.mark.fault
def test_a_new_run_whose_config_cannot_be_written_leaves_no_folder(tmp_path, monkeypatch, capsys):
    fail_writes(monkeypatch, which=lambda path: path.name.startswith(".config.toml."))
    assert cli.main(_train(tmp_path / "run")) == 74
    assert _one_error(capsys.readouterr().err).endswith(
        "no config.toml was written; free some space, then run the same command again")
    assert not (tmp_path / "run").exists()  # so the same command starts it afresh


@pytest.mark.fault
def test_eval_on_a_failing_disk_is_one_line_and_keeps_the_previous_result(trained, tmp_path, monkeypatch, capsys):
    run = _copy(trained, tmp_path / "run")
    result = run / "eval" / "best_pgd-test.json"
    before = result.read_bytes()
    best = run / "checkpoints" / "best_pgd.pt"
    ck = load_checkpoint(best)  # other weights than the result's: the earlier result is kept in eval/previous/ first
    save_atomic({**ck, "model": {k: v * 0.5 if v.is_floating_point() else v for k, v in ck["model"].items()}}, best)
    fail_writes(monkeypatch, errno.EIO, which=lambda path: path.name.startswith(".best_pgd-test.json."))
    assert cli.main(["eval", str(run), "--attacks", "clean", "--quiet"]) == 74
    line = _one_error(capsys.readouterr().err)
    assert line.startswith(f"cannot write {result}: input/output error") and line.endswith(
        "the previous best_pgd-test.json is kept as it was; fix the disk, then run the same command again")
    assert result.read_bytes() == before and not _temporary_files(run)  # in place, not only in eval/previous/


@pytest.mark.fault
def test_a_report_on_a_full_disk_is_one_line(trained, tmp_path, monkeypatch, capsys):
    run = _copy(trained, tmp_path / "run")
    fail_writes(monkeypatch, which=lambda path: path.suffix == ".tmp" and ".png." in path.name)
    assert cli.main(["report", str(run)]) == 74
    assert re.fullmatch(rf"cannot write {run}/report/figures/\S+\.png: no space left on the device .*; no \S+\.png "
                        r"was written; free some space, then run the same command again",
                        _one_error(capsys.readouterr().err))
    assert not _temporary_files(run)


def _fake_ffcv(monkeypatch, fails: bool) -> None:
    """FFCV's pieces as convert uses them; its DatasetWriter writes its own file, here failing when ``fails``."""
    class DatasetWriter:
        def __init__(self, fname, fields, num_workers):
            self.fname = fname

        def from_indexed_dataset(self, samples):
            with open(self.fname, "wb") as f:
                f.write(b"new beton")
                if fails:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    pieces = SimpleNamespace(RGBImageField=lambda **kw: "rgb", NDArrayField=lambda *a: "array", IntField=lambda: "int",
                             DatasetWriter=DatasetWriter)
    monkeypatch.setattr(ffcv_module, "_ffcv", lambda: pieces)


@pytest.mark.fault
def test_ffcv_conversion_on_a_full_disk_keeps_the_previous_files_and_a_too_small_disk_is_refused_first(
        tmp_path, monkeypatch, capsys):
    out = tmp_path / "betons"
    convert = ["data", "convert", "--dataset", "digits", "--out", str(out), "--workers", "1"]
    _fake_ffcv(monkeypatch, fails=False)
    assert cli.main(convert) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    files = {f"{split}.beton" for split in ("train", "val", "test")}  # each with the sidecar of its verified hash
    assert set(before) == {*files, *(f"{f}.verified.json" for f in files), "meta.json"}
    capsys.readouterr()
    _fake_ffcv(monkeypatch, fails=True)
    assert cli.main(convert) == 74
    assert _one_error(capsys.readouterr().err).startswith(f"cannot write {out}/train.beton: no space left on the")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # every file as it was, no temporary one

    # FFCV's writer hangs when one of its worker processes fails to write: a raw conversion's size is known first
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(rundir.shutil, "disk_usage", lambda path: usage._replace(free=1000))
    assert cli.main(convert) == 74
    assert re.fullmatch(rf"cannot write {out}: the .beton files need about [\d.]+ MB \(1.0 kB free on /\S*\); nothing "
                        r"was written; free some space, then run the same command again",
                        _one_error(capsys.readouterr().err))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


@pytest.mark.fault
def test_a_grid_names_a_child_whose_error_line_could_not_be_written(tmp_path):
    log = tmp_path / "train.log"
    log.write_text("# attempt 1: fastfair train ...\nresuming runs/a after epoch 3 of 10\n")
    assert jobs._why(log, 0, 74) == "exit code 74: a file could not be written (a full or failing disk)"


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MB filesystem (tmpfs) at tmp_path/disk; skips where this machine lets no test mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = (subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                              text=True) if shutil.which("mount") else None)
    if mounted is None or mounted.returncode:
        pytest.skip("mounting a 1 MB tmpfs needs root and mount(8) (" + (mounted.stderr.strip() if mounted else
                    "no mount command") + "); the injected faults above test the same writers")
    try:
        yield disk
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def _fill(disk: Path, leave: int) -> Path:
    """A file that fills ``disk`` up to ``leave`` bytes."""
    filler = disk / f"filler-{len(list(disk.glob('filler-*')))}"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    os.truncate(filler, max(0, filler.stat().st_size - leave))
    return filler


@pytest.mark.fault
@pytest.mark.slow
def test_on_a_real_full_filesystem_train_and_eval_fail_in_one_line_and_the_run_resumes(trained, small_disk, capsys):
    run = _copy(trained, small_disk / "run")
    kept = {p: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    result = (run / "eval" / "best_pgd-test.json").read_bytes()
    _fill(small_disk, leave=4 * 4096)  # room for epoch 2's metrics line and a best checkpoint, not for last.pt
    # in this process: the filesystem is real, what a process adds is its imports
    train = fastfair(*_train(run, "--resume", "--epochs", "2"))
    assert train.returncode == 74, train.stderr
    line = _one_error(train.stderr)
    assert re.fullmatch(rf"cannot write {run}/\S+: no space left on the device \([\d.]+ k?B free on {small_disk}\); "
                        rf".*; free some space, then continue with: fastfair train --out {run} --resume", line), line
    for path in (run / "checkpoints").iterdir():  # whole: each loads (a best one may be epoch 2's)
        assert load_checkpoint(path, needs=("epoch", "model"))["epoch"] in (1, 2)
    assert (run / "checkpoints" / "last.pt").read_bytes() == kept[run / "checkpoints" / "last.pt"]  # epoch 1

    _fill(small_disk, leave=0)
    ev = fastfair("eval", run, "--attacks", "clean", "--quiet")
    assert ev.returncode == 74, ev.stderr
    # best_pgd.pt may hold epoch 2's weights now: the earlier result is copied to eval/previous/ first, so either
    # write may be the one refused
    assert re.match(rf"cannot write {run}/eval/\S+\.json: no space left on the device", _one_error(ev.stderr))
    assert (run / "eval" / "best_pgd-test.json").read_bytes() == result and not _temporary_files(run)

    for filler in small_disk.glob("filler-*"):
        filler.unlink()
    assert cli.main(_train(run, "--resume", "--epochs", "2")) == 0
    assert [r["epoch"] for r in RunDir(run).read_metrics()] == [1, 2]


# ---- item 5: torn and stale state --------------------------------------------------------------
@pytest.mark.fault
@pytest.mark.slow
def test_a_truncated_last_pt_stops_resume_in_one_line_and_moved_aside_the_run_trains_again(trained, tmp_path,
                                                                                           capsys):
    run = _copy(trained, tmp_path / "run")
    last = run / "checkpoints" / "last.pt"
    last.write_bytes(last.read_bytes()[:1000])  # an interrupted copy
    assert cli.main(_train(run, "--resume")) == 2
    assert _one_error(capsys.readouterr().err) == (
        f"cannot resume {run}: {last} is truncated (a zip, as torch.save writes, whose end is missing: a copy or a "
        f"write that stopped part-way); copy it again from where it came from, or move it aside and `fastfair train "
        f"--out {run} --resume` trains the run again from its first epoch")
    last.rename(run / "last.pt.torn")
    assert cli.main(_train(run, "--resume")) == 0
    assert (f"{last} is not there, and nothing else holds the state of its finished epochs: training the run again "
            f"from its first epoch") in (run / "train.log").read_text()
    assert [r["epoch"] for r in RunDir(run).read_metrics()] == [1]
    assert load_checkpoint(last)["epoch"] == 1


@pytest.mark.fault
def test_a_lock_held_on_another_host_of_a_shared_filesystem_waits_for_the_user(tmp_path, monkeypatch):
    """A holder on another host cannot be checked from here, and on a shared filesystem its lock may be invisible
    here: refused, saying how to take over once that job has ended; on a local filesystem the kernel's flock saw the
    holder die, so the lock is taken over, its unfinished writes removed."""
    run = RunDir(tmp_path / "r")
    (run.path / "checkpoints").mkdir(parents=True)
    unfinished = run.path / "checkpoints" / ".last.pt.gpu17.4242.ab12.tmp"
    unfinished.write_bytes(b"half a checkpoint")
    run.lock_file.write_text("pid 4242 on gpu17")
    monkeypatch.setattr(rundir, "_shared_filesystem", lambda path: "nfs4")
    with pytest.raises(UserError) as err:
        with run.lock():
            pass
    assert str(err.value) == (
        f"{run.path} was being written by pid 4242 on gpu17, another host, and is on a shared filesystem (nfs4) whose "
        "locks this host may not see, so fastfair cannot tell whether that process still runs; if it has ended (ask "
        f"the scheduler, or `ps -p 4242` on gpu17), delete {run.lock_file} and run the command again")
    assert run.lock_file.read_text() == "pid 4242 on gpu17" and unfinished.exists()  # nothing touched
    said = []
    run.lock_file.unlink()  # the user checked that the job has ended
    with run.lock(said.append):
        assert run.locked_by() == f"pid {os.getpid()} on {rundir._HOST}"
    assert said == []

    monkeypatch.setattr(rundir, "_shared_filesystem", lambda path: "")
    run.lock_file.write_text("pid 4242 on gpu17")
    with run.lock(said.append):
        pass
    assert said == [f"{run.path}: taking over the lock of pid 4242 on gpu17, which is no longer running; removed its "
                    "unfinished checkpoints/.last.pt.gpu17.4242.ab12.tmp"]
    assert not unfinished.exists()


@pytest.mark.fault
def test_a_filesystem_without_locks_is_one_line(tmp_path, monkeypatch):
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))
    monkeypatch.setattr(rundir.fcntl, "flock", no_locks)
    with pytest.raises(UserError, match=rf"cannot lock {re.escape(str(tmp_path))}/r/.lock \(No locks available\): its "
                                        "filesystem does not support file locks"):
        with RunDir(tmp_path / "r").lock():
            pass


@pytest.mark.fault
def test_shared_filesystems_are_told_from_local_ones_by_the_longest_mount_point():
    mounts = ("/dev/vda / ext4 rw 0 0\nserver:/export /data nfs4 rw 0 0\n/dev/sdb /data/local\\040disk xfs rw 0 0\n"
              "lustre@tcp:/fs /scratch lustre rw,flock 0 0\nme@host: /home/me/remote fuse.sshfs rw 0 0\n")
    assert rundir.shared_in("/data/runs/a", mounts) == "nfs4"
    assert rundir.shared_in("/data/local disk/runs/a", mounts) == ""  # xfs, mounted inside the NFS share
    assert rundir.shared_in("/database/runs", mounts) == ""  # /data is not a prefix of it
    assert rundir.shared_in("/scratch/runs", mounts) == "lustre"
    assert rundir.shared_in("/home/me/remote/runs", mounts) == "fuse.sshfs"


@pytest.mark.fault
def test_a_result_of_weights_its_checkpoint_no_longer_holds_is_left_out_of_the_report(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path / "run")
    best = run / "checkpoints" / "best_pgd.pt"
    ck = load_checkpoint(best)
    save_atomic(ck, best)  # rewritten with the same weights (an epoch redone on resume): still its result
    assert "best_pgd-test" in load_run(run).evals and capsys.readouterr().err == ""
    ck.update(epoch=2, model={k: v + 1 if v.is_floating_point() else v for k, v in ck["model"].items()})
    save_atomic(ck, best)  # a resumed training's new best, not evaluated yet
    assert "best_pgd-test" not in load_run(run).evals
    assert capsys.readouterr().err.splitlines() == [
        f"fastfair: warning: {run}/eval/best_pgd-test.json is of other weights than best_pgd.pt holds now (epoch 1 "
        f"was evaluated; the checkpoint, rewritten since, holds epoch 2); evaluate it again: fastfair eval {run} "
        "--checkpoint best_pgd; left out of the report"]


# ---- item 6: docs/reliability.md and the tests agree ---------------------------------------------
def _tests_by_node() -> dict[str, bool]:
    """``tests/FILE.py::test_name`` of every test function -> whether it is marked ``fault`` (itself or its module)."""
    def fault(decorators) -> bool:
        return any("pytest.mark.fault" in ast.unparse(d) for d in decorators)

    found = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        module = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                     and "pytest.mark.fault" in ast.unparse(n.value) for n in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[f"tests/{path.name}::{node.name}"] = module or fault(node.decorator_list)
    return found


def test_the_reliability_table_and_the_fault_tests_agree():
    table = (ROOT / "docs" / "reliability.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and "::" in line]
    named = [n for row in rows for n in re.findall(r"`(tests/[\w/]+\.py::\w+(?:\[[\w-]+\])?)`", row.split(" | ")[-1])]
    assert len(rows) >= 15 and all(re.search(r"`tests/", row.split(" | ")[-1]) for row in rows)
    tests = _tests_by_node()
    for node in named:  # each exists; a parametrised case by its id in the test's file
        base, _, case = node.partition("[")
        assert base in tests, f"docs/reliability.md names {node}, which does not exist"
        if case:
            assert f'"{case[:-1]}"' in (ROOT / base.split("::")[0]).read_text(), f"no case {case[:-1]} in {base}"
    unlisted = sorted(t for t, fault in tests.items() if fault and t not in {n.partition("[")[0] for n in named})
    assert not unlisted, f"tests marked fault but not in docs/reliability.md: {unlisted}"
    assert "(docs/reliability.md)" in (ROOT / "README.md").read_text()  # linked from the README
