"""Tian et al. KDD 2021 Sec. 6 experiments: data.drop_classes and the homing matrices (Fig. 4), the MNIST
background data set (Fig. 5), the background replaced at inference (Table 4)."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fastfair import build, cli, config
from fastfair.data import subsets
from fastfair.data.datasets import DataBundle
from fastfair.errors import UserError
from fastfair.evaluation.homing import homing_matrix, misclassified_matrix
from fastfair.scaleout.grid import load, run_grid

ROOT = Path(__file__).resolve().parents[1]
# the demo preset (scikit-learn digits) cut to seconds, as tests/test_bad_inputs.py trains it
FAST = ["--quiet", "--set", "model.width=4", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm",
        "--set", "eval.attacks=['clean', 'fgsm']", "--set", "data.batch_size=256", "--device", "cpu"]


def _train(out: Path, *extra: str) -> Path:
    assert cli.main(["train", "--config", "demo", "--epochs", "1", *FAST, "--out", str(out), *extra]) == 0
    return out


def _error(argv: list[str], capsys) -> str:
    """The one ``fastfair: error:`` line a bad command prints (exit code 2)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    return err[0]


# ---- data.drop_classes -----------------------------------------------------------------------------------

def _bundle() -> DataBundle:
    y = torch.arange(40) % 4
    x = y.to(torch.uint8)[:, None, None, None].expand(40, 1, 2, 2).clone()
    return DataBundle("toy", x, y, x[:8].clone(), y[:8].clone(), ["a", "b", "c", "d"])


def test_drop_classes_removes_train_and_val_images_and_keeps_labels_head_and_test():
    bundle = _bundle()
    from fastfair.data import split
    sp = split(bundle, val_per_class=2)
    out = subsets.drop_from_training(bundle, sp, [1, 3])
    for name in ("train", "val"):
        x, y = out[name]
        assert set(y.tolist()) == {0, 2}  # labels not renumbered: the head keeps 4 outputs
        assert torch.equal(x[:, 0, 0, 0].long(), y)  # each image still with its own label
        assert len(y) == (sp[name][1] % 2 == 0).sum()
    assert out["test"] is sp["test"]  # the test set stays whole


def test_drop_classes_in_a_run_keeps_the_head_and_the_test_set():
    cfg = config.resolve("demo", {"data.drop_classes": [3]}, [])
    bundle, sp = build.training_splits(cfg)
    assert bundle.num_classes == 10 and 3 not in sp["train"][1].tolist() and 3 not in sp["val"][1].tolist()
    _, whole = build.splits(config.resolve("demo", {}, []))
    assert torch.equal(sp["test"][1], whole["test"][1])


@pytest.mark.parametrize("drop, match", [([10], "in 0..9"), (list(range(10)), "at least two"),
                                         (list(range(9)), "leaves 1 of the 10")])
def test_bad_drop_classes_are_user_errors(drop, match):
    with pytest.raises(UserError, match=match):
        build.training_splits(config.resolve("demo", {"data.drop_classes": drop}, []))


def test_drop_classes_refuses_a_worst_class_selection_and_the_ffcv_loader():
    with pytest.raises(UserError, match="no validation images"):
        build.training_splits(config.resolve("demo", {"data.drop_classes": [2], "train.select": "worst"}, []))
    with pytest.raises(UserError, match="loader=device"):
        build.splits(config.resolve("demo", {"data.drop_classes": [2], "data.loader": "ffcv"}, []))


# ---- the homing matrices (Fig. 4) --------------------------------------------------------------------------

def test_homing_matrices_on_a_hand_made_case():
    #            img: 0  1  2  3  4  5  6
    y = np.array([0, 0, 0, 1, 1, 2, 2])
    base = np.array([0, 1, 2, 0, 2, 1, 1])  # the attack sends 0->1, 0->2, 1->0, 1->2, 2->1, 2->1
    without = {1: np.array([0, 0, 2, 1, 1, 2, 0]),  # re-trained without 1: img 1 homes (0), img 5 homes (2), 6 not
               2: np.array([1, 1, 1, 1, 0, 2, 2])}  # without 2: img 2 goes to 1 (a new confound), img 4 to 0
    mis = misclassified_matrix(y, base, 3)
    assert mis.tolist() == [[0, 1, 1], [1, 0, 1], [0, 2, 0]]
    home = homing_matrix(y, base, without, 3)
    assert np.isnan(home[:, 0]).all()  # no run without class 0
    assert home[0, 1] == 1 and home[2, 1] == 1 and np.isnan(home[1, 1])
    assert home[0, 2] == 0 and home[1, 2] == 0 and np.isnan(home[2, 2])
    assert (np.nan_to_num(home) <= mis).all()  # a cell of (b) counts part of the same cell of (a)


def test_the_shipped_grid_trains_once_on_every_class_and_once_without_each_class(tmp_path):
    grid, _ = load(str(ROOT / "configs" / "grids" / "tian-kdd-fig4-homing.toml"))
    assert [r.point["data.drop_classes"] for r in grid.runs()] == [[]] + [[c] for c in range(10)]
    assert "Fig. 4" in grid.preset and grid.sets["method.name"] == "trades"
    lines = []
    assert run_grid("tian-kdd-fig4-homing", out=str(tmp_path), dry_run=True, echo=lines.append) == 0
    assert sum("pending" in line for line in lines) == 11 and any("without-5-dog" in line for line in lines)


@pytest.fixture(scope="module")
def homing_runs(tmp_path_factory) -> Path:
    grid = tmp_path_factory.mktemp("homing-grid")
    _train(grid / "all")
    for c in (3, 5):
        _train(grid / f"without-{c}", "--set", f"data.drop_classes=[{c}]")
    return grid


def test_homing_command_writes_fig4_from_a_grid_folder(homing_runs, capsys):
    assert cli.main(["homing", str(homing_runs), "--attack", "fgsm", "--device", "cpu", "--quiet"]) == 0
    assert "homing.md" in capsys.readouterr().out
    out = homing_runs / "homing"
    record = json.loads((out / "homing.json").read_text())
    # (a) is the off-diagonal of `fastfair eval`'s confusion of the same run, attack and seed
    evaluated = json.loads((homing_runs / "all" / "eval" / "best_pgd-test.json").read_text())
    conf = np.array(evaluated["results"]["fgsm"]["confusion"])
    np.fill_diagonal(conf, 0)
    assert record["misclassified"] == conf.tolist()
    home = record["homing"]
    assert all(home[i][j] is None for i in range(10) for j in range(10) if j not in (3, 5) or i == j)
    assert all(0 <= home[i][j] <= record["misclassified"][i][j] for i in range(10) for j in (3, 5) if i != j)
    assert (out / "homing.png").stat().st_size > 0 and "Homing confusion matrix" in (out / "homing.md").read_text()


@pytest.mark.parametrize("pick, match", [
    (lambda g: [g / "without-3", g / "without-5"], "exactly one run trained on every class"),
    (lambda g: [g / "all"], "no run was trained without a class"),
    (lambda g: [g / "all", g / "nowhere"], "is not a folder"),
])
def test_homing_bad_inputs_are_one_error_line(homing_runs, capsys, pick, match):
    err = _error(["homing", *map(str, pick(homing_runs)), "--attack", "fgsm", "--quiet"], capsys)
    assert match in err


def test_homing_refuses_an_unknown_attack_before_any_work(homing_runs, capsys):
    assert "pgd20x" in _error(["homing", str(homing_runs), "--attack", "pgd20x"], capsys)
