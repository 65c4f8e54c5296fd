"""``fastfair eval rb:NAME`` offline, end to end: a randomly initialised model file in RobustBench's layout
(``MODEL_DIR/cifar10/Linf/NAME.pt``, nested and prefixed as RobustBench's own files are) is built with
RobustBench's architecture, read without unpickling, evaluated per class, and recorded with RobustBench's
reported numbers; the mistakes a user makes are one error line each."""
from __future__ import annotations

import dataclasses
import json
import pickle
import sys

import numpy as np
import pytest
import torch

from fastfair import cli
from fastfair.errors import UserError
from fastfair.evaluation import robustbench as rb
from helpers import block_network, CIFAR10, cifar_layout_npz, needs_extra, write_model

needs_extra("robustbench")  # its package __init__ needs what fastfair does not: no import

NAME = "Ding2020MMA"  # the smallest single model of RobustBench's CIFAR-10 Linf list (a WRN-28-4, 5.8 M weights)


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """A missing file is fetched: never from the real network here."""
    block_network(monkeypatch)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rb")
    # one test image a class: the per-class plumbing, not accuracy (a WRN-28-4's attack on CPU costs by the image)
    return tmp / "models", write_model(tmp / "models", NAME), cifar_layout_npz(tmp, test_per_class=1)


def test_rb_name_is_evaluated_per_class_with_robustbench_numbers(zoo, capsys):
    model_dir, model, npz = zoo
    assert cli.main(["eval", f"rb:{NAME}", "--model-dir", str(model_dir), "--data-dir", str(npz),
                     "--attacks", "clean,pgd2"]) == 0
    out = capsys.readouterr().out
    assert f"{NAME} (RobustBench, cifar10 Linf)" in out and "airplane" in out and "truck" in out
    info = rb.reported()[NAME]
    assert f"RobustBench reports clean {info['clean']:.2f}, AutoAttack {info['autoattack']:.2f}" in out
    record = json.loads((model_dir / "cifar10" / "Linf" / "eval" / f"{NAME}-test.json").read_text())
    src = record["source"]
    assert (src["robustbench"], src["threat"], src["architecture"]) == (NAME, "Linf", "WideResNet-28-4")
    assert src["reported"] == {"clean": info["clean"], "autoattack": info["autoattack"]}
    assert record["eps"] == pytest.approx(8 / 255) and record["classes"] == CIFAR10
    # the weights are the file's, through RobustBench's architecture and its own normalisation: the clean
    # predictions of the model written above, fed images in [0, 1]
    with np.load(npz) as f:
        x = torch.from_numpy(f["x_test"]).permute(0, 3, 1, 2).float() / 255
        y = torch.from_numpy(f["y_test"])
    with torch.no_grad():
        pred = model(x).argmax(1)
    want = np.zeros((10, 10), dtype=int)
    np.add.at(want, (y.numpy(), pred.numpy()), 1)
    assert record["results"]["clean"]["confusion"] == want.tolist()


def test_load_from_python_reads_the_file_not_the_architecture(zoo):
    model_dir, model, _ = zoo
    loaded, source = rb.load(NAME, model_dir=model_dir)
    assert type(loaded) is type(model) and not loaded.training
    for (k, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), k
    assert source["sha256"] and source["robustbench_version"] == "1.1.1"


def test_reported_numbers_cover_the_package_list():
    missing = [n for n in rb.names() if n not in rb.reported()]
    assert not missing, f"no reported numbers for {missing}: refresh robustbench_reported.json"
    assert rb.reported()["Carmon2019Unlabeled"]["autoattack"] == 59.53  # RobustBench's leaderboard


