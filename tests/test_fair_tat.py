"""FAIR-TAT: `fastfair train --method fair-tat` end to end on the real CIFAR-10 subset (its class-wise eps and target
scores follow the first epoch), the sync-free draw's distribution and edges, and one error line for settings that
would do nothing."""
import json

import pytest
import torch

from fastfair import cli, config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.methods.fair_tat import SCORES, confusion_targets, pick, redraw_distribution, target_probs

from helpers import cifar_subset_npz

SMALL = ["--quiet", "--set", "model.name=tiny-cnn", "--set", "model.width=8", "--set", "data.batch_size=64",
         "--set", "data.val_per_class=5", "--set", "attack.steps=2", "--set", "train.val_attack=pgd2",
         "--set", "train.select_begin=0", "--set", "eval.attacks=['clean', 'pgd2']"]


@pytest.mark.slow  # two epochs and an evaluation: about 15 CPU seconds
def test_fair_tat_trains_on_the_subset_and_moves_eps_and_targets_after_the_first_epoch(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=400, n_test=100)
    out = tmp_path / "run"
    assert cli.main(["train", "--config", "trix-rebuttal-t1-fair-tat", "--dataset", "npz", "--data-dir", str(npz),
                     "--epochs", "2", "--out", str(out), *SMALL]) == 0
    first, second = (json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    # each line logs the vectors its epoch trained with: the first epoch's are the code's starting values
    assert first["vectors"][SCORES] == [1.0] * 10 and first["vectors"]["eps"] == [pytest.approx(8 / 255)] * 10
    acc = torch.tensor(first["train_robust_acc_per_class"]) / 100
    assert torch.allclose(torch.tensor(second["vectors"]["eps"]), (0.5 + acc) * 8 / 255, atol=1e-6)
    scores = torch.tensor(second["vectors"][SCORES])  # 2 x shares of the first epoch's misclassifications
    assert scores.sum() == pytest.approx(2.0, abs=1e-5) and scores.min() >= 0 and scores.max() > 0.2
    assert (out / "eval" / "best_worst-test.json").is_file()  # the preset selects by the worst class


def test_pick_draws_each_row_from_its_distribution_and_never_a_class_of_zero_mass():
    torch.manual_seed(0)
    p = torch.tensor([0.0, 0.2, 0.0, 0.5, 0.3, 0.0])
    drawn = pick(p, torch.rand(200_000))
    assert torch.allclose(torch.bincount(drawn, minlength=6) / 200_000., p, atol=5e-3)
    edges = torch.tensor([0.0, 1 - 2 ** -24])  # the smallest and largest values torch.rand returns
    assert pick(p, edges).tolist() == [4, 1]  # 1 - u = 1 takes the last class of mass, 2^-24 the first
    y = torch.tensor([3, 1, 0])
    q = redraw_distribution(p, y)
    assert torch.allclose(q.sum(1), torch.ones(3)) and (q[torch.arange(3), y] == 0).all()


def test_confusion_targets_follow_the_redraw_distribution_and_avoid_the_label():
    torch.manual_seed(1)
    scores = torch.tensor([0.0, 0.9, 0.6, 0.0, 0.2, 0.0, 0.0, 0.3, 0.0, 0.0])
    y = torch.arange(10).repeat(5_000)
    t = confusion_targets(y, scores)
    assert not (t == y).any()  # many collisions a batch: every one redrawn
    counts = torch.zeros(10, 10).index_put_((y, t), torch.ones(len(y)), accumulate=True)
    want = redraw_distribution(target_probs(scores), torch.arange(10))
    assert torch.allclose(counts / counts.sum(1, keepdim=True), want, atol=0.03)


@pytest.mark.parametrize("sets,says", [
    (["method.targets=nearest"], "method.targets must be one of confusion, uniform"),
    (["attack.objective=kl"], "attack.objective=kl would do nothing"),
    (["ccm.enabled=false"], "set ccm.enabled=true, or method.targets=uniform"),
    (["method.targets=uniform", "method.fp_scale=3"], "method.fp_scale=3.0 does nothing"),
    (["targeted_attack.target=3"], "targeted_attack: method fair-tat makes its training examples with its own attack"),
])
def test_settings_that_would_do_nothing_are_one_error(sets, says):
    with pytest.raises(UserError, match=says.replace(".", r"\.").replace("(", r"\(")):
        check_config(config.resolve("trix-rebuttal-t1-fair-tat", {}, sets))


def test_uniform_targets_need_no_epoch_update_and_pass_the_checks():
    cfg = config.resolve(None, {"method.name": "fair-tat"}, ["method.targets=uniform"])
    assert check_config(cfg) == [] or all("FAIR-TAT" not in w for w in check_config(cfg))
