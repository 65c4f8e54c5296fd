"""Progress: plain periodic lines (epoch, step, img/s, ETA) where output is not a terminal, and the run's log file."""
import io

from fastfair import progress as progress_module
from fastfair.progress import Progress


class Clock:
    """time.monotonic that advances 10 s per call, so a 30 s period fires every few steps."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        self.t += 10.0
        return self.t


def test_plain_lines_every_period_on_a_log_and_in_the_log_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(progress_module.time, "monotonic", Clock())
    p = Progress(enabled=True, every_s=30.0, log_file=tmp_path / "train.log")
    p.console.file = io.StringIO()  # not a terminal: no bar
    with p.task("epoch 2/5", 12, images_per_step=64) as advance:
        for _ in range(12):
            advance()
    lines = [line for line in capsys.readouterr().out.splitlines() if line]
    # the task starts at t=10 and step k ends at 10 + 10k: a line every 3 steps (30 s), none at the end;
    # 0.1 step/s of 64 images = 6 img/s, 9 steps left take 90 s
    assert lines == ["epoch 2/5  step 3/12  6 img/s  ETA 0:01:30", "epoch 2/5  step 6/12  6 img/s  ETA 0:01:00",
                     "epoch 2/5  step 9/12  6 img/s  ETA 0:00:30"]
    assert (tmp_path / "train.log").read_text().splitlines() == lines


def test_a_quiet_run_still_logs_to_its_file_and_prints_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(progress_module.time, "monotonic", Clock())
    p = Progress(enabled=False, every_s=30.0, log_file=tmp_path / "train.log")
    p.print("epoch   1  loss 2.3")
    with p.task("epoch 1/1", 4) as advance:
        for _ in range(4):
            advance()
    assert capsys.readouterr().out == ""
    logged = (tmp_path / "train.log").read_text().splitlines()
    assert logged == ["epoch   1  loss 2.3", "epoch 1/1  step 3/4  ETA 0:00:10"]


def test_no_second_copy_when_stdout_already_is_the_log_file(tmp_path, monkeypatch):
    log = tmp_path / "train.log"
    with open(log, "w") as f:  # a grid sends the run's stdout to its train.log
        monkeypatch.setattr(progress_module.sys, "stdout", f)
        assert Progress(enabled=True, log_file=log).log_file is None
    assert Progress(enabled=True, log_file=tmp_path / "other.log").log_file == tmp_path / "other.log"


def test_lines_said_before_the_run_folder_exists_reach_its_log_file(tmp_path, capsys):
    p = Progress(enabled=True)
    p.console.file = io.StringIO()
    p.print("quick run: trained on the first 5/class of digits")  # said while the data loads
    p.attach(tmp_path / "train.log")
    p.print("epoch   1  loss 2.3")
    assert (tmp_path / "train.log").read_text().splitlines() == [
        "quick run: trained on the first 5/class of digits", "epoch   1  loss 2.3"]