@pytest.mark.parametrize("argv, says", [
    (["rb:Ding2020mma"], "Did you mean Ding2020MMA?"),
    (["rb:Wong2020Fast"], "could not fetch Wong2020Fast's weights"),
    (["rb:Chen2020Adversarial"], "is an ensemble"),
    (["rb:Ding2020MMA", "--threat", "L2"], "fastfair's attacks are L-inf"),
    (["rb:Ding2020MMA", "--model", "resnet18"], "--model: not with rb:NAME"),
    (["{npz}", "--threat", "Linf"], "only for a RobustBench model by name"),  # a file that is there, not rb:NAME
])
def test_mistakes_are_one_line(zoo, capsys, argv, says):
    model_dir, _, npz = zoo
    argv = [a.format(npz=npz) for a in argv]
    assert cli.main(["eval", *argv, "--model-dir", str(model_dir), "--data-dir", str(npz)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and says in err and err.count("\n") == 1


class Boom:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_a_file_needing_unpickling_is_refused_without_running_it(zoo, tmp_path, capsys):
    path = rb.model_file(NAME, model_dir=tmp_path)
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        pickle.dump({"state_dict": Boom()}, f)  # torch.load without weights_only would print
    assert cli.main(["eval", f"rb:{NAME}", "--model-dir", str(tmp_path), "--data-dir", str(zoo[2])]) == 2
    out, err = capsys.readouterr()
    assert "unpickled!" not in out and "fastfair does not unpickle" in err


def test_without_robustbench_one_line_names_the_extra(monkeypatch, capsys):
    for name in [m for m in sys.modules if m == "robustbench" or m.startswith("robustbench.")]:
        monkeypatch.delitem(sys.modules, name)
    real = rb.importlib.metadata.version

    def version(name):  # as where only torchattacks's partial copy of the package is installed
        if name == "robustbench":
            raise rb.importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(rb.importlib.metadata, "version", version)
    assert cli.main(["eval", f"rb:{NAME}"]) == 2
    assert "pip install 'fastfair[robustbench]'" in capsys.readouterr().err


def test_needs_neither_autoattack_nor_pkg_resources(monkeypatch):
    """robustbench's package __init__ imports its benchmark (the git-only autoattack) and its loaders
    (pkg_resources, gone from setuptools 81): fastfair's entry works without either."""
    for name in [m for m in sys.modules if m == "robustbench" or m.startswith("robustbench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pkg_resources", None)  # import pkg_resources now fails
    monkeypatch.setitem(sys.modules, "autoattack", None)
    assert NAME in rb.names() and rb.entry(NAME, "cifar10", "Linf")["model"]().__class__.__name__ == "Ding2020MMANet"


def test_the_model_is_robustbench_s_own_loader_s(zoo):
    """fastfair's reading (weights_only, then RobustBench's unwrapping and loading functions) gives what
    robustbench.utils.load_model gives on the same file: the same class and every tensor equal."""
    model_dir, _, _ = zoo
    theirs = rb._import("robustbench.utils").load_model(NAME, model_dir=str(model_dir), dataset="cifar10",
                                                         threat_model="Linf")
    ours, _ = rb.load(NAME, model_dir=model_dir)
    assert type(ours) is type(theirs)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_reproduce_row_that_is_a_released_model_is_evaluated_in_its_own_run_folder(zoo, tmp_path):
    """Tian et al.'s RST row is RobustBench's Carmon2019Unlabeled, evaluated (not trained) at the row's eps and step;
    here a small RobustBench model stands in for it, with the subset's attack names."""
    from fastfair.reproduce import command, runs, tables

    model_dir, _, npz = zoo
    table = tables.get("tian-iclr-t2")
    rst = next(r for r in table.rows if r.robustbench)
    assert (rst.robustbench, rst.substitute, rst.row) == ("Carmon2019Unlabeled", "tian-iclr-t2-standard", "RST")
    planned = runs.plan(table, 1, "subset", str(npz), tmp_path / "out", {}, str(model_dir))
    (missing,) = [p for p in planned if p.missing and p.row.robustbench]  # no Carmon2019Unlabeled weights here
    assert missing.row is rst and "no weights for RobustBench's Carmon2019Unlabeled" in missing.missing
    assert "train.epochs" not in missing.sets and "model.name" not in missing.sets  # evaluated, not trained
    stand_in = runs.PlannedRun(dataclasses.replace(rst, robustbench=NAME), 0, "rst-s0",
                               {k: v for k, v in missing.sets.items() if k != "eval.substitute"},
                               ("clean", "pgd2"), False, {"clean": "clean", "pgd2": "pgd2"})
    records, lines, failed = {}, [], []
    command._evaluate_released(stand_in, tmp_path / "out", str(model_dir), "cpu", records, {}, lines, failed,
                               lambda line: None)
    assert not failed and lines[0][1] == "done" and NAME in lines[0][2]
    (record,) = records[rst.preset]
    saved = json.loads((tmp_path / "out" / "runs" / "rst-s0" / "eval" / f"{NAME}-test.json").read_text())
    assert saved["results"] == record["results"] and set(record["results"]) == {"clean", "pgd2"}
    assert record["eps"] == pytest.approx(0.031) and record["alpha"] == pytest.approx(0.01)  # the row's, not 8/255
    assert record["source"]["robustbench"] == NAME


def test_full_scale_refuses_a_released_row_without_its_weights_before_any_run(zoo, tmp_path):
    from fastfair.reproduce.command import reproduce

    model_dir, _, _ = zoo
    (tmp_path / "data" / "cifar-10-batches-py").mkdir(parents=True)
    with pytest.raises(UserError, match="row RST .*no weights for RobustBench's Carmon2019Unlabeled"):
        reproduce("tian-iclr-t2", data_dir=str(tmp_path / "data"), out=str(tmp_path / "out"),
                  model_dir=str(model_dir))
    assert not (tmp_path / "out").exists()
