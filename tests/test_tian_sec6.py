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


def test_dropped_note_names_each_dropped_class():
    from fastfair.data.subsets import dropped_note

    assert dropped_note([], ["a", "b"]) == ""
    assert dropped_note([3], ["0", "1", "2", "3"]).startswith("trained without class 3 (data.drop_classes)")
    assert dropped_note([1, 2], ["cat", "dog", "ship"]) == ("trained without class 1 (dog), class 2 (ship) "
                                                           "(data.drop_classes): the model never saw their training "
                                                           "images (their rows count in the mean and the worst "
                                                           "class)")


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
    assert "Fig. 4" in grid.preset and grid.sets["method.name"] == "pgd-at"
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


def test_a_run_without_a_class_says_so_beside_its_tables(homing_runs, tmp_path, capsys):
    run, note = homing_runs / "without-3", "trained without class 3 (data.drop_classes)"
    assert json.loads((run / "eval" / "best_pgd-test.json").read_text())["dropped_classes"] == [3]
    assert "dropped_classes" not in json.loads((homing_runs / "all" / "eval" / "best_pgd-test.json").read_text())
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--attacks", "clean", "--device", "cpu"]) == 0
    table, _, closing = capsys.readouterr().out.partition("\nrun: ")
    assert note in table.strip().splitlines()[-1]  # right under the per-class table
    assert f"\n  {note}" in closing and closing.index(note) < closing.index("written:")  # and beside the headline
    assert cli.main(["report", str(run), str(homing_runs / "all"), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    comparison, _, sections = md.partition("## Comparison")
    assert f"**without-3: {note}" in comparison and "**all:" not in comparison
    assert f"**T{note[1:]}" in sections.split("## all")[0] and "rained without" not in sections.split("## all")[1]
    assert f"% without-3: {note}" in (tmp_path / "r" / "tables.tex").read_text()
    from fastfair.reports.report import compare  # the table fastfair grid ends with (results.md)

    table = compare([run, homing_runs / "all"]).splitlines()
    assert table[-1].startswith(f"without-3: {note}") and sum("rained without" in line for line in table) == 1
    assert compare([homing_runs / "all"]).count("rained without") == 0


def test_homing_refuses_transfer_and_capped_attacks(homing_runs, capsys):
    for attack in ("transfer:pgd20", "pgd20/10"):
        assert "not offered" in _error(["homing", str(homing_runs), "--attack", attack], capsys)


def test_homing_reuses_each_models_predictions_until_its_checkpoint_changes(homing_runs, tmp_path, monkeypatch):
    import shutil

    from fastfair.evaluation import homing as module

    grid = tmp_path / "grid"
    shutil.copytree(homing_runs, grid, ignore=shutil.ignore_patterns("homing"))  # no cache, no earlier output
    attacked = []
    real = module.predictions
    monkeypatch.setattr(module, "predictions", lambda model, *a, **kw: attacked.append(model) or real(model, *a, **kw))
    argv = ["homing", str(grid), "--attack", "fgsm", "--device", "cpu", "--quiet"]

    def run(*extra) -> tuple[int, dict]:
        attacked.clear()
        assert cli.main([*argv, *extra]) == 0
        return len(attacked), json.loads((grid / "homing" / "homing.json").read_text())

    n, first = run()
    assert n == 3 and (grid / "without-5" / "eval" / "homing" / "best_pgd-test-fgsm.json").is_file()
    n, again = run()
    assert n == 0 and again == first  # every model's predictions come from its cache
    ck_path = grid / "without-5" / "checkpoints" / "best_pgd.pt"
    ck = torch.load(ck_path, weights_only=True)
    name = next(k for k, v in ck["model"].items() if v.is_floating_point())
    ck["model"][name] = ck["model"][name] + 1.0
    torch.save(ck, ck_path)
    n, changed = run()
    assert n == 1 and changed["misclassified"] == first["misclassified"]  # only the changed model is attacked
    assert run("--seed", "7")[0] == 3 and run("--attack", "pgd2")[0] == 3  # other settings: every model again


# ---- the MNIST background data set (Fig. 5) ---------------------------------------------------------------

@pytest.fixture(scope="module")
def mnist_small(tmp_path_factory) -> Path:
    """The first 2000 training and 500 test images of the real MNIST subset (helpers.real_data skips without it)."""
    from helpers import real_data

    with np.load(real_data("mnist-subset.npz")) as f:
        path = tmp_path_factory.mktemp("mnist") / "mnist-small.npz"
        np.savez(path, x_train=f["x_train"][:2000], y_train=f["y_train"][:2000], x_test=f["x_test"][:500],
                 y_test=f["y_test"][:500])
    return path


def test_mnist_background_colours_each_class_and_records_its_parameters(mnist_small, tmp_path, capsys):
    from fastfair.data import load
    from fastfair.data.background import COLOURS

    out = tmp_path / "mnist-bg.npz"
    assert cli.main(["data", "background", "--data-dir", str(mnist_small), "--out", str(out)]) == 0
    assert "#e61919" in capsys.readouterr().out  # class 0's red, as written
    with np.load(mnist_small) as src, np.load(out) as f:
        assert f["x_train"].shape == (2000, 3, 28, 28) and f["x_test"].shape == (500, 3, 28, 28)
        assert f["x_train"].dtype == np.uint8 and np.array_equal(f["y_train"], src["y_train"])
        params = json.loads(str(f["background_params"]))
        assert params["seed"] == 0 and "Sec. 6.2" in params["paper"]
        pairs = ["red", "red", "green", "green", "blue", "blue", "yellow", "yellow", "magenta", "magenta"]
        for split in ("train", "test"):
            x, y, grey = f[f"x_{split}"], f[f"y_{split}"], src[f"x_{split}"]
            for c in range(10):
                colour = np.array(COLOURS[pairs[c]], dtype=np.uint8)
                assert params["colours"][str(c)] == [list(colour)]
                px = x[y == c].transpose(0, 2, 3, 1)
                assert (px[grey[y == c] == 0] == colour).all()  # background: exactly the class's colour
                assert (px[grey[y == c] == 255] == 255).all()  # full strokes stay white
            assert (f[f"background_{split}"] == np.array([COLOURS[pairs[c]] for c in y])).all()
    bundle = load("npz", out)  # fastfair trains on it as it is
    assert bundle.shape == (3, 28, 28) and bundle.classes == [str(i) for i in range(10)]


def test_mnist_background_with_two_colours_a_class_is_seeded(mnist_small, tmp_path):
    spec = ",".join(f"{c}=red/blue" if c == 3 else f"{c}=green" for c in range(10))
    outs = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        outs.append(tmp_path / f"{name}.npz")
        assert cli.main(["data", "background", "--data-dir", str(mnist_small), "--out", str(outs[-1]),
                         "--colours", spec, "--seed", str(seed)]) == 0
    a, b, c = (np.load(p)["background_train"] for p in outs)
    y = np.load(outs[0])["y_train"]
    assert np.array_equal(a, b) and not np.array_equal(a, c)  # the seed, and only the seed, picks the draws
    assert {tuple(v) for v in a[y == 3]} == {(230, 25, 25), (30, 70, 220)}


@pytest.mark.parametrize("extra, match", [
    (["--colours", "0=red"], "no colour for class 1"),
    (["--colours", ",".join(f"{c}=white" for c in range(10))], "would hide them"),
    (["--colours", ",".join(f"{c}=mauve" for c in range(10))], "unknown colour 'mauve'"),
    (["--colours", "eleven=red"], "unknown class 'eleven'"),
])
def test_mnist_background_bad_inputs_are_one_error_line(mnist_small, tmp_path, capsys, extra, match):
    argv = ["data", "background", "--data-dir", str(mnist_small), "--out", str(tmp_path / "x.npz"), *extra]
    assert match in _error(argv, capsys)
    assert not (tmp_path / "x.npz").exists()


def test_mnist_background_refuses_colour_images(tmp_path, capsys):
    from helpers import cifar_layout_npz

    argv = ["data", "background", "--data-dir", str(cifar_layout_npz(tmp_path)), "--out", str(tmp_path / "x.npz")]
    assert "grey digits" in _error(argv, capsys)


# ---- the Fig. 5 preset: PGD-AT on the coloured MNIST ---------------------------------------------------------

FIG5 = "tian-kdd-fig5-madry-mnist-background"


def test_fig5_preset_is_the_papers_mnist_setup_at_eps_half():
    cfg = config.resolve(FIG5)
    assert (cfg.data.dataset, cfg.model.name, cfg.method.name) == ("mnist-background", "small-cnn", "pgd-at")
    assert (cfg.attack.eps, cfg.attack.alpha, cfg.attack.steps) == (0.5, 0.01, 40)  # Sec. 6.2's eps, App. A.1's PGD
    assert (cfg.eval.eps, cfg.eval.attacks, cfg.train.val_attack) == (0.5, ["clean", "pgd40"], "pgd40")
    assert (cfg.train.lr, cfg.train.lr_milestones, cfg.train.epochs, cfg.train.weight_decay) == (0.01, [55, 75, 90],
                                                                                                 100, 2e-4)
    assert (cfg.data.crop_padding, cfg.data.flip) == (0, False)  # MNIST's: no augmentation


def test_fig5_preset_without_its_data_names_the_command_that_writes_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FASTFAIR_DATA", str(tmp_path))
    err = _error(["train", "--config", FIG5, "--device", "cpu", "--out", str(tmp_path / "run")], capsys)
    assert f"fastfair data background --out {tmp_path / 'mnist-background.npz'}" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_fig5_preset_refuses_grey_mnist(mnist_small, tmp_path, capsys):
    err = _error(["train", "--config", FIG5, "--data-dir", str(mnist_small), "--device", "cpu",
                  "--out", str(tmp_path / "run")], capsys)
    assert "no background_params" in err and "fastfair data background" in err


def test_fig5_preset_trains_on_what_data_background_wrote(mnist_small, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FASTFAIR_DATA", str(tmp_path))
    assert cli.main(["data", "background", "--data-dir", str(mnist_small)]) == 0  # --out: where the preset reads
    assert f"train with: fastfair train --config {FIG5}\n" in capsys.readouterr().out
    run = tmp_path / "run"
    assert cli.main(["train", "--config", FIG5, "--epochs", "1", "--quiet", "--device", "cpu", "--out", str(run),
                     "--set", "model.width=4", "--set", "attack.steps=2", "--set", "train.val_attack=fgsm",
                     "--set", "eval.attacks=['clean', 'pgd2']", "--set", "data.val_per_class=10"]) == 0
    record = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    assert record["images"] == 500 and record["eps"] == 0.5
    assert np.array(record["results"]["pgd2"]["confusion"]).sum() == 500


# ---- background replaced at inference (Table 4) -------------------------------------------------------------

def test_replacement_changes_only_background_pixels():
    from fastfair.data.background import replace_background

    rng = np.random.default_rng(0)
    x = rng.integers(0, 200, (5, 3, 6, 6), dtype=np.uint8)
    masks = rng.random((5, 6, 6)) < 0.5
    out = replace_background(x, masks, (255, 255, 255))
    assert (out.transpose(0, 2, 3, 1)[masks] == x.transpose(0, 2, 3, 1)[masks]).all()
    assert (out.transpose(0, 2, 3, 1)[~masks] == 255).all()


def test_border_masks_find_a_square_on_a_plain_background():
    from fastfair.data.background import border_masks

    x = np.full((2, 3, 10, 10), 40, dtype=np.uint8)
    x[:, :, 3:7, 2:6] = 200  # the object
    x[1, :, 0, 0] = 45  # a border pixel a little off the background colour is still background
    masks = border_masks(x, 0.1)
    expected = np.zeros((10, 10), dtype=bool)
    expected[3:7, 2:6] = True
    assert (masks == expected).all()


def _class_masks(run: Path, cls: int, tmp_path: Path, **extra) -> Path:
    _, _, _, _, _, (x, y) = build.from_checkpoint(run / "checkpoints" / "best_pgd.pt", split="test",
                                                   device_name="cpu", data_dir=None, batch_size=None)
    n, shape = int((y == cls).sum()), tuple(x.shape[2:])
    path = tmp_path / "masks.npz"
    np.savez(path, masks=np.random.default_rng(0).random((n, *shape)) < 0.5, **extra)
    return path


def test_background_command_writes_table4_counts_to_its_own_file(homing_runs, tmp_path, capsys):
    run = homing_runs / "all"
    plain = (run / "eval" / "best_pgd-test.json").read_bytes()
    masks = _class_masks(run, 3, tmp_path)
    assert cli.main(["background", str(run), "--class", "3", "--mask", str(masks), "--attacks", "clean,fgsm",
                     "--device", "cpu", "--quiet"]) == 0
    record = json.loads((run / "eval" / "best_pgd-test-background-3-white.json").read_text())
    n = record["images"]
    assert n == len(np.load(masks)["masks"]) and record["colour"] == [255, 255, 255]
    for version in ("original", "replaced"):
        assert set(record["counts"][version]) == {"clean", "fgsm"}
        assert all(sum(row) == n for row in record["counts"][version].values())
    assert record["fingerprint"]["data"] != record["original_fingerprint"]  # the replaced images are fingerprinted
    assert (run / "eval" / "best_pgd-test.json").read_bytes() == plain  # the plain result is untouched


def test_fig6_shows_the_images_table4_counts_with_their_predictions(homing_runs, tmp_path, monkeypatch):
    from fastfair.evaluation import background as module

    run = homing_runs / "all"
    seen = {}
    real = module.figure_6
    monkeypatch.setattr(module, "figure_6", lambda scores, attack, *a: seen.update(scores=scores, attack=attack)
                        or real(scores, attack, *a))
    assert cli.main(["background", str(run), "--class", "3", "--mask", str(_class_masks(run, 3, tmp_path)),
                     "--attacks", "clean,pgd3/10,fgsm", "--examples", "3", "--device", "cpu", "--quiet"]) == 0
    record = json.loads((run / "eval" / "best_pgd-test-background-3-white.json").read_text())
    assert seen["attack"] == "fgsm"  # the first attack made image by image on every image
    for version in ("original", "replaced"):  # the figure's predictions are the ones Table 4 counts
        for attack in ("clean", "fgsm"):
            pred = seen["scores"][version, attack].argmax(1)
            assert np.bincount(pred, minlength=10).tolist() == record["counts"][version][attack]
    _, y = build.splits(config.resolve("demo", {}, []))[1]["test"]
    assert len(record["examples"]) == 3 and all(y[i] == 3 for i in record["examples"])  # test-set indices
    png = Path(record["figure"])
    assert png == run / "eval" / "best_pgd-test-background-3-white.png" and png.read_bytes()[:4] == b"\x89PNG"
    png.unlink()
    assert cli.main(["background", str(run), "--class", "3", "--mask", str(_class_masks(run, 3, tmp_path)),
                     "--attacks", "clean", "--examples", "0", "--device", "cpu", "--quiet"]) == 0
    assert not png.exists() and "figure" not in json.loads((png.with_suffix(".json")).read_text())


def test_fig6_puts_the_images_the_background_makes_robust_first(monkeypatch):
    from fastfair.evaluation import background as module

    drawn = {}
    monkeypatch.setattr(module.figures, "image_grid", lambda columns, titles, *a: drawn.update(c=columns, t=titles))
    # class 1 of 3; images 0..3: image 2 becomes right under the attack (+0.3), image 0 gains more (+0.4) but stays
    # wrong, image 1 loses, image 3 is right before and after
    adv_before = np.array([[0.5, 0.1, 0.4], [0.2, 0.5, 0.3], [0.5, 0.3, 0.2], [0.1, 0.8, 0.1]])
    adv_after = np.array([[0.5, 0.5, 0.0], [0.5, 0.3, 0.2], [0.3, 0.6, 0.1], [0.1, 0.8, 0.1]])
    clean = np.tile([0.2, 0.7, 0.1], (4, 1))
    scores = {("original", "clean"): clean, ("replaced", "clean"): clean,
              ("original", "pgd20"): adv_before, ("replaced", "pgd20"): adv_after}
    images = np.zeros((4, 3, 2, 2), dtype=np.uint8)
    ids = module.figure_6(scores, "pgd20", images, images, np.array([10, 11, 12, 13]), 1, ["a", "b", "c"], 3,
                          "white", Path("unused.png"))
    assert ids == [12, 10, 13] and drawn["t"] == ["test image 12", "test image 10", "test image 13"]
    before, after = drawn["c"][0]  # image 12: before and after, natural then pgd20, (text, right)
    assert before[1] == [("natural: b 0.70, a 0.20", True), ("pgd20: a 0.50, b 0.30", False)]
    assert after[1][1] == ("pgd20: b 0.60, a 0.30", True)


def test_background_adjusted_model_gives_table4_lines_3_and_6(homing_runs, tmp_path, capsys):
    run, adjusted = homing_runs / "all", homing_runs / "without-5"
    masks = _class_masks(run, 3, tmp_path)
    assert cli.main(["background", str(run), "--class", "3", "--mask", str(masks), "--attacks", "clean,fgsm",
                     "--adjusted", str(adjusted), "--examples", "0", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    record = json.loads((run / "eval" / "best_pgd-test-background-3-white.json").read_text())
    adj = record["adjusted"]
    assert adj["checkpoint"] == str(adjusted / "checkpoints" / "best_pgd.pt")
    assert set(adj["counts"]) == {"clean", "fgsm"}
    assert all(sum(row) == record["images"] for row in adj["counts"].values())
    before = record["counts"]["original"]["fgsm"]
    line6 = next(line for line in out.splitlines() if line.startswith("+ training adjustment (fgsm)"))
    cells = [cell.strip() for cell in line6.split("│")[1:]]  # each change is from the first model's original row
    assert cells == [f"{a} ({a - b:+d})" for a, b in zip(adj["counts"]["fgsm"], before)]


def test_background_adjusted_model_of_other_images_is_one_error_line(homing_runs, tmp_path, capsys):
    run = homing_runs / "all"
    masks = str(_class_masks(run, 3, tmp_path))
    other = _train(tmp_path / "other", "--set", "data.test_per_class=20")
    capsys.readouterr()  # training's warnings
    argv = ["background", str(run), "--class", "3", "--mask", masks, "--attacks", "clean", "--device", "cpu"]
    assert "are not those of" in _error([*argv, "--adjusted", str(other)], capsys)
    assert "nowhere" in _error([*argv, "--adjusted", str(tmp_path / "nowhere.pt")], capsys)
    assert "--examples" in _error([*argv, "--examples", "-1"], capsys)


def test_background_table_of_a_run_without_a_class_says_so(homing_runs, tmp_path, capsys):
    run = homing_runs / "without-5"
    masks = _class_masks(run, 3, tmp_path)
    assert cli.main(["background", str(run), "--class", "3", "--mask", str(masks), "--attacks", "clean",
                     "--device", "cpu"]) == 0
    assert "trained without class 5 (data.drop_classes)" in capsys.readouterr().out
    assert json.loads((run / "eval" / "best_pgd-test-background-3-white.json").read_text())["dropped_classes"] == [5]


@pytest.mark.parametrize("change, match", [
    ({"--class": "cat"}, "unknown class 'cat'"),
    ({"--mask": "missing.npz"}, "no such file"),
    ({"--mask": "wrong-shape"}, "it needs ("),
    ({"--mask": "other-class"}, "made for class 5"),
    ({"--colour": "mauve"}, "unknown colour"),
    ({"--attacks": "pgd20x"}, "pgd20x"),
])
def test_background_bad_inputs_are_one_error_line(homing_runs, tmp_path, capsys, change, match):
    run = homing_runs / "all"
    masks = {"wrong-shape": tmp_path / "w.npz", "other-class": _class_masks(run, 3, tmp_path, class_index=5)}
    np.savez(masks["wrong-shape"], masks=np.ones((3, 5, 5), dtype=bool))
    opts = {"--class": "3", "--mask": str(_class_masks(run, 3, tmp_path / "..")), "--colour": "white",
            "--attacks": "clean"}
    for key, value in change.items():
        opts[key] = str(masks.get(value, tmp_path / value if key == "--mask" else value))
    argv = ["background", str(run), "--device", "cpu", "--quiet", *[t for kv in opts.items() for t in kv]]
    assert match in _error(argv, capsys)
