"""Class-aware re-sampling and targeted adversarial training (Benz et al. 2021, Sec. 2.2 and 3.3)."""
import json

import pytest
import torch
from torch import nn

from fastfair import cli, config
from fastfair.data.loaders import DeviceLoader
from fastfair.data.sampling import ClassIndex, draw
from fastfair.errors import UserError
from fastfair.methods.resampling import error_factor, power_law
from fastfair.rundir import load_checkpoint
from fastfair.scaleout import distributed
from fastfair.training.trainer import Trainer

from helpers import cifar_subset_npz, make_method, small_run_config

EPS = 8 / 255


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_drawn_class_frequencies_match_p_and_each_class_is_drawn_uniformly():
    y = torch.tensor([0] * 50 + [1] * 200 + [2] * 10 + [3] * 40)  # long-tailed, class 3 at p = 0
    p = torch.tensor([0.5, 0.2, 0.3, 0.0])
    n = 200_000
    idx = draw(p, ClassIndex(y, 4), n, gen())
    freq = torch.bincount(y[idx], minlength=4).double() / n
    sd = (p * (1 - p) / n).sqrt().double()
    assert torch.all((freq - p.double()).abs() <= 5 * sd + 1e-12), freq  # 5 sigma; the seed is fixed
    assert freq[3] == 0
    # within class 2 (10 images, p 0.3): each image drawn with probability 0.03
    per_image = torch.bincount(idx, minlength=len(y))[250:260].double() / n
    assert torch.all((per_image - 0.03).abs() <= 5 * (0.03 * 0.97 / n) ** 0.5)
    assert torch.equal(idx, draw(p, ClassIndex(y, 4), n, gen()))  # the same generator state, the same draw


def test_the_draw_never_picks_a_class_of_p_0_even_where_the_total_rounds():
    y = torch.tensor([0, 1, 2])
    p = torch.tensor([1.0, 0.0, 0.0])  # u * total can round up to the total: the cap keeps class 0
    assert torch.all(draw(p, ClassIndex(y, 3), 10_000, gen()) == 0)


def loader(y, batch=8):
    x = torch.arange(len(y), dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 1, 2, 2).contiguous()
    return DeviceLoader(x, y, batch, device="cpu", train=True, seed=3)


def epoch_labels(ld, epoch):
    ld.set_epoch(epoch)
    return torch.cat([yb for _, yb in ld])


def test_device_loader_draws_by_class_per_epoch_reproducibly_and_keeps_the_epoch_size():
    y = torch.arange(4).repeat_interleave(16)  # 64 images, balanced
    ld = loader(y)
    p = torch.tensor([0.7, 0.1, 0.1, 0.1])
    ld.draw_classes(p)
    assert len(ld) == 8
    a = epoch_labels(ld, 5)
    assert len(a) == 64 and torch.equal(a, epoch_labels(ld, 5)) and not torch.equal(a, epoch_labels(ld, 6))
    assert (a == 0).sum() > 30  # 0.7 of 64, against 16 in a shuffle
    x, _ = next(iter(ld))
    assert x.dtype == torch.float32 and x.shape == (8, 1, 2, 2)
    p.copy_(torch.tensor([0.0, 0.0, 0.0, 1.0]))  # held by reference: the next epoch draws with the new values
    assert torch.all(epoch_labels(ld, 5) == 3)


def test_torchrun_ranks_take_their_slices_of_the_same_class_drawn_batches(monkeypatch):
    y, p = torch.arange(4).repeat_interleave(16), torch.tensor([0.7, 0.1, 0.1, 0.1])

    def batches(ld):
        ld.draw_classes(p)  # through RankSlice under torchrun
        ld.set_epoch(2)
        return [yb for _, yb in ld]

    whole = batches(loader(y))
    for rank in (0, 1):
        monkeypatch.setattr(distributed, "_ctx", distributed.Context(rank=rank, world=2))
        mine = batches(distributed.train_loader(loader(y)))
        assert len(mine) == len(whole) and all(torch.equal(m, w[4 * rank:4 * rank + 4]) for m, w in zip(mine, whole))


def test_power_law_and_error_factor_golden_values():
    # Kang et al. 2020, Eq. 1: q = 0.5 on counts 100, 25, 0 -> 10 : 5 : 0
    assert torch.allclose(power_law(torch.tensor([100, 25, 0]), 0.5), torch.tensor([10, 5, 0]) / 15)
    assert torch.allclose(power_law(torch.tensor([100, 25, 0]), 0.0), torch.tensor([0.5, 0.5, 0.0]))
    base = torch.tensor([0.5, 0.25, 0.25])
    f = error_factor(base, torch.tensor([0.5, 0.75, 1.0]))  # errors 0.5, 0.25, 0 -> 0.25 : 0.0625 : 0
    assert torch.allclose(base * f, torch.tensor([0.25, 0.0625, 0.0]) / 0.3125)
    assert torch.equal(error_factor(base, torch.ones(3)), torch.ones(3))  # nobody errs: the base


