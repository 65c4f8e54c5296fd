"""fastfair data features: Ilyas et al. 2019's robust / non-robust data sets (D_R, D_NR, D_det, D_rand) built from a
run on the real CIFAR-10 subset, the L2 descent they use, what the .npz records, training on it, bad inputs."""
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

from fastfair import build, cli
from fastfair.attacks.l2 import l2_descend, l2_project, l2_step
from fastfair.data.features import quantise
from fastfair.evaluation.per_class import weights_sha256
from helpers import SMALL_RUN, cifar_subset_npz

RUN = ["--epochs", "1", "--device", "cpu", "--quiet", *[a for s in SMALL_RUN for a in ("--set", s)]]
FAST = ["--device", "cpu", "--quiet", "--per-class", "3"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return cifar_subset_npz(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def runs(small, tmp_path_factory):
    """A standard run and a PGD-AT run of a tiny CNN, one epoch each on the subset."""
    root = tmp_path_factory.mktemp("runs")
    for method in ("standard", "pgd-at"):
        assert cli.main(["train", "--dataset", "npz", "--data-dir", str(small), "--method", method,
                         "--out", str(root / method), *RUN]) == 0
    return root


def _load(path):
    with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}


def _model(run):
    _, _, _, model, bundle, _ = build.from_checkpoint(build.checkpoint_path(run), split="test", device_name="cpu",
                                                      data_dir=None, batch_size=None)
    return model.eval(), bundle


def _error(argv, capsys) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    return err[0]


# ---- the L2 descent ----------------------------------------------------------------------------------

def test_l2_step_has_the_step_length_and_projection_lands_on_the_ball_and_in_the_box():
    x = torch.tensor([[[[0.5, 0.5]]], [[[0.2, 0.9]]]])
    grad = torch.tensor([[[[3.0, 4.0]]], [[[0.0, 0.0]]]])
    stepped = l2_step(x, grad, 0.5)
    assert torch.allclose(stepped[0].flatten(), torch.tensor([0.5 - 0.3, 0.5 - 0.4]))  # -0.5 * (3, 4) / 5
    assert torch.equal(stepped[1], x[1])  # a zero gradient does not move
    center = torch.full_like(x, 0.5)
    far = center + torch.tensor([[[[0.3, 0.4]]], [[[0.03, 0.04]]]])  # 0.5 and 0.05 from the centre
    projected = l2_project(far, center, 0.1)
    assert torch.allclose((projected - center)[0].flatten(), torch.tensor([0.06, 0.08]))  # scaled onto the ball
    assert torch.equal(projected[1], far[1])  # inside: unchanged
    assert l2_project(torch.tensor([[[[-0.5, 1.5]]]]), torch.zeros(1, 1, 1, 2), math.inf).flatten().tolist() == [0, 1]


def test_l2_descend_keeps_each_images_lowest_iterate():
    """A step longer than the distance overshoots the minimum: the start (the lower loss) is kept, not the last."""
    goal = torch.tensor([[[[0.5, 0.5]]], [[[0.9, 0.1]]]])
    start = torch.tensor([[[[0.45, 0.5]]], [[[0.1, 0.1]]]])

    def loss(z):
        return (z - goal).flatten(1).norm(dim=1)

    x, best = l2_descend(nn.Identity(), loss, start, start, eps=math.inf, step_size=0.2, steps=1)
    assert torch.equal(x[0], start[0])  # 0.05 from the goal; one step of 0.2 lands 0.15 past it
    assert torch.allclose(x[1].flatten(), torch.tensor([0.3, 0.1]))  # 0.8 away: the step brings it closer
    assert torch.allclose(best, torch.tensor([0.05, 0.6]))


def test_quantise_rounds_to_nearest_and_back_into_the_ball_by_the_fewest_pixels():
    source = torch.zeros(2, 1, 1, 2)
    x = torch.tensor([[[[1.6, 0.6]]], [[[0.6, 0.0]]]]) / 255
    eps = 2.0 / 255  # nearest gives (2, 1)/255, sqrt(5)/255 away: outside; (1, 0)/255 is inside
    q = quantise(x, source, eps)
    assert q[0].flatten().tolist() == [1, 1]  # 1.6 rounded down saves 2^2 - 1^2 = 3 > the excess 5 - 4: one pixel
    assert q[1].flatten().tolist() == [1, 0]
    assert quantise(x).flatten().tolist() == [2, 1, 1, 0]  # without a ball: nearest


def test_quantised_attacks_stay_in_the_ball_and_change_few_pixels():
    """Perturbations on the eps sphere, as L2 PGD leaves them: nearest rounding leaves the ball for most."""
    gen = torch.Generator().manual_seed(0)
    source = torch.randint(64, 192, (64, 3, 8, 8), generator=gen).float() / 255  # far from 0 and 1: no clipping
    delta = torch.randn(source.shape, generator=gen)
    delta = 0.5 * delta / delta.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    x = l2_project(source + delta, source, 0.5)
    q = quantise(x, source, 0.5)
    assert ((q.float() / 255 - source).flatten(1).norm(dim=1) <= 0.5 + 1e-6).all()
    nearest = quantise(x)
    assert ((nearest.float() / 255 - source).flatten(1).norm(dim=1) > 0.5).float().mean() > 0.3
    assert (q != nearest).float().mean() < 0.05


# ---- the data sets, built from runs on the real CIFAR-10 subset ------------------------------------------------

def test_robust_set_moves_each_representation_towards_its_image_from_another_start(runs, small, tmp_path, capsys):
    out = tmp_path / "robust.npz"
    assert cli.main(["data", "features", "robust", str(runs / "pgd-at"), "--out", str(out), "--steps", "10",
                     *FAST]) == 0
    assert f"train with: fastfair train --dataset npz --data-dir {out}" in capsys.readouterr().out
    f, source = _load(out), _load(small)
    model, _ = _model(runs / "pgd-at")
    i, j = f["features_index"], f["features_start"]
    assert len(i) == 30 and (i != j).all()  # 3 of each class, each from another image
    assert np.array_equal(f["y_train"], source["y_train"][i]) and np.array_equal(f["features_label"], f["y_train"])
    assert np.array_equal(f["x_test"], source["x_test"]) and np.array_equal(f["y_test"], source["y_test"])
    with torch.no_grad():
        rep = model.forward_features(torch.from_numpy(source["x_train"][i]).float() / 255)

        def distance(images):
            return (model.forward_features(torch.from_numpy(images).float() / 255) - rep).flatten(1).norm(dim=1)

        before, after = distance(source["x_train"][j]), distance(f["x_train"])
    assert (after < before).all()
    params = json.loads(str(f["features_params"]))
    assert params["dataset"] == "D_R" and params["steps"] == 10 and params["step_size"] == 0.1
    assert params["eps"] is None and params["seed"] == 0 and params["method"] == "pgd-at"
    assert params["distance_ratio_stored"] == pytest.approx(float((after / before).mean()), rel=1e-4)
    assert params["weights_sha256"] == weights_sha256(model)


def test_det_set_stays_within_eps_is_labelled_with_targets_the_model_predicts(runs, small, tmp_path):
    """The tiny one-epoch CNN is smoother than a ResNet: at Ilyas et al.'s eps 0.5 few targets are reached, so the
    test gives the attack a larger ball (eps 8), where a working targeted attack reaches most of them."""
    out = tmp_path / "det.npz"
    assert cli.main(["data", "features", "det", str(runs / "standard"), "--out", str(out), "--eps", "8",
                     "--steps", "40", "--step-size", "0.5", *FAST]) == 0
    f, source = _load(out), _load(small)
    i = f["features_index"]
    assert np.array_equal(f["features_start"], i)
    original = source["y_train"][i]
    assert np.array_equal(f["features_label"], original) and np.array_equal(f["y_train"], (original + 1) % 10)
    moved = (f["x_train"].astype(np.float64) - source["x_train"][i]) / 255
    assert np.linalg.norm(moved.reshape(len(i), -1), axis=1).max() <= 8 + 1e-6
    model, _ = _model(runs / "standard")
    with torch.no_grad():
        predicted = model(torch.from_numpy(f["x_train"]).float() / 255).argmax(1).numpy()
    rate = (predicted == f["y_train"]).mean()
    assert rate > 0.5
    params = json.loads(str(f["features_params"]))
    assert params["target"] == "det" and params["eps"] == 8 and params["target_rate_stored"] == pytest.approx(rate)
    assert params["per_class"] == 3 and params["source"].endswith(".pt") and params["test"] == "the original test set"


def test_rand_targets_are_drawn_by_the_seed(runs, tmp_path):
    def build_rand(name, seed):
        out = tmp_path / f"{name}.npz"
        assert cli.main(["data", "features", "rand", str(runs / "standard"), "--out", str(out), "--steps", "1",
                         "--seed", str(seed), *FAST]) == 0
        return _load(out)

    a, again, other = build_rand("a", 0), build_rand("again", 0), build_rand("other", 1)
    assert all(np.array_equal(a[k], again[k]) for k in a)  # the same file, array for array
    assert not np.array_equal(a["y_train"], other["y_train"])
    assert len(set(a["y_train"].tolist())) > 3  # not a function of the 10 source classes' order


def test_the_written_set_trains_and_tests_on_the_original_test_set(runs, small, tmp_path):
    data = tmp_path / "nonrobust.npz"
    assert cli.main(["data", "features", "non-robust", str(runs / "standard"), "--out", str(data), "--steps", "2",
                     *FAST]) == 0
    run = tmp_path / "on-nonrobust"
    assert cli.main(["train", "--dataset", "npz", "--data-dir", str(data), "--method", "standard", "--out", str(run),
                     *RUN, "--set", "data.val_per_class=1", "--set", "data.batch_size=16"]) == 0
    result = json.loads(next((run / "eval").glob("*-test.json")).read_text())
    assert result["images"] == len(_load(small)["y_test"])
    assert result["classes"] == _load(data)["class_names"].tolist()


def test_a_non_standard_source_for_a_non_robust_set_is_a_warning(runs, tmp_path, capsys):
    assert cli.main(["data", "features", "det", str(runs / "pgd-at"), "--out", str(tmp_path / "d.npz"),
                     "--steps", "1", *FAST]) == 0
    assert "fastfair: warning:" in capsys.readouterr().err


@pytest.mark.parametrize("argv, match", [
    (["robust", "{standard}", "--out", "{tmp}/r.npz"], "trained by method standard"),
    (["robust", "{at}", "--out", "{tmp}/r.npz", "--eps", "0.5"], "--eps: robust"),
    (["det", "{standard}", "--out", "{tmp}/r.txt"], "written as an .npz"),
    (["det", "{standard}", "--out", "{tmp}/exists.npz"], "add --force"),
    (["det", "{standard}", "--out", "{tmp}/r.npz", "--steps", "0"], "--steps"),
    (["det", "{standard}", "--out", "{tmp}/r.npz", "--eps", "-1"], "--eps takes a positive"),
    (["det", "{standard}", "--out", "{tmp}/r.npz", "--per-class", "0"], "--per-class"),
    (["det", "{standard}", "--out", "{tmp}/r.npz", "--per-class", "100"], "keeps every image"),
    (["robustt", "{at}", "--out", "{tmp}/r.npz"], "unknown feature data set 'robustt'"),
    (["det", "{tmp}/no-run", "--out", "{tmp}/r.npz"], "no checkpoint"),
])
def test_bad_inputs_are_one_error_line(runs, tmp_path, capsys, argv, match):
    (tmp_path / "exists.npz").write_bytes(b"")
    names = {"standard": runs / "standard", "at": runs / "pgd-at", "tmp": tmp_path}
    line = _error(["data", "features", *[a.format(**names) for a in argv], "--device", "cpu", "--quiet"], capsys)
    assert match in line
    assert not (tmp_path / "r.npz").exists()
