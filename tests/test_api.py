"""The public Python API (``import fastfair``): per-class evaluation of any module on tensors or a loader, the
result object, the JSON rules of ``fastfair eval``, ``fastfair.train``'s errors equal to the CLI's, and what is
public."""
from __future__ import annotations

import itertools
import json
import pydoc
import subprocess
import sys
import types

import pytest
import torch

import fastfair
from fastfair import cli, progress
from fastfair.rundir import RunDir

ATTACKS = ["clean", "pgd3"]


def tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 16), torch.nn.ReLU(),
                               torch.nn.Linear(16, 4))


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.rand(40, 3, 4, 4, generator=g), torch.arange(40) % 4


def test_tensors_and_a_loader_give_the_same_numbers_and_fingerprint(data):
    model = tiny_model()
    a = fastfair.evaluate(model, data, attacks=ATTACKS, batch_size=16)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*data), batch_size=7)
    b = fastfair.evaluate(model, loader, attacks=",".join(ATTACKS), batch_size=16)
    assert a.record["results"] == b.record["results"] and a.record["fingerprint"] == b.record["fingerprint"]
    assert a.classes == ["0", "1", "2", "3"] and a.record["images"] == 40 and a.record["precision"] == "fp32"
    assert a.avg("pgd3") <= a.avg("clean")  # the attack does not help the model


def test_result_measures_agree_with_the_summary_functions(data):
    r = fastfair.evaluate(tiny_model(), data, attacks=ATTACKS, classes=["a", "b", "c", "d"])
    acc = list(r.per_class("pgd3").values())
    assert r.cv("pgd3") == pytest.approx(fastfair.measures.cv(acc))
    assert r.mcd("pgd3") == pytest.approx(max(acc) - min(acc))
    assert r.worst("pgd3") == (["a", "b", "c", "d"][acc.index(min(acc))], min(acc))
    assert r.overall("clean") == pytest.approx(100 * r.confusion("clean").trace() / 40)
    assert "| **worst class** |" in str(r) and "pgd3" in repr(r)
    with pytest.raises(fastfair.UserError, match="holds clean, pgd3"):
        r.avg("aa")


def test_model_mode_is_restored_and_seeds_repeat(data):
    model = tiny_model().train()
    first = fastfair.evaluate(model, data, attacks=ATTACKS, seed=3)
    assert model.training
    assert fastfair.evaluate(model, data, attacks=ATTACKS, seed=3).record["results"] == first.record["results"]


def test_out_keeps_attacks_of_the_same_fingerprint_and_moves_other_results(tmp_path, data):
    path = tmp_path / "eval" / "m.json"
    fastfair.evaluate(tiny_model(), data, attacks=["clean"], out=path)
    both = fastfair.evaluate(tiny_model(), data, attacks=["pgd3"], out=path)
    assert set(json.loads(path.read_text())["results"]) == {"clean", "pgd3"} and both.record["path"] == str(path)
    other = fastfair.evaluate(tiny_model(seed=1), data, attacks=["pgd3"], out=path)  # other weights
    assert set(json.loads(path.read_text())["results"]) == {"pgd3"}
    moved = list((tmp_path / "eval" / "previous").glob("m-*.json"))
    assert len(moved) == 1 and set(json.loads(moved[0].read_text())["results"]) == {"clean", "pgd3"}
    again = fastfair.load_result(path)
    assert again.per_class("pgd3") == other.per_class("pgd3")
    saved = again.save(tmp_path / "copy.json")
    assert fastfair.load_result(saved).record["fingerprint"] == other.record["fingerprint"]


@pytest.mark.parametrize("change, says", [
    (lambda x, y: (x * 255, y), "images must be in [0, 1]"),
    (lambda x, y: (x, y.float()), "y is float32; labels must be integers"),
    (lambda x, y: (x, y[:-1]), "y has shape (39,) for 40 images; it needs one label per image"),
    (lambda x, y: (x, y + 4), "y holds labels 4..7, outside 0..3 (4 classes)"),
    (lambda x, y: (x[:0], y[:0]), "no images"),
    (lambda x, y: (x[:, 0], y), "images must be a float tensor (N, C, H, W)"),
    (lambda x, y: [1, 2, 3], "data must be (images, labels) tensors or an iterable"),
])
def test_bad_data_is_one_clear_error(data, change, says):
    with pytest.raises(fastfair.UserError) as err:
        fastfair.evaluate(tiny_model(), change(*data), attacks=["clean"])
    assert says in str(err.value)


@pytest.mark.parametrize("kwargs, says", [
    ({"attacks": ["pgd20", "autoattack"]}, "unknown attack 'autoattack'"),
    ({"attacks": []}, "no attack is named"),
    ({"aa_backend": "mine"}, "the AutoAttack backend must be one of"),
    ({"classes": ["a", "b"]}, "2 class names for a model with 4 outputs"),
    ({"batch_size": 0}, "data.eval_batch_size=0 is out of range: it must be at least 1"),
])
def test_bad_arguments_are_one_clear_error(data, kwargs, says):
    with pytest.raises(fastfair.UserError) as err:
        fastfair.evaluate(tiny_model(), data, **kwargs)
    assert says in str(err.value)


