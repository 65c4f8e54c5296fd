"""fastfair grid: expansion, idempotent and resumable runs, failures recorded, the comparison table."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fastfair import cli, config
from fastfair.evaluation import intervals
from fastfair.errors import UserError
from fastfair.scaleout.grid import load, run_grid
from fastfair.scaleout.jobs import Job, outcome, read_state, run_job
from fastfair.scaleout import launchers
from fastfair.scaleout.launchers import slot_envs
from helpers import jobs_in_process

ROOT = Path(__file__).parents[1]

# A few seconds per run on 2 CPU cores: digits, a 4-channel tiny CNN, standard training, 2 epochs
# (the grid machinery is under test here, not the method).
TINY = """
base = "demo"
[set]
"model.width" = 4
"train.epochs" = 2
"method.name" = "standard"
"train.device" = "cpu"
"train.progress" = false
"train.val_attack" = "fgsm"
"eval.attacks" = ["clean", "fgsm"]
"data.batch_size" = 128
"""


def _write(tmp_path, text, name="g.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_product_and_zipped_axes_expand_to_named_runs(tmp_path):
    path = _write(tmp_path, TINY + """
[[axes]]
keys = ["method.name", "method.kl_weight"]
values = [["trades", 6], ["me-trades", 27]]
[[axes]]
key = "train.seed"
values = [0, 1, 2]
[[axes]]
key = "attack.eps"
values = [0.1, 0.05]
labels = ["big", "small"]
""")
    grid, _ = load(str(path))
    runs = grid.runs()
    assert len(runs) == 2 * 3 * 2
    assert runs[0].name == "name=trades-kl_weight=6,seed=0,big"
    assert runs[-1].name == "name=me-trades-kl_weight=27,seed=2,small"
    assert runs[7].point == {"method.name": "me-trades", "method.kl_weight": 27, "train.seed": 0, "attack.eps": 0.05}
    assert runs[7].sets["train.epochs"] == 2 and runs[7].sets["attack.eps"] == 0.05  # the axis wins over [set]


def test_same_leaf_on_two_axes_uses_full_keys(tmp_path):
    grid, _ = load(str(_write(tmp_path, TINY + """
