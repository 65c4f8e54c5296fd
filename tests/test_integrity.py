"""Damaged files (issue 49, item 4): every file fastfair writes and later trusts proves on load that its bytes are
those written, and a file whose bytes changed in place (zeroes, same length: a disk, copy or transfer error) is one
``fastfair: error:`` line naming the file and what to do, never a wrong number (docs/reliability.md, "Damaged
files"). The files are written by the real writers (a trained demo run, fastfair eval, the grid's state writer).
"""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import fastfair
from fastfair import cli, config, rundir
from fastfair.attacks.autoattack import Flags
from fastfair.data import ffcv
from fastfair.errors import UserError
from fastfair.reproduce.figures import me
from fastfair.rundir import RunDir, load_checkpoint, read_json, save_atomic, write_json_atomic, write_npz_atomic
from fastfair.scaleout import jobs
from helpers import demo_train, trained_demo


@pytest.fixture(scope="module")
def trained() -> Path:
    return trained_demo()


@pytest.fixture
def run(trained, tmp_path) -> Path:
    return Path(shutil.copytree(trained, tmp_path / "run"))


def _one_error(err: str) -> str:
    """The one ``fastfair: error:`` line of ``err``, after checking it is alone and no traceback came with it."""
    errors = [line for line in err.splitlines() if line.startswith("fastfair: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    return errors[0].removeprefix("fastfair: error: ")


def _zero(path: Path, start: int, count: int = 64) -> None:
    """Overwrite ``count`` bytes of ``path`` from ``start`` with zeroes, in place: same length, as a disk does."""
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(count))


def _zero_member(path: Path, member: str) -> str:
    """Zero 64 bytes in the middle of the largest zip member whose name holds ``member`` (its data, not its
    header); returns its name."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if member in i.filename), key=lambda i: i.file_size)
    assert info.file_size >= 128
    with open(path, "rb") as f:  # the data begins after the local header: 30 bytes, the name and the extra field
        f.seek(info.header_offset + 26)
        name, extra = np.frombuffer(f.read(4), dtype="<u2")
    _zero(path, info.header_offset + 30 + int(name) + int(extra) + info.compress_size // 2)
    return info.filename


PARTS = {"tensors": "/data/", "metadata": "data.pkl"}  # the weights, and the pickled structure naming them


# ---- checkpoints ---------------------------------------------------------------------------------
@pytest.mark.fault
@pytest.mark.parametrize("part", list(PARTS))
def test_a_checkpoint_with_zeroed_bytes_is_refused_by_resume_eval_report_and_the_api(run, part, capsys):
    best, last = run / "checkpoints" / "best_pgd.pt", run / "checkpoints" / "last.pt"
    intact, size = load_checkpoint(best), last.stat().st_size
    member = _zero_member(last, PARTS[part])
    assert last.stat().st_size == size
    capsys.readouterr()
    assert cli.main(demo_train(run, "--resume")) == 2
    line = _one_error(capsys.readouterr().err)
    assert line.startswith(f"{last} is damaged: its part {member} fails its CRC-32 check (bytes changed")
    assert line.endswith(f" (bytes changed after fastfair wrote it: a disk, copy or transfer error), so fastfair does "
                         f"not load it; copy it again from where it came from, or move it aside and `fastfair train "
                         f"--out {run} --resume` trains the run again from its first epoch; the run's intact "
                         f"checkpoints: best_fair (epoch 1), best_pgd (epoch 1), best_worst (epoch 1), e.g. `fastfair "
                         f"eval {run} --checkpoint best_fair`")
    with pytest.raises(UserError, match=f"^{last} is damaged: its part"):  # the Python API, the same check
        fastfair.train(out=run, resume=True, progress=False, sets={"train.lr_milestones": []})
    assert not (run / "checkpoints" / "interrupted.pt").exists()  # nothing trained on from the damaged weights

    _zero_member(best, PARTS[part])
    for command in (["eval", str(run), "--attacks", "clean"], ["report", str(run), "--out", str(run / "report")]):
        assert cli.main(command) == 2
        line = _one_error(capsys.readouterr().err)
        assert re.match(rf"{best} is damaged: its part archive/\S+ fails its CRC-32 check ", line), line
    assert intact["epoch"] == 1 and not (run / "report").exists()


@pytest.mark.fault
def test_a_damaged_zip_directory_and_old_checkpoints_without_crcs(tmp_path):
    """A zeroed entry of the zip's directory is refused too; a checkpoint saved with torch's CRC-32 off (another
    program, or before) has nothing to check and loads; fastfair's own saves write the CRCs even then."""
    path = tmp_path / "last.pt"
    ck = {"epoch": 1, "model": {"w": torch.arange(4096.0)}, "spec": {}, "config": ""}
    save_atomic(ck, path)
    directory = zipfile.ZipFile(path).infolist()[-1].header_offset  # the last member's header; the directory follows
    data = path.read_bytes()
    _zero(path, data.index(b"PK\x01\x02", directory), 46)  # the first entry of the central directory
    with pytest.raises(UserError, match=rf"^{path} is damaged: its zip directory is unreadable \("):
        load_checkpoint(path)

    old = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        torch.save(ck, path)
        assert not any(i.CRC for i in zipfile.ZipFile(path).infolist())
        assert torch.equal(load_checkpoint(path)["model"]["w"], ck["model"]["w"])
        save_atomic(ck, path)
        assert all(i.CRC for i in zipfile.ZipFile(path).infolist() if i.file_size)
    finally:
        torch.serialization.set_crc32_options(old)


# ---- JSON records, config.toml, grid state -------------------------------------------------------
@pytest.mark.fault
def test_an_eval_record_with_a_changed_digit_or_zeroed_bytes_is_refused_and_says_what_to_rerun(run, capsys):
    record = run / "eval" / "best_pgd-test.json"
    text = record.read_text()
    assert rundir.JSON_CHECKSUM in json.loads(text) and rundir.JSON_CHECKSUM not in read_json(record)
    digit = text.index(".", text.index('"overall": ')) + 1  # a digit of a number: still JSON, another value
    record.write_text(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:])
    again = f"delete it and run `fastfair eval {run} --checkpoint best_pgd --split test` again"
    assert cli.main(["report", str(run), "--out", str(run / "report")]) == 2
    assert _one_error(capsys.readouterr().err) == (
        f"{record} is damaged: its content does not match its checksum ({rundir.JSON_CHECKSUM}: bytes changed after "
        f"fastfair wrote it); {again}")
    with pytest.raises(UserError, match=f"^{record} is damaged: its content does not match"):
        fastfair.load_result(record)

    _zero(record, len(text) // 2)
    assert cli.main(["report", str(run), "--out", str(run / "report")]) == 2
    assert _one_error(capsys.readouterr().err) == f"{record} is damaged (not JSON); {again}"


def test_a_record_written_before_checksums_loads_and_a_written_one_reads_back_as_it_was(tmp_path):
    path = tmp_path / "r.json"
    record = {"results": {"clean": [0.5, None]}, 3: (1, 2), "classes": ["a"]}
    write_json_atomic(record, path)
    assert read_json(path) == {"results": {"clean": [0.5, None]}, "3": [1, 2], "classes": ["a"]}
    path.write_text(json.dumps({"results": {}, "classes": ["a"]}))  # an older fastfair's record, no checksum
    assert read_json(path) == {"results": {}, "classes": ["a"]}


@pytest.mark.fault
def test_a_damaged_config_toml_is_refused_and_called_the_config_file(run, capsys):
    toml = run / "config.toml"
    text = toml.read_text()
    checksum, named, body = text.split("\n", 2)
    assert checksum.startswith(rundir.TOML_CHECKSUM) and named.startswith("# fastfair run ")
    assert RunDir(run).read_config() == body
    toml.write_text(text.replace("epochs = 1", "epochs = 7"))  # a changed digit: still TOML, another run
    for command in (demo_train(run, "--resume"), ["eval", str(run), "--attacks", "clean"],
                    ["report", str(run), "--out", str(run / "report")]):
        assert cli.main(command) == 2
        assert _one_error(capsys.readouterr().err) == (
            f"{toml} is damaged: its content does not match the checksum on its first line (bytes changed after "
            f"fastfair wrote it); {rundir.CONFIG_FIX.format(run=run)}")

    # an older fastfair's run (no run line, no checksum line: tests/test_run_identity.py) is read as it is, and its
    # damage is named as the config file's
    (run / "history.jsonl").unlink()
    toml.write_text(body)
    assert config.load_run(run).train.epochs == 1
    toml.write_text(body.replace("[train]", "[train"))
    assert cli.main(["eval", str(run), "--attacks", "clean"]) == 2
    assert _one_error(capsys.readouterr().err).startswith(f"{toml}: the saved run config is damaged (")


@pytest.mark.fault
def test_damaged_grid_state_is_refused(tmp_path):
    jobs._write_state(tmp_path, {"status": "done", "seconds": 12.5})
    assert jobs.read_state(tmp_path) == {"status": "done", "seconds": 12.5}
    path = RunDir(tmp_path).grid_state
    path.write_text(path.read_text().replace("12.5", "92.5"))
    with pytest.raises(UserError, match=f"^{path} is damaged: its content does not match its checksum"):
        jobs.read_state(tmp_path)


# ---- metrics.jsonl and history.jsonl: a checksum on each line -------------------------------------------
@pytest.mark.fault
def test_a_metrics_line_with_a_changed_digit_is_refused_naming_its_line_by_report_resume_and_the_api(run, capsys):
    """A line of an append-only log whose bytes changed was read back (report, resume, curves) as another number:
    each line now carries its own checksum, and a changed one is one line naming the file, the line and the fix."""
    metrics = run / "metrics.jsonl"
    (line,) = metrics.read_text().splitlines()
    assert rundir.JSON_CHECKSUM in json.loads(line) and rundir.JSON_CHECKSUM not in RunDir(run).read_metrics()[0]
    digit = line.index(".", line.index('"loss": ')) + 1  # still JSON, another loss
    metrics.write_text(line[:digit] + str((int(line[digit]) + 1) % 10) + line[digit + 1:] + "\n")
    said = (f"{metrics}, line 1, is damaged: its content does not match its checksum ({rundir.JSON_CHECKSUM}: bytes "
            f"changed after fastfair wrote it); restore metrics.jsonl from a copy, or delete that line to read the "
            f"run without that epoch's numbers (its checkpoints do not depend on them)")
    for command in (["report", str(run), "--out", str(run / "report")], demo_train(run, "--resume")):
        assert cli.main(command) == 2
        assert _one_error(capsys.readouterr().err) == said
    with pytest.raises(UserError, match=re.escape(said)):
        fastfair.train(out=run, resume=True, progress=False, sets={"train.lr_milestones": []})
    assert not (run / "report").exists()

    history = run / "history.jsonl"
    history.write_text(history.read_text().replace('"start"', '"stass"'))
    with pytest.raises(UserError, match=rf"^{history}, line 1, is damaged: its content does not match its checksum"):
        RunDir(run).read_history()


def test_metrics_lines_without_checksums_read_as_before_and_a_torn_last_line_is_still_left_out(tmp_path):
    """Lines written before the checksums are read as they are (outside a run that signs its files) and stay so; a
    line appended now carries one; a torn last line (a kill mid-append) is left out by readers and removed on
    resume, as before."""
    rd = RunDir(tmp_path)
    old = [{"epoch": 1, "loss": 2.5}, {"epoch": 2, "loss": 2.25}]
    rd.metrics.write_text("".join(json.dumps(r) + "\n" for r in old))  # an older fastfair's lines
    rd.append_metrics({"epoch": 3, "loss": 2.0})
    assert rd.read_metrics() == [*old, {"epoch": 3, "loss": 2.0}]
    with open(rd.metrics, "a") as f:
        f.write('{"epoch": 4, "lo')  # killed mid-append
    assert rd.read_metrics()[-1]["epoch"] == 3 and rd.truncate_metrics(3)
    lines = [json.loads(line) for line in rd.metrics.read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [1, 2, 3]
    # rewritten as they were: a line read without a checksum is not signed (tests/test_run_identity.py)
    assert [rundir.JSON_CHECKSUM in r for r in lines] == [False, False, True]
    assert rd.read_metrics() == [*old, {"epoch": 3, "loss": 2.0}]


# ---- .npz: AutoAttack's progress, stored measurements --------------------------------------------
@pytest.mark.fault
def test_autoattack_progress_with_zeroed_bytes_is_refused(tmp_path):
    path = tmp_path / "best_pgd-test.aa.npz"
    clean = np.zeros((50, 1, 8, 8), np.float32)
    flags = Flags(np.full(50, 2, np.int8), np.arange(50), np.ones((4, 50), bool), clean + 0.5, "fp")
    flags.save(path)
    assert np.array_equal(Flags.load(path, "fp", clean).adv, flags.adv)
    _zero_member(path, "adv.npy")
    with pytest.raises(UserError, match=rf"^{path} is damaged \(Bad CRC-32 for file 'adv.npy': bytes changed or lost "
                                        r"after fastfair wrote it\); delete it, and AutoAttack starts again"):
        Flags.load(path, "fp", clean)


@pytest.mark.fault
def test_a_stored_measurement_with_zeroed_bytes_is_said_and_measured_again(tmp_path, capsys):
    path = tmp_path / "best_pgd-test-pgd10.npz"
    write_npz_atomic({"key": np.array("k"), "acc": np.arange(100.0)}, path)
    _zero_member(path, "acc.npy")
    assert me._stored(path, "k") is None
    assert capsys.readouterr().err == (f"fastfair: warning: {path} is damaged (Bad CRC-32 for file 'acc.npy': bytes "
                                       "changed or lost after fastfair wrote it); measuring again\n")


# ---- FFCV .beton files: a checksum beside them, in meta.json ---------------------------------------
def _fake_ffcv(monkeypatch, content: bytes, replace_fails: bool = False) -> None:
    """FFCV's writer as convert uses it, writing ``content``; ``replace_fails``: the rename into place fails."""
    class DatasetWriter:
        def __init__(self, fname, fields, num_workers):
            self.fname = fname

        def from_indexed_dataset(self, samples):
            Path(self.fname).write_bytes(content)

    monkeypatch.setattr(ffcv, "_ffcv", lambda: SimpleNamespace(RGBImageField=lambda **kw: "rgb", IntField=lambda: 0,
                                                               NDArrayField=lambda *a: "array",
                                                               DatasetWriter=DatasetWriter))
    if replace_fails:
        real = os.replace

        def replace(src, dst):
            if str(dst).endswith(".beton"):
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real(src, dst)
        monkeypatch.setattr(rundir.os, "replace", replace)


@pytest.mark.fault
def test_a_damaged_beton_is_refused_and_a_conversion_stopped_before_its_files_leaves_no_meta(tmp_path, monkeypatch):
    out = tmp_path / "betons"
    convert = ["data", "convert", "--dataset", "digits", "--out", str(out), "--workers", "1"]
    _fake_ffcv(monkeypatch, b"beton bytes " * 100)
    assert cli.main(convert) == 0
    beton = out / "train.beton"
    ffcv.verify_beton(beton)  # intact
    _zero(beton, 500)
    with pytest.raises(UserError, match=rf"^{beton} is damaged: its SHA-256 is not the one {out}/meta.json names "
                                        rf".*; convert again: fastfair data convert --dataset digits --out {out}$"):
        ffcv.verify_beton(beton)

    # meta.json goes before the new files replace the old and comes back after them: a conversion stopped between
    # (here a failed rename) leaves no meta.json, which says to convert again, never checksums of other files
    _fake_ffcv(monkeypatch, b"other bytes", replace_fails=True)
    assert cli.main(convert) == 74
    assert not (out / "meta.json").exists() and beton.read_bytes()[:5] == b"beton"
    with pytest.raises(UserError, match=rf"^{out}/meta.json not found: make the .beton files with"):
        ffcv.read_meta(out)


@pytest.mark.fault
def test_a_beton_is_hashed_once_then_again_only_when_changed_and_data_verify_hashes_it_in_full(tmp_path, monkeypatch,
                                                                                               capsys):
    """Hashing a multi-GB .beton at every open was slow every run: the file's (size, mtime, inode, device) at its
    last full check are kept in a checksummed sidecar, and an open that finds them unchanged reads none of the file.
    A change (here a rewrite, then an edit that keeps the size) is hashed and refused; one that also restores the
    mtime is the trade, caught by `fastfair data verify`."""
    out = tmp_path / "betons"
    _fake_ffcv(monkeypatch, b"beton bytes " * 100)
    assert cli.main(["data", "convert", "--dataset", "digits", "--out", str(out), "--workers", "1"]) == 0
    beton = out / "train.beton"
    hashed = []
    real = ffcv.file_sha256
    monkeypatch.setattr(ffcv, "file_sha256", lambda path: hashed.append(Path(path).name) or real(path))
    for _ in range(2):
        ffcv.verify_beton(beton)
    assert hashed == []  # convert hashed what it wrote: no open reads it again
    sidecar = out / "train.beton.verified.json"
    sidecar.write_text(sidecar.read_text().replace('"size": 1200', '"size": 1201'))  # a damaged sidecar: hash again
    ffcv.verify_beton(beton)
    assert hashed == ["train.beton"] and "is hashed again" in capsys.readouterr().err
    ffcv.verify_beton(beton)
    assert hashed == ["train.beton"]  # and recorded again

    stat = beton.stat()
    _zero(beton, 500)  # same size, a new mtime: hashed at the next open, and refused
    damaged = rf"^{beton} is damaged: its SHA-256 is not the one {out}/meta.json names"
    with pytest.raises(UserError, match=damaged):
        ffcv.verify_beton(beton)
    assert hashed == ["train.beton"] * 2
    os.utime(beton, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the mtime put back: not seen at open (the trade)
    ffcv.verify_beton(beton)
    assert hashed == ["train.beton"] * 2
    capsys.readouterr()
    assert cli.main(["data", "verify", str(out)]) == 2
    assert re.match(damaged, _one_error(capsys.readouterr().err))
