"""Evaluation results users can cite: seeded random starts (same numbers every time, per class, in eval,
diagnose and training's final evaluation), results tied to one set of weights, data and settings, and
an evaluation folder that exists before AutoAttack's resume file."""
import json
import shutil

import numpy as np
import pytest
import torch
from evalreport_helpers import cheap_aa_backend, digits_run

from fastfair import build, data
from fastfair.attacks import autoattack
from fastfair.cli import main
from fastfair.evaluation import seeds
from fastfair.evaluation.diagnose import diagnose_checkpoint
from fastfair.evaluation.per_class import evaluate, evaluate_checkpoint, fingerprint
from fastfair.rundir import load_checkpoint


def _digits_model_and_loader(n=100, batch=50):
    out, cfg = digits_run()
    ck = load_checkpoint(out / "checkpoints" / "best_pgd.pt")
    model = build.model_from_spec(ck["spec"], torch.device("cpu"), False)
    model.load_state_dict(ck["model"])
    b = data.load("digits")
    return model, data.DeviceLoader(b.x_test[:n], b.y_test[:n], batch, device="cpu", train=False), cfg, b.classes


def _copy_run(tmp_path):
    src, _ = digits_run()
    run = tmp_path / "run"
    shutil.copytree(src, run)
    return run


def test_random_starts_repeat_per_class_and_leave_the_callers_stream_alone():
    model, loader, cfg, classes = _digits_model_and_loader()
    kw = dict(eps=0.2, alpha=0.02, classes=classes)  # twice the training radius: the random start matters
    names = ["pgd5", "cw5", "tpgd5@t0.1"]
    torch.manual_seed(5)
    first = evaluate(model, loader, names, **kw)
    after_eval = torch.rand(4)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(4), after_eval)  # evaluation drew nothing from the caller's generator
    second = evaluate(model, loader, names, **kw)
    for name in names:
        assert first[name]["confusion"] == second[name]["confusion"] and first[name]["seed"] == 0
    with seeds.seeded(0, "pgd5", 0, device=torch.device("cpu")):
        a = torch.rand(8)
    with seeds.seeded(1, "pgd5", 0, device=torch.device("cpu")):
        b = torch.rand(8)
    assert not torch.equal(a, b)  # another seed is another random start