[[axes]]
key = "attack.eps"
values = [0.1]
[[axes]]
key = "eval.eps"
values = [0.1]
""")))
    assert grid.runs()[0].name == "attack.eps=0.1,eval.eps=0.1"


@pytest.mark.parametrize("axes, message", [
    ('[[axes]]\nkeys = ["method.name", "method.kl_weight"]\nvalues = [["trades"]]', "each a list of 2"),
    ('[[axes]]\nkey = "train.seed"\nvalues = [0, 0]', "share a name"),
    ('[[axes]]\nkey = "train.seed"\nvalues = [0, 1]\nlabels = ["a"]', "1 labels for 2 values"),
    ('[[axes]]\nkey = "train.seed"\nkeys = ["train.seed"]\nvalues = [0]', "either key"),
    ('[[axes]]\nkey = "train.seed"\nvalues = [0]\n[[axes]]\nkey = "train.seed"\nvalues = [1]', "two axes"),
])
def test_bad_axes_are_user_errors(tmp_path, axes, message):
    path = _write(tmp_path, TINY + axes)
    with pytest.raises(UserError, match=message):
        load(str(path)).__getitem__(0).runs()


def test_unknown_key_names_the_run_and_close_matches(tmp_path):
    path = _write(tmp_path, TINY + '[[axes]]\nkey = "method.kl_wieght"\nvalues = [1.0]\n')
    with pytest.raises(UserError, match=r"run kl_wieght=1.0: unknown config key.*method.kl_weight"):
        run_grid(str(path), out=str(tmp_path / "out"), dry_run=True, echo=lambda *_: None)


def test_set_values_round_trip_through_the_command_line(tmp_path):
    from fastfair.scaleout.grid import toml_value

    for value in (6, 0.03125, 2e-4, "me-trades", True, [75, 90], ["clean", "pgd20"]):
        assert config.parse_set([f"k={toml_value(value)}"])["k"] == value


def test_slots_per_gpu_and_cpu_share(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    envs = slot_envs(["0", "1"], 2)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["OMP_NUM_THREADS"] for e in envs} == {"4"}
    assert slot_envs([], 3) == [{"OMP_NUM_THREADS": "5"}] * 3


def _grid_cmd(path, out):
    return [sys.executable, "-m", "fastfair", "grid", str(path), "--out", str(out), "--gpus", "cpu"]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for a parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _env():  # the children import this checkout
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _grid_with_a_bad_run(tmp_path, base: str):
    """(grid file, bad file): ``base`` with three runs; seeds 0 and 1 train, the third starts from ``bad``, a file
    that is no checkpoint, and fails."""
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    path = _write(tmp_path, base + f"""
[[axes]]
keys = ["train.seed", "train.init_from"]
values = [[0, ""], [1, ""], [2, "{bad}"]]
labels = ["a", "b", "c"]
""")
    return path, bad


@pytest.mark.slow
def test_killed_grid_resumes_and_skips_done_runs(tmp_path, monkeypatch):
    # seeds a and b train (a failed run's record: test_data_dir_and_set_reach_every_run_and_a_failed_childs_error_shows)
    path = _write(tmp_path, TINY + '[[axes]]\nkey = "train.seed"\nvalues = [0, 1]\nlabels = ["a", "b"]\n')
    out = tmp_path / "out"
    proc = subprocess.Popen(_grid_cmd(path, out), env=_env(), cwd=ROOT, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 900  # a bound for a hang only: a grid that ended is what poll() catches
    while not (out / "b" / "checkpoints" / "last.pt").is_file():  # run b has finished its first epoch
        assert proc.poll() is None and time.time() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the grid (its child trains in a process group of its own)
    proc.wait()
    state = lambda r: json.loads((out / r / "grid-state.json").read_text())
    assert state("a")["status"] == "done" and state("b")["status"] == "running"
    child = state("b")["pid"]
    deadline = time.time() + 10
    while _alive(child):  # the child dies with the grid: no orphan keeps training
        assert time.time() < deadline, "the grid's training child outlived it"
        time.sleep(0.05)
    a_ckpt = (out / "a" / "checkpoints" / "last.pt").stat().st_mtime_ns

    lines = []
    jobs_in_process(monkeypatch, launchers)  # the re-run's resume in this process: the kill above was the processes'
    assert run_grid(str(path), out=str(out), gpus="cpu", echo=lines.append) == 0
    assert state("a")["attempt"] == 1  # done: not re-run
    assert (out / "a" / "checkpoints" / "last.pt").stat().st_mtime_ns == a_ckpt
    assert state("b")["status"] == "done" and state("b")["attempt"] == 2
    assert "--resume" in state("b")["command"]
    epochs = [json.loads(l)["epoch"] for l in (out / "b" / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]  # resumed after epoch 1, no epoch logged twice
    assert "\n".join(lines).splitlines()[-1] == "2 of 2 runs finished, 0 failed"

    table = (out / "results.md").read_text().splitlines()
    assert table[0].startswith("| run | seeds | clean avg | clean worst | fgsm avg")  # fastfair report's table
    (row,) = [l for l in table[2:] if l.startswith("|") and l.split("|")[2].strip() == "2"]
    evals = [json.loads((out / r / "eval" / "best_pgd-test.json").read_text())["results"]["clean"]["summary"]["avg"]
             for r in "ab"]
    # seeds a and b folded into mean ± sd with Student's t interval of the mean (cut to 0-100), said under the table
    mean, sd, lo, hi = intervals.seed_interval(evals)
    assert row.split("|")[3].strip() == f"{mean:.2f} ± {sd:.2f} [{max(lo, 0):.1f}, {min(hi, 100):.1f}]"
    assert any(l.startswith("Intervals (95 %): a group of seeds: mean ± sd over its seeds") for l in table)


GRIDS = ROOT / "configs" / "grids"


def test_me_table2_grid_resolves_every_run(tmp_path):
    lines = []
    run_grid(str(GRIDS / "me-table2-lambda.toml"), out=str(tmp_path), dry_run=True, echo=lines.append)
    assert "8 runs" in lines[0] and "Table 2" in lines[0]  # the preset line follows the header
    assert sum("pending" in line for line in lines) == 8 and "me-trades-l27,seed=0" in "".join(lines)
    cmd = lines[-1]
    assert "method.kl_weight=6" in cmd and "attack.eps=0.03125" in cmd and "train.lr_milestones=[75, 90]" in cmd


def test_cfa_fig5a_grid_sweeps_five_budgets():
    grid, _ = load(str(GRIDS / "cfa-fig5a-ccm-budget.toml"))
    assert "Fig. 5(a)" in grid.preset
    assert [r.point["ccm.lambda_1"] for r in grid.runs()] == [0.3, 0.4, 0.5, 0.6, 0.7]


def test_cfa_fig5a_grid_resolves_every_run(tmp_path):
    lines = []
    assert run_grid(str(GRIDS / "cfa-fig5a-ccm-budget.toml"), out=str(tmp_path), dry_run=True, echo=lines.append) == 0
    assert any("ccm.enabled=true" in l for l in lines) and any("ccm.lambda_1=0.7" in l for l in lines)


# ---- fastfair grid as a user types it: --data-dir, --set, the data checked first, a child's error shown ----

# TINY on an npz data set the command line points at; a few seconds per run
NPZ_GRID = TINY + """
"data.dataset" = "npz"
"data.val_per_class" = 5
"train.lr_milestones" = []
"""


def _npz(tmp_path) -> Path:
    """A synthetic 3-class data set of 8x8 grey images, 30 training and 5 test images per class."""
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny.npz"
    np.savez(path, x_train=rng.integers(0, 256, (90, 8, 8), dtype=np.uint8), y_train=np.arange(90) % 3,
             x_test=rng.integers(0, 256, (15, 8, 8), dtype=np.uint8), y_test=np.arange(15) % 3)
    return path


def _cli(capsys, *args) -> tuple[int, list[str], list[str]]:
    code = cli.main(["grid", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_grid_help_says_where_the_data_comes_from(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    assert cli.main(["grid", "--help"]) == 0
    text = " ".join(w for w in capsys.readouterr().out.split() if w != "│")  # rich's box edges between wrapped lines
    assert "--data-dir, else the grid's data.data_dir, else $FASTFAIR_DATA" in text
    assert "--set" in text and "not a key the grid's axes sweep" in text


def test_grid_without_its_data_says_where_it_looked_and_starts_nothing(tmp_path, capsys):
    path = _write(tmp_path, NPZ_GRID + '[[axes]]\nkey = "train.seed"\nvalues = [0, 1]\n')
    out = tmp_path / "out"
    code, _, err = _cli(capsys, path, "--out", out, "--gpus", "cpu", "--data-dir", tmp_path / "nowhere.npz")
    assert code == 2 and len(err) == 1
    assert err[0].startswith("fastfair: error: grid g (every run): the npz data set needs --data-dir FILE.npz")
    assert f"there is no file {tmp_path / 'nowhere.npz'}" in err[0]
    assert not out.exists()  # no run folder, no grid folder: nothing started


def test_shipped_grid_without_cifar10_names_the_folder_and_how_to_point_at_it(tmp_path, capsys, monkeypatch):
    import torchvision
    from urllib.error import URLError

    def offline(self):
        raise URLError("offline")

    monkeypatch.setattr(torchvision.datasets.CIFAR10, "download", offline)  # no test downloads 170 MB
    empty = tmp_path / "data"
    empty.mkdir()
    code, _, err = _cli(capsys, "me-table2-lambda", "--out", tmp_path / "out", "--data-dir", empty)
    assert code == 2 and len(err) == 1
    assert f"grid me-table2-lambda (every run): CIFAR10 is not under {empty}" in err[0]
    assert "--data-dir FOLDER" in err[0] and "FASTFAIR_DATA=FOLDER" in err[0]
    assert not (tmp_path / "out").exists()


def test_a_batch_larger_than_a_runs_data_stops_the_grid_before_any_run(tmp_path, capsys):
    path = _write(tmp_path, TINY + '[[axes]]\nkey = "data.batch_size"\nvalues = [64, 100000]\n')
    code, _, err = _cli(capsys, path, "--out", tmp_path / "out", "--gpus", "cpu")
    assert code == 2 and err == ["fastfair: error: grid g, run batch_size=100000: data.batch_size=100000 is more "
                                 "than the 1337 training images (after the validation split); lower data.batch_size"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--set", "train.seed=5"], "--set train.seed: grid g sweeps train.seed (axes[0] of its file)"),
    (["--set", "seed=5"], "'seed' is ambiguous; write one of train.seed, eval.seed"),  # as train says it
    (["--set", "kl_weight=3"], "--set kl_weight: grid g sweeps method.kl_weight (axes[1]"),  # a bare key is the same
    (["--data-dir", "x.npz"], "--data-dir: grid g sweeps data.data_dir (axes[2]"),
    (["--set", "train.sed=1"], "unknown config key 'train.sed' (from --set). Did you mean train.seed"),
    (["--set", "train.epochs"], "--set takes key=value"),  # train's own parser and checks
    (["--set", "train.epochs=0"], "train.epochs=0 is out of range"),
])
def test_set_on_a_swept_key_or_a_bad_set_is_one_error_line(tmp_path, capsys, args, message):
    path = _write(tmp_path, TINY + """
