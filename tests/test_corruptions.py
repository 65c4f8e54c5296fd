"""CIFAR-10-C's corruptions (fastfair/attacks/corruptions.py): each against the authors' make_cifar_c.py on its own
random numbers, the draws fastfair makes, the names, and per-class evaluation through the CLI."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastfair import cli
from fastfair.attacks import corruptions, names
from fastfair.errors import UserError
from fastfair.evaluation import seeds
from fastfair.evaluation.per_class import check_attack_names, evaluate
from evalreport_helpers import cifar_npz
from helpers import fastfair

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
sys.path.insert(0, str(GOLDEN))
import corruptions_reference as reference  # noqa: E402  (its seeds and names; it imports nothing of the reference)

# Integer or elementwise-only arithmetic matches the reference to the level; the filters and colour maps sum in
# another order than numpy/scipy/OpenCV/ImageMagick (OpenCV's defocus kernel is float32, ImageMagick works in 16-bit
# quanta), so a value landing within rounding of an 8-bit level may be truncated to the level below: at most 1
# level, on at most 3 % of the values (measured at most 1.8 %, motion_blur; a wrong parameter, border rule or
# rounding moves most values: rounding motion_blur's output instead of truncating it changes 52 %).
EXACT = {"gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise", "pixelate", "jpeg_compression"}


class Replay:
    """numpy's legacy generator from the reference's seed, drawn in the reference's order and (H, W, C) layout, handed
    to fastfair in its own (1, C, H, W) layout: the formulas then see the reference's random numbers."""

    device = torch.device("cpu")

    def __init__(self, seed: int):
        self.rs = np.random.RandomState(seed)

    @staticmethod
    def _ours(a, shape) -> torch.Tensor:
        a = np.asarray(a)
        return torch.as_tensor(a.transpose(2, 0, 1) if len(shape) == 4 else a).reshape(shape)

    @staticmethod
    def _theirs(shape) -> tuple:
        return (shape[2], shape[3], shape[1]) if len(shape) == 4 else tuple(shape[1:])

    def normal(self, shape, loc=0.0, scale=1.0):
        return self._ours(self.rs.normal(loc, scale, self._theirs(shape)), shape)

    def uniform(self, shape, low, high):
        return self._ours(self.rs.uniform(low, high, self._theirs(shape)), shape)

    def random(self, shape):
        return self._ours(self.rs.random_sample(self._theirs(shape)), shape)

    def poisson(self, rate):
        return self._ours(self.rs.poisson(rate[0].permute(1, 2, 0).numpy()), rate.shape).double()

    def integers(self, low, high, shape):  # glass_blur: one (dx, dy) per position, drawn one position at a time
        return torch.as_tensor(np.stack([self.rs.randint(low, high, size=(2,)) for _ in range(np.prod(shape[:-1]))])
                               ).reshape(shape)


@pytest.fixture(scope="module")
def golden():
    meta = json.loads((GOLDEN / "corruptions.json").read_text())
    with np.load(GOLDEN / "corruptions.npz") as f, np.load(GOLDEN / "inputs.npz") as inputs:
        return meta, {k: f[k] for k in f.files}, inputs["x_uint8"][:reference.IMAGES]


def test_the_golden_file_covers_every_implemented_corruption(golden):
    meta, outputs, _ = golden
    assert set(meta["names"]) == set(outputs) == set(corruptions.CORRUPTIONS) == set(reference.NAMES)
    assert meta["commit"] == reference.PINNED


@pytest.mark.parametrize("name", sorted(corruptions.CORRUPTIONS))
def test_each_corruption_matches_the_authors_script_on_its_random_numbers(golden, name):
    _, outputs, x = golden
    for severity in corruptions.SEVERITIES:
        for i, image in enumerate(x):
            ours = corruptions.corrupt(torch.as_tensor(image[None]).float() / 255, name, severity,
                                       Replay(reference.seed(name, severity, i)))
            diff = (ours[0] * 255).round().long().numpy() - outputs[name][severity - 1, i].astype(np.int64)
            where = f"{name}@{severity}, image {i}"
            if name in EXACT:
                assert not diff.any(), f"{where}: {np.count_nonzero(diff)} values differ"
            else:
                assert np.abs(diff).max() <= 1 and np.mean(diff != 0) <= 0.03, \
                    f"{where}: max {np.abs(diff).max()} levels, {np.mean(diff != 0):.1%} of values differ"


def test_the_draws_fastfair_makes_have_the_papers_distributions():
    grey = torch.full((64, 3, 32, 32), 128 / 255)  # away from 0 and 1, so no clipping
    with seeds.seeded(0, "test", 0, device=torch.device("cpu")):
        noisy = corruptions.corrupt(grey, "gaussian_noise", 5)  # c = 0.10
        shot = corruptions.corrupt(grey, "shot_noise", 1)  # Poisson(500 x) / 500: mean x, std sqrt(x / 500)
        impulse = corruptions.corrupt(grey, "impulse_noise", 5)  # 7 % of values to 0 or 1, half each
    # truncation to 8 bits lowers each value by half a level on average
    assert abs(float((noisy - grey).std()) - 0.10) < 0.002 and abs(float((noisy - grey).mean()) + 0.5 / 255) < 0.001
    assert abs(float((shot - grey).mean()) + 0.5 / 255) < 0.001
    assert abs(float((shot - grey).std()) - (128 / 255 / 500) ** 0.5) < 0.001
    assert abs(float((impulse == 1).float().mean()) - 0.035) < 0.003
    assert abs(float((impulse == 0).float().mean()) - 0.035) < 0.003
    assert torch.equal(impulse[(impulse != 0) & (impulse != 1)], grey[(impulse != 0) & (impulse != 1)])
    fractal = corruptions.plasma_fractal(4, 32, 2.0, corruptions.TorchDraws("cpu"))
    assert torch.equal(fractal.amin((1, 2)), torch.zeros(4)) and torch.equal(fractal.amax((1, 2)), torch.ones(4))


