"""The run directory: file names (the contract between commands), metrics truncation on resume, safe loads."""
import json
import pytest
import torch

from fastfair import rundir
from fastfair.errors import UserError
from fastfair.rundir import EPOCH_NUMBERING, RunDir, load_checkpoint, new_run_id, one_based_epoch, save_atomic


def test_every_file_has_its_contract_name(tmp_path):
    run = RunDir(tmp_path / "r")
    r = tmp_path / "r"
    assert (run.config, run.metrics, run.train_log, run.grid_state) == (
        r / "config.toml", r / "metrics.jsonl", r / "train.log", r / "grid-state.json")
    assert run.last == r / "checkpoints" / "last.pt"
    assert run.best("fair") == r / "checkpoints" / "best_fair.pt"
    assert run.best("pgd", averaged=True) == r / "checkpoints" / "best_pgd_avg.pt"
    assert run.checkpoint("last", averaged=True) == r / "checkpoints" / "last_avg.pt"
    assert run.eval_file(run.best("pgd"), "test") == r / "eval" / "best_pgd-test.json"
    assert run.diagnostics_file(run.last, "val", "pgd20") == r / "diagnostics" / "last-val-pgd20.json"


def test_a_checkpoint_belongs_to_its_run_or_its_folder(tmp_path):
    assert RunDir.of_checkpoint(tmp_path / "r" / "checkpoints" / "best_pgd.pt").path == tmp_path / "r"
    assert RunDir.of_checkpoint(tmp_path / "elsewhere" / "model.pt").path == tmp_path / "elsewhere"


def test_selected_checkpoint_follows_the_policy_name(tmp_path):
    run = RunDir(tmp_path)
    assert run.selected_checkpoint("last") == run.last
    assert run.selected_checkpoint("pgd") == run.best("pgd")
    assert run.selected_checkpoint("fair", averaged=True).name == "best_fair_avg.pt"
    assert run.selected_checkpoint("last", averaged=True).name == "last_avg.pt"


def test_truncation_keeps_only_the_epochs_before_the_resumed_one(tmp_path):
    run = RunDir(tmp_path)
    run.write_config("preset = \"\"\n", new_run_id())
    for epoch in (1, 2, 3):
        run.append_metrics({"epoch": epoch})
    run.truncate_metrics(2)  # last.pt holds epoch 2: epoch 3's line was written before a kill
    assert [r["epoch"] for r in run.read_metrics()] == [1, 2]
    assert run.read_config() == "preset = \"\"\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    empty = RunDir(tmp_path / "new")
    empty.truncate_metrics(0)
    assert empty.read_metrics() == [] and not empty.metrics.exists()


def test_runs_from_before_the_one_based_numbering_read_one_based(tmp_path):
    run = RunDir(tmp_path)
    for epoch in (0, 1, 2):  # metrics.jsonl of an older run: numbered from 0
        run.append_metrics({"epoch": epoch})
    assert [r["epoch"] for r in run.read_metrics()] == [1, 2, 3]
    run.truncate_metrics(2)  # resuming it after its second epoch rewrites it 1-based
    assert [json.loads(line)["epoch"] for line in run.metrics.read_text().splitlines()] == [1, 2]
    save_atomic({"epoch": 1}, tmp_path / "old.pt")  # an older checkpoint of the second epoch
    assert load_checkpoint(tmp_path / "old.pt", needs=("epoch",))["epoch"] == 2
    assert one_based_epoch({"epoch": 1}) == 2 and one_based_epoch({"epoch": 1, **EPOCH_NUMBERING}) == 1


def test_checkpoints_round_trip_and_other_paths_are_user_errors(tmp_path):
    save_atomic({"epoch": 3, **EPOCH_NUMBERING, "w": torch.ones(2)}, tmp_path / "a.pt")
    ck = load_checkpoint(tmp_path / "a.pt", needs=("epoch",))
    assert ck["epoch"] == 3 and torch.equal(ck["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]  # no temporary file left behind
    with pytest.raises(UserError, match="not a run directory.*fastfair train"):
        RunDir(tmp_path).read_config()
    with pytest.raises(UserError, match="no checkpoint at .*pass a run directory"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    with pytest.raises(UserError, match="not a checkpoint written by fastfair train"):
        load_checkpoint(tmp_path / "notes.txt")


@pytest.mark.fault
def test_ctrl_c_during_an_atomic_write_lands_after_it_and_leaves_no_temporary_file(tmp_path):
    import os
    import signal

    from fastfair.rundir import write_text_atomic

    def interrupted_save(f):  # Ctrl-C arrives while the checkpoint is being written
        os.kill(os.getpid(), signal.SIGINT)
        torch.save({"w": torch.ones(3)}, f)

    # as in a fresh `fastfair` process: Python's own handler (a test before this one in the worker may have left
    # another, and with another the write rightly leaves Ctrl-C to it)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            rundir._replace_atomic(interrupted_save, tmp_path / "best.pt")
        assert torch.equal(torch.load(tmp_path / "best.pt", weights_only=True)["w"], torch.ones(3))  # whole, not torn
        assert [p.name for p in tmp_path.iterdir()] == ["best.pt"]  # no .best.pt.*.tmp left behind
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Python's handler is back
        write_text_atomic("after", tmp_path / "note.txt")  # and later writes are not deferred forever
        assert (tmp_path / "note.txt").read_text() == "after"
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.fault
def test_taking_over_a_dead_holders_lock_removes_its_unfinished_writes(tmp_path, monkeypatch):
    """A run killed mid-save leaves its atomic writes' temporary files, named for its host and pid, wherever it was
    writing (a checkpoint, the final evaluation's JSON); the next holder of the lock removes them (the files they
    were for are whole or absent) and says so. Another process's temporary file stays; a clean start touches
    nothing."""
    monkeypatch.setattr(rundir, "_HOST", "node7")
    run = RunDir(tmp_path / "r")
    (run.path / "checkpoints").mkdir(parents=True)
    (run.path / "eval").mkdir()
    run.lock_file.write_text("pid 4242 on node7")  # the killed holder's name; its flock died with it
    torn = [run.path / "checkpoints" / ".last.pt.node7.4242.ab1.tmp", run.path / "eval" / ".b.json.node7.4242.x1.tmp"]
    others = [run.path / "eval" / ".b.json.node7.4243.x2.tmp", run.path / "eval" / ".b.json.node8.4242.x3.tmp"]
    for tmp in torn + others:
        tmp.write_bytes(b"half a file")
    kept = run.path / "checkpoints" / "last.pt"
    kept.write_bytes(b"whole")
    said = []
    with run.lock(said.append):
        pass
    assert not any(t.exists() for t in torn) and all(t.exists() for t in others) and kept.read_bytes() == b"whole"
    assert said == [f"{run.path}: taking over the lock of pid 4242 on node7, which is no longer running; removed "
                    "its unfinished checkpoints/.last.pt.node7.4242.ab1.tmp, eval/.b.json.node7.4242.x1.tmp"]
    said.clear()
    with run.lock(said.append):
        pass
    assert said == []