def test_eval_twice_gives_the_same_json_and_another_seed_keeps_the_earlier_file(tmp_path, capsys):
    run = _copy_run(tmp_path)
    shutil.rmtree(run / "eval")  # a run whose eval/ folder does not exist yet
    argv = ["eval", str(run), "--attacks", "clean,pgd5", "--device", "cpu"]
    assert main(argv) == 0
    path = run / "eval" / "best_pgd-test.json"
    first = json.loads(path.read_text())
    assert main(argv) == 0
    second = json.loads(path.read_text())
    assert first["results"] == second["results"] and first["fingerprint"] == second["fingerprint"]
    assert first["seed"] == 0 and first["results"]["pgd5"]["seed"] == 0
    s = first["results"]["pgd5"]["summary"]
    assert {"avg", "overall"} <= set(s) and 0 < s["overall"] <= 100
    out = capsys.readouterr().out
    assert "mean of per-class accuracies" in out and "share of images correct" in out
    assert main([*argv, "--seed", "1"]) == 0
    third = json.loads(path.read_text())
    assert third["seed"] == 1 and third["fingerprint"]["settings"] != first["fingerprint"]["settings"]
    kept = list((run / "eval" / "previous").glob("best_pgd-test-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["results"] == second["results"]
    assert "moved to" in capsys.readouterr().out


def test_results_of_other_weights_are_never_merged(tmp_path):
    run = _copy_run(tmp_path)
    ckpt = run / "checkpoints" / "best_pgd.pt"
    evaluate_checkpoint(ckpt, attacks=["clean", "fgsm"], device="cpu", quiet=True)
    ck = load_checkpoint(ckpt)
    ck["model"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in ck["model"].items()}
    torch.save(ck, ckpt)  # a new run written into the old run's folder
    rec = evaluate_checkpoint(ckpt, attacks=["pgd5"], device="cpu", quiet=True)
    saved = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    assert list(saved["results"]) == ["pgd5"] and saved["fingerprint"] == rec["fingerprint"]
    (kept,) = (run / "eval" / "previous").glob("*.json")
    assert list(json.loads(kept.read_text())["results"]) == ["clean", "fgsm"]


def test_fingerprint_sees_one_pixel_one_weight_and_one_setting():
    model, loader, cfg, classes = _digits_model_and_loader(n=20)
    x, y = loader.x.clone(), loader.y.clone()
    base = fingerprint(model, (x, y), {"eps": 0.1, "seed": 0})
    x2 = x.clone()
    x2[3, 0, 2, 2] += 1
    assert fingerprint(model, (x2, y), {"eps": 0.1, "seed": 0})["data"] != base["data"]
    assert fingerprint(model, (x, y), {"eps": 0.1, "seed": 1})["settings"] != base["settings"]
    with torch.no_grad():
        next(model.parameters()).view(-1)[0] += 1e-3
    other = fingerprint(model, (x, y), {"eps": 0.1, "seed": 0})
    assert other["weights"] != base["weights"] and other["data"] == base["data"]


def test_autoattack_on_a_lone_checkpoint_creates_the_eval_folder(tmp_path, monkeypatch):
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (cheap_aa_backend, "test stand-in"))
    src, _ = digits_run()
    lone = tmp_path / "elsewhere" / "model.pt"
    lone.parent.mkdir()
    shutil.copy(src / "checkpoints" / "best_pgd.pt", lone)
    rec = evaluate_checkpoint(lone, attacks=["aa"], device="cpu", quiet=True, aa_backend="cheap", batch_size=200)
    assert (tmp_path / "elsewhere" / "eval" / "model-test.json").is_file()
    assert (tmp_path / "elsewhere" / "eval" / "model-test.aa.npz").is_file()
    aa = rec["results"]["aa"]["autoattack"]
    assert aa["backend"] == "cheap" and aa["seed"] == 0 and aa["recheck"]["prediction_mismatches"] == 0
    again = evaluate_checkpoint(lone, attacks=["aa"], device="cpu", quiet=True, aa_backend="cheap", batch_size=200)
    assert again["results"]["aa"]["confusion"] == rec["results"]["aa"]["confusion"]


def test_diagnose_repeats_and_agrees_with_eval(tmp_path):
    run = _copy_run(tmp_path)
    ckpt = run / "checkpoints" / "best_pgd.pt"
    kw = dict(attack="pgd5", device="cpu", tsne_points=0, quiet=True)
    first, second = diagnose_checkpoint(ckpt, **kw), diagnose_checkpoint(ckpt, **kw)
    assert first["accuracy"] == second["accuracy"] and first["seed"] == 0
    ev = evaluate_checkpoint(ckpt, attacks=["pgd5"], device="cpu", quiet=True)
    assert np.allclose(ev["results"]["pgd5"]["per_class"], first["accuracy"]["adv"])
    assert first["summary"]["adv"]["overall"] == pytest.approx(ev["results"]["pgd5"]["summary"]["overall"])


def test_final_evaluation_of_training_records_seed_and_fingerprint():
    run, cfg = digits_run()
    rec = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    assert rec["seed"] == cfg.eval.seed == 0
    assert set(rec["fingerprint"]) == {"weights", "data", "settings"} and rec["images"] > 0


def test_eval_after_training_repeats_the_final_evaluation(tmp_path):
    run = _copy_run(tmp_path)
    final = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    _, cfg = digits_run()
    again = evaluate_checkpoint(run / "checkpoints" / "best_pgd.pt", attacks=cfg.eval.attacks, device="cpu",
                                quiet=True)
    assert again["fingerprint"] == final["fingerprint"] and set(again["results"]) == set(final["results"])
    for name in final["results"]:
        assert again["results"][name]["confusion"] == final["results"][name]["confusion"], name