def resampling_method(*sets, y=None):
    m, state = make_method("pgd-at", *sets)
    ld = loader(torch.tensor([0] * 10 + [1] * 20 + [2] * 30) if y is None else y)
    m.use_loader(ld, state)
    return m, state, ld


def test_resampling_probabilities_given_from_power_and_auto_update():
    _, state, ld = resampling_method("resampling.weights=[2, 1, 1]")
    assert torch.allclose(state["sampling"], torch.tensor([0.5, 0.25, 0.25])) and ld.class_p is state["sampling"]
    _, state, _ = resampling_method("resampling.power=0")  # class-balanced on 10/20/30 images
    assert torch.allclose(state["sampling"], torch.full((3,), 1 / 3))
    m, state, _ = resampling_method("resampling.auto=true")  # base: the natural 1/6, 2/6, 3/6
    m.end_epoch(state, 0, {"train_acc_per_class": [50.0, 75.0, 100.0], "val": {}})
    want = torch.tensor([1 * 0.5, 2 * 0.25, 0.0]) / 1.0
    assert torch.allclose(state["sampling"], want) and torch.isclose(state["sampling"].sum(), torch.tensor(1.0))


@pytest.mark.parametrize("sets, y, says", [
    (["resampling.weights=[1, 1, 1]"], torch.arange(3).repeat(5), "changes nothing"),
    (["resampling.power=0.5"], torch.arange(3).repeat(5), "changes nothing"),
    (["resampling.weights=[1, 2, 3]"], None, "changes nothing"),  # the training set's own 10:20:30
    (["resampling.weights=[1, 1]"], None, "needs 3 values"),
    (["resampling.weights=[0, 0, 1]"], torch.tensor([0, 1, 1, 0]), "classes without training images"),
])
def test_resampling_that_would_do_nothing_or_cannot_run_is_refused(sets, y, says):
    with pytest.raises(UserError, match=says):
        resampling_method(*sets, y=y)


@pytest.mark.parametrize("sets, says", [
    (["resampling.weights=[1, 2, 3]", "resampling.power=0.5"], "either resampling.weights"),
    (["resampling.weights=[1, -1, 3]"], "at least 0"),
    (["resampling.weights=[0, 0, 0]"], "not all 0"),
    (["resampling.power=-1"], "power=-1"),
    (["resampling.auto=true", "data.loader=ffcv"], "use --loader device"),
    (["targeted_attack.target=-2"], "from 0"),
    (["targeted_attack.fraction=0.5"], "needs a target class"),
    (["targeted_attack.target=1", "targeted_attack.fraction=0"], r"in \(0, 1\]"),
    (["targeted_attack.target=1", "method.name=trix"], "method trix makes its training examples with its own attack"),
    (["targeted_attack.target=1", "method.name=standard"], "method standard trains on no adversarial examples"),
])
def test_bad_option_values_are_one_error_before_any_work(sets, says):
    with pytest.raises(UserError, match=says):
        config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"}, sets)


def test_a_target_outside_the_run_s_classes_is_refused():
    with pytest.raises(UserError, match=r"classes are 0..2"):
        make_method("pgd-at", "targeted_attack.target=3")


def adversarial(method, *sets, seed=0):
    m, state = make_method(method, *sets, classes=10)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(192, 32), nn.ReLU(), nn.Linear(32, 10))  # no BN: rows independent
    with torch.no_grad():
        model[1].weight.mul_(12)  # steep enough that an eps of 8/255 moves the softmax by tenths
    x, y = torch.rand(50, 3, 8, 8), torch.arange(10).repeat(5)
    torch.manual_seed(seed)
    return model, x, y, m.perturb(model, x, y, state)


@pytest.mark.parametrize("method", ["pgd-at", "trades"])
def test_targeted_attack_stays_in_the_ball_and_moves_other_classes_towards_the_target(method):
    model, x, y, plain = adversarial(method)
    _, _, _, aimed = adversarial(method, "targeted_attack.target=2")
    assert (aimed - x).abs().max() <= EPS + 1e-6 and aimed.min() >= 0 and aimed.max() <= 1
    with torch.no_grad():
        p_plain, p_aimed = model(plain).softmax(1)[:, 2], model(aimed).softmax(1)[:, 2]
    other = y != 2
    assert p_aimed[other].mean() > p_plain[other].mean() + 0.1
    assert torch.all(p_aimed[other] >= p_plain[other] - 1e-6)  # per image, not only on average
    # the target's own images keep the method's untargeted attack: the same start and steps, the same points
    assert torch.equal(aimed[~other], plain[~other])


