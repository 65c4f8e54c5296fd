"""BAT: its preset trains end to end on the CIFAR-10 subset, its two stop rules keep the points the code returns
(the engine's ``back`` rule against plain PGD's iterates), and a negative setting is one error line before work."""
import json

import pytest
import torch
from torch import nn

import fastfair
from fastfair import cli
from fastfair.attacks.pgd import PGD, descend
from fastfair.errors import UserError
from fastfair.methods.bat import LastClean
from fastfair.methods.fat import EarlyStop
from fastfair.ops import steps

from helpers import SMALL_RUN, cifar_subset_npz


def test_the_bat_preset_trains_one_epoch_on_the_cifar_subset(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=300, n_test=100)
    out = tmp_path / "run"
    sets = [*SMALL_RUN, "data.dataset=npz", f"data.data_dir={npz}"]
    args = ["train", "--config", "trix-rebuttal-t1-bat", "--epochs", "1", "--quiet", "--out", str(out)]
    assert cli.main(args + [a for s in sets for a in ("--set", s)]) == 0
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # CE + 6 KL + two KL-to-uniform terms, each at most log 10: finite, and above what CE alone starts at
    assert torch.isfinite(torch.tensor(record["loss"])) and record["loss"] > 0
    assert (out / "checkpoints" / "last.pt").is_file()


def test_the_stop_rules_keep_the_last_clean_point_and_the_first_adversarial_one():
    """On a fixed linear model: a row first misclassified at check s keeps x_{s-1} under LastClean (x_0 when s is 0)
    and x_s under FAT's tau 0 rule; a row never misclassified takes all K steps under both."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 3)).eval()
    x, y = torch.rand(64, 3, 2, 2), torch.randint(0, 3, (64,))
    K = 6
    eps, alpha = torch.full((3,), 0.3), torch.full((3,), 0.05)
    one = PGD(steps=1, objective="ce", init="none")
    points = [x]
    for _ in range(K):
        points.append(descend(one, model, x, y, eps, alpha, points[-1]))
    with torch.no_grad():
        wrong = torch.stack([model(p).argmax(1) != y for p in points[:K]])  # the checks at x_0..x_{K-1}
    first = torch.where(wrong.any(0), wrong.float().argmax(0), K)
    assert len(set(first.tolist())) >= 3  # rows stopping at several checks, and some never
    runs = {rule: PGD(steps=K, objective="ce", init="none", stop=rule)(model, x, y, eps, alpha)
            for rule in (LastClean(tau=0), EarlyStop(tau=0))}
    stacked = torch.stack(points)
    rows = torch.arange(len(x))
    keep = torch.where(first == K, K, (first - 1).clamp(min=0))
    assert torch.equal(runs[LastClean(tau=0)], stacked[keep, rows])
    assert torch.equal(runs[EarlyStop(tau=0)], stacked[first, rows])


@pytest.mark.parametrize("key,value", [("method.tau", -1), ("method.kl_weight", -6.0), ("method.uniform_weight", -1.0)])
def test_a_negative_setting_is_one_error_line(tmp_path, capsys, key, value):
    assert cli.main(["train", "--config", "demo", "--method", "bat", "--epochs", "1", "--quiet",
                     "--out", str(tmp_path / "run"), "--set", f"{key}={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and key in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match=key):  # the Python API checks what the CLI checks
        fastfair.method("bat", num_classes=10, sets={key: value})


def test_the_clipped_normal_start_is_the_normal_one_clipped_to_images():
    """BAT's code clamps x + 0.001 N(0, I) to [0, 1] before its first check (TRADES's start is left unclipped)."""
    x, y, eps = torch.tensor([0.0, 0.5, 1.0]).repeat(100).view(100, 3, 1, 1), torch.zeros(100, dtype=torch.long), None
    torch.manual_seed(0)
    normal = steps.random_start(x, y, eps, "normal")
    torch.manual_seed(0)
    clipped = steps.random_start(x, y, eps, "normal_clipped")
    assert normal.min() < 0 and normal.max() > 1
    assert torch.equal(clipped, normal.clamp(0.0, 1.0))