def test_evaluate_shows_the_cli_s_progress_unless_told_not_to(data, capsys, monkeypatch):
    clock = itertools.count(step=100.0)  # every tick is past the plain line's 30 s
    monkeypatch.setattr(progress, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    fastfair.evaluate(tiny_model(), data, attacks=ATTACKS, batch_size=8)
    # a line, as fastfair eval prints to a log, in model passes: 5 batches of a clean pass (1) and pgd3's 3 steps (a
    # forward and a backward: 3 each) and prediction (1)
    assert "eval clean,pgd3  pass 1/55" in capsys.readouterr().out
    fastfair.evaluate(tiny_model(), data, attacks=ATTACKS, batch_size=8, progress=False)
    assert capsys.readouterr().out == ""


def test_to_pandas_without_pandas_names_the_install(data, monkeypatch):
    result = fastfair.evaluate(tiny_model(), data, attacks=["clean"], progress=False)
    monkeypatch.setitem(sys.modules, "pandas", None)  # import pandas fails
    with pytest.raises(fastfair.UserError, match=r"^Result.to_pandas needs pandas: pip install 'fastfair\[pandas\]'"):
        result.to_pandas()


def test_train_says_which_preset_keys_it_changed_and_shows_what_the_cli_shows(tmp_path, capsys, monkeypatch):
    from fastfair.training import trainer  # what fastfair.train runs, imported where it runs

    monkeypatch.setattr(trainer.Trainer, "fit", lambda self: None)  # the line is said as the trainer starts
    monkeypatch.setattr(trainer, "final_evaluation", lambda *args, **kwargs: None)
    fastfair.train("demo", out=tmp_path / "run", method="pgd-at", epochs=1)
    said = "preset demo: method.name me-trades -> pgd-at (from method=), train.epochs 15 -> 1 (from epochs=)"
    assert capsys.readouterr().out.splitlines()[0] == said
    assert RunDir(tmp_path / "run").train_log.read_text().splitlines()[0] == said
    fastfair.train("demo", out=tmp_path / "quiet", sets={"train.epochs": 1}, progress=False)  # --quiet
    assert capsys.readouterr().out == ""
    assert RunDir(tmp_path / "quiet").train_log.read_text().splitlines()[0] == \
        "preset demo: train.epochs 15 -> 1 (from --set)"


def test_load_result_refuses_other_files(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    for path, says in ((tmp_path / "x.json", "is not a per-class result"), (tmp_path / "no.json", "no result file")):
        with pytest.raises(fastfair.UserError, match=says):
            fastfair.load_result(path)


@pytest.mark.parametrize("kwargs, argv", [
    ({"method": "nope"}, ["--method", "nope"]),
    ({"epochs": 0}, ["--epochs", "0"]),
    ({"sets": {"train.learning_rate": 0.1}}, ["--set", "train.learning_rate=0.1"]),
])
def test_train_errors_are_the_cli_s(tmp_path, capsys, kwargs, argv):
    with pytest.raises(fastfair.UserError) as err:
        fastfair.train("demo", out=tmp_path / "run", **kwargs)
    assert cli.main(["train", "--config", "demo", "--out", str(tmp_path / "run"), *argv]) == 2
    assert capsys.readouterr().err == f"fastfair: error: {err.value}\n"
    assert not (tmp_path / "run").exists()  # checked before the run folder is made


def test_train_unknown_keyword_suggests(tmp_path):
    with pytest.raises(fastfair.UserError, match="no setting 'epoch'. Did you mean epochs?"):
        fastfair.train("demo", out=tmp_path, epoch=2)


def test_public_names_resolve_and_help_lists_them():
    for name in fastfair.__all__:
        assert getattr(fastfair, name) is not None, name
    assert set(fastfair.__all__) <= set(dir(fastfair))
    text = pydoc.render_doc(fastfair)
    assert all(name in text for name in fastfair.__all__)
    with pytest.raises(AttributeError):
        fastfair.fingerprint  # noqa: B018  (private: not re-exported)


def test_import_is_light():
    code = "import sys, fastfair; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"


@pytest.mark.slow
def test_autoattack_from_python_is_the_cli_s(tmp_path):
    """``aa`` through fastfair.evaluate: the official AutoAttack, its re-check, and its resume file beside ``out``;
    the same confusion as fastfair eval's evaluation of the same model and images."""
    from shared_runs import TINY_AA, tiny_linear_aa, tiny_linear_case

    model, x, y, _ = tiny_linear_case()
    r = fastfair.evaluate(model, (x.float() / 255, y), attacks=["aa"], eps=TINY_AA["eps"], alpha=TINY_AA["alpha"],
                          batch_size=len(y), out=tmp_path / "aa.json")
    want, _ = tiny_linear_aa()  # fastfair eval's evaluation, shared with test_autoattack
    assert r.record["results"]["aa"]["confusion"] == want["confusion"]
    assert r.record["results"]["aa"]["autoattack"]["recheck"]["prediction_mismatches"] == 0
    assert (tmp_path / "aa.aa.npz").is_file() and 0 < r.avg("aa") < 100


def test_per_class_eps_needs_one_value_per_class(data):
    with pytest.raises(fastfair.UserError, match=r"eps: 3 radii for a model of 4 classes; give one number"):
        fastfair.evaluate(tiny_model(), data, attacks=["pgd3"], eps=[0.1, 0.1, 0.1])
    r = fastfair.evaluate(tiny_model(), data, attacks=["pgd3"], eps=[0.0, 0.0, 0.1, 0.1])
    clean = fastfair.evaluate(tiny_model(), data, attacks=["clean"])
    assert r.per_class("pgd3")["0"] == clean.per_class("clean")["0"]  # a zero radius leaves class 0 as it is


def test_method_refuses_what_train_refuses():
    with pytest.raises(fastfair.UserError, match="attack.eps"):
        fastfair.method("trades", num_classes=10, sets={"attack.eps": -1.0})
