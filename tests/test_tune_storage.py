"""fastfair tune's storage failing (issue 58, item 6): two processes starting one new study, a damaged study.db and a
full disk under it are one line each with what to do (they were 90 to 131 lines of SQLAlchemy's traceback)."""
import subprocess
import threading
from pathlib import Path

import pytest

from fastfair import cli
from fastfair.tuning import study as tuning
from helpers import needs_extra

optuna = needs_extra("tune", "optuna")


def _study(root: Path, storage: str | None = None) -> tuning.Study:
    """A new study of trades on the demo (nothing trained): its study.toml written, as `fastfair tune --methods`
    writes it before its first trial."""
    settings = tuning._settings("trades", str(root), "demo", None, [], 10, 1, None, None, None, storage, 0, 0)
    root.mkdir(parents=True, exist_ok=True)
    settings.write(root / "study.toml")
    return tuning.open_study(root, None, None)


def test_workers_starting_a_new_study_at_once_make_its_storage_once(tmp_path):
    # threads, each with its own connection and its own open of the lock file: the race of two processes (without
    # the lock, one of the four fails on alembic_version's duplicate row), at a thread's cost
    study = _study(tmp_path / "s")
    go, errors = threading.Barrier(4), []

    def start():
        go.wait()
        try:
            with study.storage_errors():
                study.optuna_study(study.settings.contenders()[0], study.storage())
        except Exception as err:  # noqa: BLE001 -- any error is the failure this test looks for
            errors.append(err)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [s.study_name for s in optuna.get_all_study_summaries(study.storage_url())] == ["s:trades"]


@pytest.mark.parametrize("damage", ["zeroed", "truncated", "bad header"])
def test_a_damaged_study_db_is_one_line_under_show_and_continue(damage, tmp_path, capsys):
    root = tmp_path / "s"
    study = _study(root)
    study.optuna_study(study.settings.contenders()[0], study.storage())
    db = root / "study.db"
    data = db.read_bytes()
    db.write_bytes({"zeroed": bytes(len(data)), "truncated": data[:1000],
                    "bad header": b"not an sqlite db" + data[16:]}[damage])
    for args in (["--show"], []):
        assert cli.main(["tune", str(root), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"fastfair: error: {db} is damaged ("), err
        assert err[0].endswith("Optuna cannot read the study from it; restore it from a copy (SQLite keeps no backup "
                               "of its own), or start the study again in another folder (--out); a study on --storage "
                               "journal:FILE, an append-only log, loses at most its last line to a torn write"), err


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MB tmpfs (a real full disk for SQLite's own writes, which no Python hook sees); root needed."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN): no small disk to fill")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_under_study_db_is_one_line_and_the_study_reads_whole_after(small_disk, tmp_path, capsys):
    db = small_disk / "study.db"
    root = tmp_path / "s"
    study = _study(root, storage=f"sqlite:///{db}")
    study.optuna_study(study.settings.contenders()[0], study.storage())
    filler = small_disk / "filler"
    with open(filler, "wb", buffering=0) as f:  # every byte left, so SQLite's next page or journal finds none
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    f.write(bytes(size))
            except OSError:
                pass
    assert cli.main(["tune", str(root)]) == 74  # its first write: asking the sampler for a trial
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"fastfair: error: cannot write {db}: no space left on the device ("), err
    assert err[0].endswith("free on " + str(small_disk) + "); the study's finished trials are kept in it; free some "
                           "space, then run the same command again"), err
    filler.unlink()
    assert [s.study_name for s in optuna.get_all_study_summaries(study.storage_url())] == ["s:trades"]
