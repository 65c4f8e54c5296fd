"""Short end-to-end runs of the fairness methods on the real CIFAR-10 subset (tiny CNN, a few hundred images)."""
import json
from pathlib import Path

import pytest
import torch

from fastfair import config
from fastfair.rundir import load_checkpoint
from fastfair.training.trainer import Trainer, final_evaluation

from helpers import cifar_subset_npz

pytestmark = pytest.mark.slow  # each run trains and evaluates

# the plumbing, not the learning: a width-4 tiny CNN, 2 epochs (a method's vectors for epoch 2 come from epoch 1), the
# subset's first 200 training images (14 to 28 a class, 5 of each validate) and 50 test images
BASE = ["model.name=tiny-cnn", "model.width=4", "data.batch_size=64", "data.val_per_class=5", "attack.steps=2",
        "train.epochs=2", "train.val_attack=pgd2", "train.progress=false", "train.lr_milestones=[]",
        'eval.attacks=["clean", "pgd2"]']


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return cifar_subset_npz(tmp_path_factory.mktemp("data"), n_train=200, n_test=50)


def run(npz, out, method, *sets):
    cfg = config.resolve(None, {"method.name": method, "data.dataset": "npz", "data.data_dir": str(npz)},
                         BASE + list(sets))
    Trainer(cfg, out, quiet=True).fit()
    result = final_evaluation(out, cfg, quiet=True)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()], result


@pytest.fixture(scope="module")
def cfa_run(npz, tmp_path_factory):
    out = tmp_path_factory.mktemp("cfa")
    records, result = run(npz, out, "trades", "ccm.enabled=true", "ccr.enabled=true", "ccm.begin=1", "ccr.begin=1",
                          "train.averaging=fawa", "train.avg_begin=0", "train.avg_threshold=0.0")
    return out, records, result


def test_trades_cfa_calibrates_eps_and_beta_and_averages(cfa_run):
    out, records, result = cfa_run
    first, second = records
    # each line logs the vectors its epoch trained with: epoch 2's come from epoch 1's A_k
    assert first["vectors"]["eps"] == [pytest.approx(8 / 255)] * 10
    acc = torch.tensor(first["train_robust_acc_per_class"]) / 100
    assert torch.allclose(torch.tensor(second["vectors"]["eps"]), (0.3 + acc) * 8 / 255, atol=1e-6)
    assert torch.allclose(torch.tensor(second["vectors"]["kl_weight"]), (0.5 + acc) * 6, atol=1e-5)
    assert second["average"]["accepted"] and "val" in second["average"]
    for name in ("best_pgd_avg.pt", "best_fair_avg.pt", "last_avg.pt"):
        assert (out / "checkpoints" / name).is_file()
    assert set(result["average"]["results"]) == {"clean", "pgd2"}
    averaged = load_checkpoint(out / "checkpoints" / "last_avg.pt")["model"]
    trained = load_checkpoint(out / "checkpoints" / "last.pt")["model"]
    assert not torch.equal(averaged["head.weight"], trained["head.weight"])


def test_frl_fine_tunes_from_a_checkpoint(npz, cfa_run, tmp_path):
    records, _ = run(npz, tmp_path / "frl", "frl", "train.epochs=1", "train.val_attack=pgd2",
                     f"train.init_from={cfa_run[0] / 'checkpoints' / 'best_pgd.pt'}")
    v = records[0]["vectors"]  # set before the first epoch from the initial model's validation
    assert torch.allclose(torch.tensor(v["eps"]), torch.tensor(v["eps_frl"]) * 8 / 255, atol=1e-6)
    assert sum(v["frl_lam_nat"]) <= 0.5 + 1e-6 and min(v["frl_lam_nat"]) >= 0
    assert abs(sum(v["frl_w_nat"]) - 1) < 1e-5


@pytest.mark.parametrize("method,sets", [
    ("fat", ["ccm.enabled=true", "ccm.begin=0", "ccr.begin=0", "method.tau=1"]),
    ("mart", ["cost_sensitive.auto=true"]),
    ("pgd-at", ["model.head=cosine", "he.margin=0.2", "he.schedule=cmp", "model.norm=bin"]),
    ("pgd-at", ["adv_classes.classes=[0]", "data.classes=[3, 5]", "train.averaging=ema", "train.avg_begin=0",
                "data.batch_size=16"]),  # two classes' 30 training images
])
def test_other_methods_train_and_evaluate(npz, tmp_path, method, sets):
    records, result = run(npz, tmp_path / "run", method, *sets)
    assert len(records) == 2 and all(r["loss"] == r["loss"] for r in records)  # finite, not NaN
    assert set(result["results"]) == {"clean", "pgd2"}
    if "data.classes=[3, 5]" in sets:
        assert result["classes"] == ["cat", "dog"]
        assert records[0]["vectors"]["eps"] == [pytest.approx(8 / 255), 0.0]  # adversarial cats, clean dogs


def test_resume_restores_the_averaged_model_and_the_calibrated_vectors(tmp_path):
    sets = ["train.epochs=2", "train.progress=false", "attack.steps=2", "train.val_attack=pgd2", "model.width=8",
            "train.averaging=ema", "train.avg_begin=0", "ccm.enabled=true", "ccm.begin=0", "ccr.begin=0"]
    demo = str(Path(__file__).resolve().parents[1] / "configs" / "demo.toml")
    Trainer(config.resolve(demo, None, sets), tmp_path / "a", quiet=True).fit()
    killed = Trainer(config.resolve(demo, None, sets), tmp_path / "b", quiet=True)
    killed.run_epoch(0)
    resumed = Trainer(config.resolve(demo, None, sets), tmp_path / "b", resume=True, quiet=True)
    assert resumed.averager.started
    resumed.fit()
    a, b = (load_checkpoint(p / "checkpoints" / "last.pt") for p in (tmp_path / "a", tmp_path / "b"))
    assert torch.equal(a["class_state"]["eps"], b["class_state"]["eps"])
    for k, v in a["average"]["model"].items():
        assert torch.allclose(v.float(), b["average"]["model"][k].float(), atol=1e-6), k



def test_he_weight_norm_data_keeps_the_class_weights_on_the_unit_sphere(npz, tmp_path):
    """he.weight_norm=data (Pang et al.'s code): the trainer renormalises the rows after every step."""
    records, _ = run(npz, tmp_path / "run", "trades", "model.head=cosine", "he.margin=0.2", "he.weight_norm=data")
    assert all(r["loss"] == r["loss"] for r in records)
    w = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["model"]["head.weight"]
    assert torch.allclose(w.norm(dim=1), torch.ones(len(w)), atol=1e-6)
