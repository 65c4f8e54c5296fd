"""fastfair tune's final phase on real run folders, in this process: the objectives' names in the storage (what
optuna-dashboard shows), the front tested once under the validation's attack and the first robust evaluation attack
with each image's correctness (the numbers those of ``fastfair eval``), an older study's test record tested again,
and the comparison with its intervals and its slice at a common average."""
import json
import shutil

import numpy as np
import pytest
import torch

from fastfair.rundir import load_checkpoint, save_atomic, write_json_atomic
from fastfair.tuning import study as tuning
from fastfair.tuning.front import decode_bits, decode_labels
from helpers import demo_train, needs_extra

optuna = needs_extra("tune", "optuna")

# helpers.DEMO_FAST's keys (FGSM validation), with PGD-2 the first robust evaluation attack: two attacks to test under
SETS = ("model.width=4", "attack.steps=1", "train.val_attack=fgsm", "eval.attacks=['clean', 'pgd2']",
        "data.batch_size=256", "train.epochs=1", "ccm.begin=0")
KL = {"method.kl_weight": optuna.distributions.FloatDistribution(1.0, 15.0, log=True)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A one-epoch demo run, and a copy whose selected weights are nudged: two models on the same test images."""
    from fastfair import cli

    root = tmp_path_factory.mktemp("tune")
    a, b = root / "a", root / "b"
    assert cli.main(demo_train(a, "--set", "eval.attacks=['clean', 'pgd2']")) == 0
    shutil.copytree(a, b)
    ck = load_checkpoint(b / "checkpoints" / "best_pgd.pt")
    generator = torch.Generator().manual_seed(0)
    for w in ck["model"].values():
        if w.is_floating_point() and w.numel() > 1:
            w += 0.3 * w.std() * torch.randn(w.shape, generator=generator)
    save_atomic(ck, b / "checkpoints" / "best_pgd.pt")
    return a, b


def _study(root):
    return tuning.Study(root, tuning.Settings("s", ("trades", "trades+ccm"), "trials", 1, "demo", SETS))


def test_the_front_is_tested_per_image_named_and_compared_at_a_common_average(runs, tmp_path):
    a, b = runs
    study = _study(tmp_path)
    storage = study.storage()
    trades, ccm = study.settings.contenders()
    val = tuning.objectives(a, tuning.config.load_run(a))
    assert val["images"] == 100 and val["per_class"] == [10, 10] and set(val["ci"]) == {"avg", "worst"}
    assert val["ci"]["avg"][0] <= val["avg"] <= val["ci"]["avg"][1] and val["attack"] == "fgsm"
    other = {**val, "avg": val["avg"] + 2.0}  # another validation point, so each contender has a front
    for c, run, v in ((trades, a, val), (ccm, b, other)):
        ostudy = study.optuna_study(c, storage)
        ostudy.add_trial(optuna.trial.create_trial(params={"method.kl_weight": 6.0}, distributions=KL,
                                                   values=[v["avg"], v["worst"]],
                                                   user_attrs={"val": v, "run": str(run), "run_number": 0}))
    # the objectives are named in the storage, for optuna-dashboard and trials_dataframe
    assert optuna.load_study(study_name="s:trades", storage=storage).metric_names == ["val avg (fgsm)",
                                                                                      "val worst (fgsm)"]
    said = []
    tuning.evaluate_front(study, storage, said.append)
    tests = {c.label: optuna.load_study(study_name=f"s:{c.label}", storage=storage).user_attrs["test/0000"]
             for c in (trades, ccm)}
    assert [list(t["attacks"]) for t in tests.values()] == [["fgsm", "pgd2"]] * 2  # the validation's attack first
    assert tests["trades"]["labels"] == tests["trades+ccm"]["labels"] and tests["trades"]["images"] == 360
    # image by image, the numbers of `fastfair eval` on the same checkpoint (training's final evaluation)
    evaluated = json.loads((a / "eval" / "best_pgd-test.json").read_text())["results"]
    pgd2 = tests["trades"]["attacks"]["pgd2"]
    assert pgd2["avg"] == pytest.approx(evaluated["pgd2"]["summary"]["avg"])
    assert pgd2["worst"] == pytest.approx(evaluated["pgd2"]["summary"]["worst"])
    assert tests["trades"]["clean"] == pytest.approx(evaluated["clean"]["summary"]["avg"])
    labels = decode_labels(tests["trades"]["labels"])
    right = decode_bits(pgd2["correct"], 360)
    assert right.sum() == sum(evaluated["pgd2"]["confusion"][k][k] for k in range(10))
    assert (np.bincount(labels, minlength=10) == np.asarray(evaluated["pgd2"]["confusion"]).sum(1)).all()
    assert json.loads((b / "tune-test.json").read_text())["test"] == tests["trades+ccm"]
    # a test record of an older fastfair (one attack, no intervals, no images) is tested again, the others kept
    ostudy = study.optuna_study(ccm, storage)
    old = {"avg": 10.0, "worst": 0.0, "clean": 11.0, "attack": "pgd2"}
    ostudy.set_user_attr("test/0000", old)
    write_json_atomic({"test": old}, b / "tune-test.json")  # an older fastfair signed its records too
    said.clear()
    tuning.evaluate_front(study, storage, said.append)
    assert len(said) == 2 and "trades+ccm #0: its test record predates intervals" in said[0]
    assert study.optuna_study(ccm, storage).user_attrs["test/0000"] == tests["trades+ccm"]
    text = tuning.compare(study, storage, "worst@avg-1", write=True)
    md = (tmp_path / "comparison.md").read_text()
    assert "validation split: 100 images (10 a class); test split: 360 images" in md
    assert "| test avg (fgsm) | test worst (fgsm) | test avg (pgd2) | test worst (pgd2) |" in md
    assert "## Worst class at a common average" in md and "under pgd2, trades+ccm minus trades: worst class" in md
    assert f"A = {val['avg'] - 1:.1f}" in md and "worst class at a common average" in text
    assert (tmp_path / "fronts.png").stat().st_size > 20_000


def test_an_attack_run_by_fastfair_eval_gets_intervals_from_its_counts_and_no_pairs(runs):
    # AutoAttack, a transfer attack, a grid or a capped NAME/N goes through fastfair eval, whose record keeps
    # per-class counts; FGSM on the first 5 images of each class stands in for AutoAttack's minutes
    from fastfair.tuning.front import common_slice
    from fastfair.tuning.scoring import per_image, test_record

    a, _ = runs
    assert per_image("pgd20") and per_image("clean") and not per_image("aa") and not per_image("fgsm/5")
    record = test_record(a / "checkpoints" / "best_pgd.pt", ["fgsm/5"], "cpu")
    capped = record["attacks"]["fgsm/5"]
    assert "correct" not in capped and capped["ci"]["avg"][0] <= capped["avg"] <= capped["ci"]["avg"][1]
    results = json.loads((a / "eval" / "best_pgd-test.json").read_text())["results"]
    assert capped["avg"] == pytest.approx(results["fgsm/5"]["summary"]["avg"])
    # the clean pass, image by image (scoring's own run of eval's confusion loop), gives eval's number
    assert record["clean"] == pytest.approx(results["clean"]["summary"]["avg"])
    point = {"contender": "x", "number": 0, "params": {}, "state": "complete", "run": "",
             "val": {"avg": 50.0, "worst": 20.0, "attack": "fgsm"}, "test": record}
    sl = common_slice({"x": [point], "y": [{**point, "contender": "y"}]})
    assert sl.differences["y"]["fgsm/5"] == "no per-image record under this attack, so not paired"