[[axes]]
key = "train.seed"
values = [0, 1]
[[axes]]
keys = ["method.name", "method.kl_weight"]
values = [["trades", 6]]
[[axes]]
key = "data.data_dir"
values = ["a.npz"]
""")
    code, _, err = _cli(capsys, path, "--out", tmp_path / "out", "--dry-run", *args)
    assert code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.slow
def test_data_dir_and_set_reach_every_run_and_a_failed_childs_error_shows(tmp_path, capsys, monkeypatch):
    jobs_in_process(monkeypatch, launchers)  # what reaches the runs and what a failed one said: no process needed
    npz = _npz(tmp_path)
    path, bad = _grid_with_a_bad_run(tmp_path, NPZ_GRID)
    out = tmp_path / "out"
    code, lines, _ = _cli(capsys, path, "--out", out, "--gpus", "cpu", "--per-gpu", 3, "--data-dir", npz,
                          "--set", "train.epochs=1", "--set", "batch_size=16")  # 3 slots: the runs at once
    assert code == 1
    assert f'every run with: data.data_dir="{npz}" train.epochs=1 data.batch_size=16' in lines
    for run in "ab":  # the recorded config of every run, as train read the flags
        saved = config.load_saved(out / run / "config.toml")
        assert (saved["data"]["data_dir"], saved["train"]["epochs"], saved["data"]["batch_size"]) == (str(npz), 1, 16)
    (failed,) = [line for line in lines if line.startswith("failed ")]  # said when it ends ...
    assert failed.startswith(f"failed c: fastfair: error: {bad} is not a checkpoint")
    assert failed.endswith(f"(log: {out / 'c' / 'train.log'})")
    assert lines[-3:] == ["2 of 3 runs finished, 1 failed",  # ... and in the summary
                          "  " + failed[len("failed "):],
                          "fix the cause and run the same command again: done runs are skipped, the others resume"]
    state = read_state(out / "c")
    assert state["status"] == "failed" and state["returncode"] == 2 and state["attempt"] == 1
    assert "is not a checkpoint" in (out / "c" / "train.log").read_text()
    _, said, _ = _cli(capsys, path, "--out", out, "--gpus", "cpu", "--per-gpu", 3, "--data-dir", npz, "--set",
                      "train.epochs=1", "--set", "batch_size=16", "--dry-run")  # the same command, a dry run
    assert "2 done" in said[0] and "failed" in said[-2] and "first command:" in said[-1]
    assert read_state(out / "c")["attempt"] == 1  # a dry run runs nothing


def test_a_crashed_childs_last_traceback_line_is_its_error(tmp_path, monkeypatch):
    monkeypatch.setattr(Job, "command", lambda self: [sys.executable, "-c", "print('epoch 1'); raise "
                                                                            "RuntimeError('CUDA out of memory')"])
    job = Job("r", str(tmp_path / "r"), "", ())
    assert run_job(job) == "failed"
    assert read_state(job.run_dir)["error"] == "RuntimeError: CUDA out of memory"
    assert outcome("r", job.run_dir) == f"r: RuntimeError: CUDA out of memory (log: {tmp_path / 'r' / 'train.log'})"


def test_a_relative_data_dir_is_saved_absolute(tmp_path, capsys, monkeypatch):
    """Every run's config names the data so that a later eval or a SLURM task started elsewhere finds it."""
    monkeypatch.chdir(tmp_path)
    _npz(tmp_path)
    path, _ = _grid_with_a_bad_run(tmp_path, NPZ_GRID)
    code, lines, _ = _cli(capsys, path, "--out", tmp_path / "out", "--dry-run", "--data-dir", "tiny.npz")
    assert code == 0 and f'every run with: data.data_dir="{tmp_path / "tiny.npz"}"' in lines