def test_targeted_fraction_attacks_some_images_towards_the_target():
    model, x, y, plain = adversarial("pgd-at")
    _, _, _, half = adversarial("pgd-at", "targeted_attack.target=2", "targeted_attack.fraction=0.5")
    _, _, _, full = adversarial("pgd-at", "targeted_attack.target=2")
    # the fraction's draw comes before the random start, so compare by images moved towards class 2
    with torch.no_grad():
        towards = [(model(a).softmax(1)[:, 2][y != 2]).mean() for a in (plain, half, full)]
    assert towards[0] < towards[1] < towards[2]


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return cifar_subset_npz(tmp_path_factory.mktemp("data"), n_train=160, n_test=50)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# the small run cut further: a 4-channel CNN, one attack step, 2 validation images per class, FGSM validation
QUICK = ["model.width=4", "attack.steps=1", "data.val_per_class=2", "train.val_attack=fgsm", "train.amp=off"]


def test_resampling_auto_resumes_exactly(npz, tmp_path):
    cfg = small_run_config(npz, "pgd-at", *QUICK, "train.epochs=2", "resampling.auto=true", "resampling.power=0.5")
    straight = Trainer(cfg, tmp_path / "straight", quiet=True)
    counts = straight.train_loader.class_counts(10).float()
    straight.fit()
    killed = Trainer(cfg, tmp_path / "resumed", quiet=True)
    killed.run_epoch(0)
    del killed
    Trainer(cfg, tmp_path / "resumed", resume=True, quiet=True).fit()
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "resumed")
    keys = ("loss", "train_robust_acc_per_class", "vectors")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    wa = load_checkpoint(tmp_path / "straight" / "checkpoints" / "last.pt")["model"]
    wb = load_checkpoint(tmp_path / "resumed" / "checkpoints" / "last.pt")["model"]
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    p1, p2 = (torch.tensor(r["vectors"]["sampling"]) for r in a)
    base = counts.sqrt() / counts.sqrt().sum()
    assert torch.allclose(p1, base)  # square-root sampling in the first epoch (Kang et al. 2020, q = 0.5)
    acc = torch.tensor(a[0]["train_robust_acc_per_class"]) / 100
    want = base * (1 - acc) / (base * (1 - acc)).sum()
    assert torch.allclose(p2, want, atol=1e-6)  # then towards the classes it gets wrong


def cli_train(npz, out, method, *sets):
    quick = [a for s in QUICK for a in ("--set", s)]
    return cli.main(["train", "--method", method, "--dataset", "npz", "--data-dir", str(npz), "--model", "tiny-cnn",
                     "--epochs", "1", "--out", str(out), "--quiet", *quick, "--set", "data.batch_size=64",
                     "--set", "train.lr_milestones=[]", "--set", "eval.attacks=['clean']", *sets])


@pytest.mark.parametrize("method, sets", [
    ("trades", ["--set", "resampling.weights=[1,1,1,4,1,1,1,1,1,1]", "--set", "targeted_attack.target=3"]),
    ("pgd-at", ["--set", "resampling.power=0", "--set", "targeted_attack.target=3",
                "--set", "targeted_attack.fraction=0.5"]),
])
def test_cli_runs_both_options_with_at_and_trades_on_real_cifar10(npz, tmp_path, method, sets, capsys):
    out = tmp_path / "run"
    assert cli_train(npz, out, method, *sets) == 0, capsys.readouterr().err
    saved = config.load_saved_text((out / "config.toml").read_text())
    assert saved.targeted_attack.target == 3 and set(saved.enabled_options()) >= {"resampling", "targeted_attack"}
    (record,) = metrics(out)
    p = torch.tensor(record["vectors"]["sampling"])
    want = torch.tensor([1, 1, 1, 4, 1, 1, 1, 1, 1, 1]) / 13 if method == "trades" else torch.full((10,), 0.1)
    assert torch.allclose(p, want)
    assert len(record["val"]["fgsm"]["per_class"]) == 10


def test_cli_refuses_resampling_that_changes_nothing_in_one_line(npz, tmp_path, capsys):
    out = tmp_path / "run"
    assert cli_train(npz, out, "pgd-at", "--set", "data.train_per_class=6",
                     "--set", "data.batch_size=30", "--set", "resampling.power=0") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: resampling.power=0 draws every class") and \
        "resampling.auto=true" in err[0], err
    assert not out.exists()
