"""The CLI as a user types it (subprocesses, real data)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cifar_subset_npz

ROOT = Path(__file__).resolve().parents[1]


def fastfair(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "fastfair", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_listings_name_their_papers():
    methods = fastfair("methods").stdout
    for name in ("standard", "pgd-at", "trades", "me-at", "me-trades"):
        assert name in methods
    assert "ME paper" in methods and "Madry" in methods
    assert "train.select" in methods and "CFA's choice" in methods  # the selection policies
    assert "resnet18" in fastfair("models").stdout
    assert "digits" in fastfair("datasets").stdout
    assert "Table 2" in fastfair("presets").stdout


def test_unknown_method_lists_the_known_ones(tmp_path):
    r = fastfair("train", "--method", "me-trade", "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert "unknown method 'me-trade'" in r.stderr and "me-trades" in r.stderr and "Traceback" not in r.stderr


def test_missing_data_names_the_flag_and_the_download(tmp_path):
    r = fastfair("train", "--method", "pgd-at", "--dataset", "cifar10", "--data-dir", str(tmp_path / "none"),
                 "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert "--data-dir" in r.stderr and "cifar-10-python.tar.gz" in r.stderr and "Traceback" not in r.stderr


def test_eval_of_a_folder_that_is_not_a_run_names_the_fix(tmp_path):
    r = fastfair("eval", str(tmp_path), "--quiet")
    assert r.returncode == 2 and "not a run directory (no config.toml)" in r.stderr and "Traceback" not in r.stderr
    r = fastfair("eval", str(tmp_path / "missing.pt"), "--quiet")
    assert r.returncode == 2 and "no checkpoint at" in r.stderr and "Traceback" not in r.stderr


def test_bad_set_key_suggests_the_right_one(tmp_path):
    r = fastfair("train", "--method", "trades", "--set", "train.learning_rate=0.1", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "unknown config key 'train.learning_rate'" in r.stderr


@pytest.mark.slow
def test_me_trades_end_to_end_on_real_cifar10(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=600, n_test=200)
    out = tmp_path / "run"
    r = fastfair("train", "--method", "me-trades", "--dataset", "npz", "--data-dir", str(npz), "--model", "tiny-cnn",
                 "--epochs", "2", "--out", str(out), "--set", "data.val_per_class=10", "--set", "data.batch_size=50",
                 "--set", "attack.steps=3", "--set", "train.lr_milestones=[1]",
                 "--set", "eval.attacks=['clean','pgd5']")
    assert r.returncode == 0, r.stderr
    for cls in ("airplane", "cat", "truck"):
        assert f"| {cls} |" in r.stdout
    assert "**worst class**" in r.stdout and "MCD" in r.stdout
    result = json.loads((out / "eval" / "best_pgd-test.json").read_text())
    pgd = result["results"]["pgd5"]
    assert len(pgd["per_class"]) == 10 and pgd["summary"]["avg"] <= result["results"]["clean"]["summary"]["avg"]
    # eval on the run directory as a user would, on the validation split
    r = fastfair("eval", str(out), "--attacks", "clean,fgsm", "--split", "val", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (out / "eval" / "best_pgd-val.json").is_file()