def test_the_same_seed_gives_the_same_images_and_the_callers_stream_is_untouched():
    x = torch.rand(6, 3, 32, 32)
    torch.manual_seed(5)
    before = torch.rand(3)
    torch.manual_seed(5)
    runs = []
    for seed in (0, 0, 1):
        with seeds.seeded(seed, "corrupt:fog@3", 0, device=torch.device("cpu")):
            runs.append(torch.cat([corruptions.corrupt(x, n, 3) for n in ("fog", "glass_blur", "elastic_transform")]))
    assert torch.equal(torch.rand(3), before)
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    out = corruptions.corrupt(x, "contrast", 5)
    assert out.dtype == x.dtype and torch.equal(out, torch.floor(out * 255) / 255)  # 8-bit levels, as stored


def test_names_parse_and_groups_expand():
    attack = names.parse_attack("corrupt:fog@3")
    assert attack.search == corruptions.Corrupt("fog", 3) and attack.seed_name == "corrupt:fog@3"
    assert names.parse_attack("corrupt:fog@3/20").per_class == 20
    every = names.members("corrupt:all@5")
    assert len(every) == 14 and every[0] == "corrupt:gaussian_noise@5" and "corrupt:saturate@5" not in every
    assert names.members("corrupt:extra@2/50") == ["corrupt:speckle_noise@2/50", "corrupt:gaussian_blur@2/50",
                                                   "corrupt:saturate@2/50"]
    check_attack_names(["clean", "corrupt:all@1", "corrupt:extra@5", "corrupt:jpeg_compression@4/10"])


@pytest.mark.parametrize("name, says", [
    ("corrupt:fgo@3", "Did you mean fog?"),
    ("corrupt:jpeg@2", "Did you mean jpeg_compression?"),
    ("corrupt:fog", "give a severity 1 to 5 after @"),
    ("corrupt:fog@6", "give a severity 1 to 5 after @"),
    ("corrupt:all@0", "give a severity 1 to 5 after @"),
    ("corrupt:frost@1", "frost photographs"),
    ("corrupt:spatter@4", "Canny"),
    ("transfer:corrupt:fog@3", "transfer: takes a white-box attack"),
    ("fog", "Did you mean corrupt:fog@S"),
    ("cifar10-c", "Did you mean corrupt:all@S"),
])
def test_bad_names_say_what_to_type(name, says):
    with pytest.raises(UserError, match=None) as err:
        check_attack_names([name])
    assert says in str(err.value)


def test_colour_corruptions_refuse_one_channel_before_anything_runs():
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 2))
    x, y = torch.rand(4, 1, 8, 8), torch.tensor([0, 1, 0, 1])
    calls = []
    model.register_forward_hook(lambda *a: calls.append(1))
    with pytest.raises(UserError, match="corrupt:brightness changes an RGB image"):
        evaluate(model, [(x, y)], ["clean", "corrupt:all@2"], eps=0.1, alpha=0.01, classes=["a", "b"])
    assert not calls
    grey = evaluate(model, [(x, y)], ["corrupt:gaussian_noise@2", "corrupt:pixelate@5"], eps=0.1, alpha=0.01,
                    classes=["a", "b"])
    assert sum(map(sum, grey["corrupt:pixelate@5"]["confusion"])) == 4


def _tiny_run(tmp_path: Path) -> Path:
    data = cifar_npz(tmp_path, train=20, test=3)
    run = tmp_path / "run"
    assert cli.main(["train", "--method", "standard", "--dataset", "npz", "--data-dir", str(data), "--out", str(run),
                     "--epochs", "1", "--model", "tiny-cnn", "--set", "model.width=4", "--set", "data.batch_size=20",
                     "--set", "data.val_per_class=2", "--set", "train.val_attack=fgsm", "--set",
                     "eval.attacks=['clean']", "--set", "train.lr_milestones=[]", "--set", "train.progress=false",
                     "--quiet"]) == 0
    return run


@pytest.mark.slow
def test_per_class_accuracy_under_corruptions_through_the_cli(tmp_path, capsys):
    run = _tiny_run(tmp_path)
    attacks = "clean,corrupt:all@5,corrupt:saturate@2/2"
    done = fastfair("eval", run, "--attacks", attacks)
    assert done.returncode == 0, done.stderr
    assert "┃ corrupt:" in done.stdout and "under clean worst class" in done.stdout  # the headline names attacks only
    path = run / "eval" / "best_pgd-test.json"
    results = json.loads(path.read_text())["results"]
    group = results["corrupt:all@5"]
    assert group["members"] == names.members("corrupt:all@5") and len(group["per_class"]) == 10
    np.testing.assert_allclose(group["per_class"], np.mean([results[m]["per_class"] for m in group["members"]], 0))
    assert results["corrupt:saturate@2/2"]["images"] == 20
    # the same numbers in another process, image for image: the corruptions are seeded per batch
    first = {n: results[n]["confusion"] for n in results}
    path.unlink()
    assert cli.main(["eval", str(run), "--attacks", attacks, "--quiet"]) == 0
    again = json.loads(path.read_text())["results"]
    assert {n: again[n]["confusion"] for n in again} == first
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--attacks", "clean,corrupt:fgo@3", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "corrupt:fgo@3: unknown corruption 'fgo'. Did you mean fog?" in err and "Traceback" not in err
