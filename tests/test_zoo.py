"""``fastfair zoo``: RobustBench's list with its reported numbers, and ``--run`` end to end offline on two randomly
initialised models in RobustBench's layout: per-class results as child ``fastfair eval rb:NAME`` runs, the
worst-class leaderboard, the resume, a failing model's error line, and the mistakes caught before any work."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastfair
from fastfair import cli
from fastfair.evaluation import measures, robustbench as rb
from fastfair.reports import zoo
from fastfair.scaleout import launchers
from helpers import block_network, cifar_layout_npz, jobs_in_process, needs_extra, write_model

needs_extra("robustbench")  # its package __init__ needs what fastfair does not: no import

SMALL = ("Ding2020MMA", "Wong2020Fast")  # the two smallest single models of the CIFAR-10 Linf list


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """A missing file is fetched: never from the real network here."""
    block_network(monkeypatch)


def test_listing_shows_reported_numbers_and_what_is_here(tmp_path, capsys):
    write_model(tmp_path, "Ding2020MMA")
    assert cli.main(["zoo", "--model-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "│" in line]
    assert len(lines) == len(rb.names())
    names = [line.split()[0] for line in lines]
    aa = [rb.reported()[n]["autoattack"] for n in names]
    assert aa == sorted(aa, reverse=True)  # the leaderboard's order
    ding = next(line for line in lines if line.startswith("Ding2020MMA "))
    assert "84.36" in ding and "41.44" in ding and "yes" in ding  # reported clean, AA, weights here
    assert "yes" not in next(line for line in lines if line.startswith("Wong2020Fast "))


@pytest.mark.slow
def test_run_writes_the_worst_class_leaderboard_and_resumes(tmp_path, capsys, monkeypatch):
    models, out, npz = tmp_path / "models", tmp_path / "zoo", cifar_layout_npz(tmp_path)
    jobs_in_process(monkeypatch, launchers)  # each model's `fastfair eval` child through cli.main, in this process
    write_model(models, "Ding2020MMA")
    broken = rb.model_file("Wong2020Fast", model_dir=models)
    torch.save({"state_dict": {"conv1.weight": torch.zeros(1)}}, broken)  # does not fit its architecture
    argv = ["zoo", "--run", "--models", ",".join(SMALL), "--model-dir", str(models), "--data-dir", str(npz),
            "--attacks", "clean,pgd2", "--gpus", "cpu", "--out", str(out)]
    assert cli.main(argv) == 1
    said = capsys.readouterr().out
    assert "2 models: 2 to evaluate" in said and "1 of 2 models evaluated" in said
    assert "Wong2020Fast: fastfair: error:" in said and "does not fit RobustBench's Wong2020Fast" in said
    assert [r["model"] for r in json.loads((out / "zoo.json").read_text())["models"]] == ["Ding2020MMA"]

    write_model(models, "Wong2020Fast", seed=1)
    assert cli.main(argv) == 0
    said = capsys.readouterr().out
    assert "1 to evaluate, 1 done earlier with the same command (Ding2020MMA)" in said
    board = json.loads((out / "zoo.json").read_text())
    rows = board["models"]
    assert board["attack"] == "pgd2" and {r["model"] for r in rows} == set(SMALL)
    assert [r["worst"] for r in rows] == sorted((r["worst"] for r in rows), reverse=True)
    for r in rows:  # each row is the model's own per-class result, with RobustBench's numbers beside it
        record = json.loads(zoo.result_file(r["model"], "cifar10", "Linf", models, None).read_text())
        assert r["per_class"] == record["results"]["pgd2"]["per_class"]
        assert r["reported_autoattack"] == rb.reported()[r["model"]]["autoattack"]
        assert "not comparable to the reported numbers" in r["note"]  # 20 images, not the 10,000
    md = (out / "zoo.md").read_text()
    assert "| 1 | " + rows[0]["model"] in md and "airplane" in md and (out / "zoo.png").stat().st_size > 10_000

    seen = []  # other attacks: every model is evaluated again
    monkeypatch.setattr(launchers.LAUNCHERS, "get", lambda name: lambda jobs, **kw: seen.extend(jobs))
    cli.main([*argv[:-6], "--attacks", "clean,fgsm", "--gpus", "cpu", "--out", str(out)])
    assert [j.name for j in seen] == list(SMALL) and "2 to evaluate" in capsys.readouterr().out


@pytest.mark.parametrize("argv, says", [
    (["--run", "--models", "Ding2020MMA,Wong2020Fast"], "could not fetch Ding2020MMA's weights"),
    (["--run", "--models", "Ding2020mma"], "Did you mean Ding2020MMA?"),
    (["--run", "--models", "Ding2020MMA", "--top", "3"], "--models and --top both choose"),
    (["--run", "--models", "Ding2020MMA", "--attacks", "autoattack"], "unknown attack"),
    (["--models", "Ding2020MMA"], "--models: only with --run"),
    (["--threat", "L2"], "fastfair's attacks are L-inf"),
])
def test_mistakes_are_one_line_before_any_work(tmp_path, capsys, monkeypatch, argv, says):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["zoo", "--model-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and says in err and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_results_on_other_test_images_are_refused(tmp_path):
    """One leaderboard, one test set: a result evaluated on other images since is not mixed in."""
    per_class = {"per_class": [50.0] * 10, "summary": {"avg": 50.0, "overall": 50.0, "worst": 50.0, "worst_class": 0,
                                                      "cv": 0.0, "mcd": 0.0}}
    for name, data in zip(SMALL, ("a" * 64, "b" * 64)):
        path = zoo.result_file(name, "cifar10", "Linf", tmp_path, None)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"classes": [str(c) for c in range(10)], "images": 20, "fingerprint": {"data": data},
                                    "results": {"clean": per_class, "pgd2": per_class},
                                    "source": {"architecture": "x", "reported": None}}))
    with pytest.raises(fastfair.UserError, match="on different test images \\(Ding2020MMA; Wong2020Fast\\)"):
        zoo.write(list(SMALL), dataset="cifar10", threat="Linf", model_dir=tmp_path, per_class=None,
                  out=tmp_path / "zoo")


def test_the_leaderboard_quotes_each_of_our_numbers_with_its_interval(tmp_path):
    """RobustBench's convention is a bare average: ours carry their 95 % intervals, from the per-image results."""
    from fastfair.evaluation import intervals, per_image

    labels = np.repeat(np.arange(10), 20)
    for name, share in zip(SMALL, (0.5, 0.7)):
        correct = np.random.default_rng(len(name)).random(200) < share
        conf = np.zeros((10, 10), dtype=int)
        np.add.at(conf, (labels, np.where(correct, labels, (labels + 1) % 10)), 1)
        entry = {"per_class": measures.json_values(measures.per_class_accuracy(conf)),
                 "summary": measures.summary_of_confusion(conf), "confusion": conf.tolist(),
                 per_image.FIELD: per_image.pack(correct, labels)}
        path = zoo.result_file(name, "cifar10", "Linf", tmp_path, None)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"classes": [str(c) for c in range(10)], "images": 200,
                                    "fingerprint": {"data": "a" * 64}, "results": {"clean": entry, "pgd2": entry},
                                    "source": {"architecture": "x", "reported": None}}))
    md = zoo.write(list(SMALL), dataset="cifar10", threat="Linf", model_dir=tmp_path, per_class=None,
                   out=tmp_path / "zoo").read_text()
    best = json.loads((tmp_path / "zoo" / "zoo.json").read_text())["models"][0]
    correct, labels = per_image.unpack(json.loads(zoo.result_file(best["model"], "cifar10", "Linf", tmp_path, None)
                                                  .read_text())["results"]["pgd2"])
    boot = intervals.bootstrap_measures(correct, labels, 10)
    assert best["intervals"]["worst"] == pytest.approx(boot["worst"][1:], abs=1e-4)
    assert f"{best['worst']:.2f} [{boot['worst'][1]:.1f}, {boot['worst'][2]:.1f}]" in md
    assert "each with its 95 % interval" in md and "bare as it reports them" in md
