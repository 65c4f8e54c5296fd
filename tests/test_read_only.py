"""Commands on a run folder of a read-only filesystem, and a report's --out that is a file (issue 58, item 7): one
line each, before any work, naming where else to write; they were EROFS and NotADirectoryError tracebacks."""
import shutil
import subprocess
from pathlib import Path

import pytest

from evalreport_helpers import digits_run
from fastfair.cli import main


@pytest.fixture(scope="module")
def read_only_run(tmp_path_factory):
    """A copy of the shared digits run on a tmpfs mounted read-only (a real EROFS; root bypasses permission bits,
    so a chmod would prove nothing where the suite runs as root)."""
    mount = tmp_path_factory.mktemp("ro")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN): no read-only filesystem to test on")
    try:
        run, _ = digits_run()
        shutil.copytree(run, mount / "run")
        subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        yield mount / "run"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_report_on_a_read_only_run_says_where_else_to_write_and_does_so(read_only_run, tmp_path, capsys):
    assert main(["report", str(read_only_run)]) == 74
    assert _one_line(capsys) == (f"fastfair: error: cannot write in {read_only_run}/report/figures: the filesystem is "
                                 "read-only; nothing was written; write the report elsewhere: --out DIR, or make it "
                                 "writable, then run the same command again")
    assert main(["report", str(read_only_run), "--out", str(tmp_path / "r"), "--attack", "clean"]) == 0
    assert (tmp_path / "r" / "report.md").is_file()


@pytest.mark.parametrize("command", [["eval", "--attacks", "clean"], ["diagnose", "--attack", "fgsm", "--tsne", "0"]])
def test_eval_and_diagnose_of_a_read_only_run_refuse_before_the_work(read_only_run, command, capsys, monkeypatch):
    from fastfair import build

    def no_work(*a, **k):
        raise AssertionError("the checkpoint was loaded: the refusal came after the work started")

    if command[0] == "diagnose":  # diagnose knows its file from the path alone; eval once the data set is read
        monkeypatch.setattr(build, "from_checkpoint", no_work)
    assert main([command[0], str(read_only_run), *command[1:]]) == 74
    line = _one_line(capsys)
    folder = "eval" if command[0] == "eval" else "diagnostics"
    assert line.startswith(f"fastfair: error: cannot write in {read_only_run}/{folder}: the filesystem is read-only; "
                           "nothing was written; copy the run to a writable disk and ")


def test_report_out_naming_a_file_is_one_line(tmp_path, capsys):
    run, _ = digits_run()
    out = tmp_path / "report.md"
    out.write_text("mine\n")
    assert main(["report", str(run), "--out", str(out)]) == 2
    fix = f"e.g. --out {tmp_path / 'report'}-report"
    assert _one_line(capsys) == (f"fastfair: error: --out {out} is a file; a report is a folder (report.md, "
                                 f"tables.tex, figures/): give a folder's path, {fix}")
    assert out.read_text() == "mine\n" and sorted(Path(tmp_path).iterdir()) == [out]
