"""The Python API refuses what the CLI refuses, through the same checks and with the same message (issue 44).

Each row gives a bad value on the command line (``fastfair.cli.main`` in-process, as a user types it) and the same
value to ``fastfair.evaluate``, ``fastfair.train``, ``fastfair.method``, ``fastfair.PGD`` or ``fastfair.per_class``;
both must end in the one ``fastfair: error:`` line's text. Where the CLI read the value from a file (an .npz's
labels), its line names the file and the array first. ``test_every_check_is_walked`` keeps the table whole: every
keyword of ``fastfair.evaluate`` is walked or said to have nothing to check, every config key it takes
(``api.EVALUATE_KEYS``) and every PGD field that is a config key has a row, and PGD's rules are the config's.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

import fastfair
from fastfair import api, checks, cli, config, models
from fastfair.attacks import pgd
from helpers import NPZ_TRAIN, small_npz

TRAIN = ["train", "--config", "demo", "--out", "{tmp}/out"]
# a folder that is no run: every eval check below runs before the target is read (one that is not there at all is
# refused first, before torch loads: tests/test_cli_startup.py)
EVAL = ["eval", "{tmp}"]


def model(features: int = 3 * 4 * 4) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(features, 4))


def data(n: int = 40, shape=(3, 4, 4)):
    return torch.rand(n, *shape, generator=torch.Generator().manual_seed(0)), torch.arange(n) % 4


def evaluate(**kwargs) -> Callable:
    return lambda tmp: fastfair.evaluate(model(), data(), attacks=kwargs.pop("attacks", ["clean"]), **kwargs)


def evaluate_labels(y: torch.Tensor, n: int) -> Callable:
    """The .npz's labels given to evaluate: ``n`` 8x8 grey images, a model of 4 classes."""
    return lambda tmp: fastfair.evaluate(model(64), (data(n, (1, 8, 8))[0], y), attacks=["clean"])


def from_file(array: str) -> Callable[[str, Path], str]:
    """The CLI's line for a bad array of an .npz: the file and the array's name before the API's text about y."""
    return lambda said, tmp: f"{tmp / 'data.npz'}: {array}{said.removeprefix('y')}"


def model_file(tmp: Path, classes: int = 4) -> None:
    """A tiny-cnn's weights as a model file fastfair did not write, and the .npz it is evaluated on (enough training
    images for the data set's validation split)."""
    small_npz(tmp, x_train=np.zeros((440, 8, 8), np.uint8), y_train=np.arange(440) % classes,
              y_test=np.arange(40) % classes)
    torch.save(models.build("tiny-cnn", num_classes=classes, in_channels=1, mean=[0.0], std=[1.0]).state_dict(),
               tmp / "model.pt")


def three_classes(attacks: list[str]) -> Callable:
    """evaluate on a model of 3 classes."""
    return lambda tmp: fastfair.evaluate(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3)),
                                         (data(30)[0], torch.arange(30) % 3), attacks=attacks)


@dataclass
class Row:
    argv: list[str]  # {tmp}: the test's folder
    api: Callable  # (tmp) -> raises the UserError
    keyword: str  # what it walks: a keyword of fastfair.evaluate, or the PGD field / config key
    setup: Callable | None = None  # (tmp) -> writes the bad file the CLI reads
    cli_said: Callable[[str, Path], str] = lambda said, tmp: said  # the API's text as the CLI's line says it


def bad_key(key: str, value, api_call: Callable, keyword: str) -> Row:
    """``--set key=value`` on a new run against the API call; fastfair.train(sets=...) is walked with it."""
    return Row([*TRAIN, "--set", f"{key}={value}"], api_call, keyword)


ROWS: dict[str, Row] = {
    # the config keys fastfair.evaluate takes (api.EVALUATE_KEYS): eps as the CLI reads it, in [0, 1]
    "eps-8": bad_key("eval.eps", 8, evaluate(eps=8), "eps"),
    "eps-negative": bad_key("eval.eps", -1, evaluate(eps=-1), "eps"),
    "alpha-2": bad_key("eval.alpha", 2, evaluate(alpha=2), "alpha"),
    "cw-kappa": bad_key("eval.cw_kappa", -1, evaluate(cw_kappa=-1), "cw_kappa"),
    "seed-text": bad_key("eval.seed", "x", evaluate(seed="x"), "seed"),
    "clip-start-number": bad_key("eval.clip_start", 1, evaluate(clip_start=1), "clip_start"),
    "eval-batch-size-set": bad_key("data.eval_batch_size", 0, evaluate(batch_size=0), "batch_size"),
    "eval-batch-size-flag": Row([*EVAL, "--batch-size", "0"], evaluate(batch_size=0), "batch_size"),
    "eval-batch-size-text": Row([*EVAL, "--batch-size", "x"], evaluate(batch_size="x"), "batch_size"),
    "eval-seed-text": Row([*EVAL, "--seed", "1.5"], evaluate(seed=1.5), "seed"),
    # fastfair train's typed flags, read as the keys they set (fastfair.train takes them by their Python names)
    "epochs-float": Row([*TRAIN, "--epochs", "1.5"], lambda tmp: fastfair.train("demo", out=tmp / "out", epochs=1.5),
                        "train.epochs"),
    "quick-text": Row([*TRAIN, "--quick", "some"], lambda tmp: fastfair.train("demo", out=tmp / "out", quick="some"),
                      "data.train_per_class"),
    # attack names, as fastfair eval --attacks takes them
    "attack-unknown": Row([*EVAL, "--attacks", "clean,autoattack"], evaluate(attacks="clean,autoattack"), "attacks"),
    "attack-spelling": Row([*EVAL, "--attacks", "PGD-20"], evaluate(attacks=["PGD-20"]), "attacks"),
    "attacks-none": Row([*EVAL, "--attacks", ","], evaluate(attacks=[]), "attacks"),
    "attack-no-step": Row([*EVAL, "--attacks", "pgd0"], evaluate(attacks=["pgd0"]), "attacks"),
    "attack-no-restart": Row([*EVAL, "--attacks", "pgd10x0"], evaluate(attacks=["pgd10x0"]), "attacks"),
    "attack-per-class-0": Row([*EVAL, "--attacks", "fgsm/0"], evaluate(attacks=["fgsm/0"]), "attacks"),
    "attack-corruption": Row([*EVAL, "--attacks", "corrupt:fog@9"], evaluate(attacks=["corrupt:fog@9"]), "attacks"),
    # a run's eval.substitute may hold the substitute: checked once the model is read (here, a model file)
    "transfer-without-substitute": Row(["eval", "{tmp}/model.pt", "--model", "tiny-cnn", "--dataset", "npz",
                                        "--data-dir", "{tmp}/data.npz", "--attacks",
                                        "transfer:pgd2", "--quiet"], evaluate(attacks=["transfer:pgd2"]), "attacks",
                                       lambda tmp: model_file(tmp)),
    # AutoAttack's targeted DLR loss reads 4 logits: a model of 3 classes is refused before the attacks ahead of it
    "aa-three-classes": Row(["eval", "{tmp}/model.pt", "--model", "tiny-cnn", "--dataset", "npz", "--data-dir",
                             "{tmp}/data.npz", "--attacks", "clean,aa", "--quiet"], three_classes(["clean", "aa"]),
                            "attacks", lambda tmp: model_file(tmp, classes=3)),
    "substitute-without-transfer": Row([*EVAL, "--substitute", "{tmp}/other"],
                                       evaluate(attacks=["pgd2"], substitute=model()), "substitute"),
    "aa-backend": Row([*EVAL, "--aa-backend", "mine"], evaluate(aa_backend="mine"), "aa_backend"),
    # labels: an .npz's arrays (fastfair train --dataset npz) and evaluate's y, by one check
    "labels-range": Row([*TRAIN, *NPZ_TRAIN], evaluate_labels(torch.arange(40) % 10, 40), "data",
                        lambda tmp: small_npz(tmp, y_test=np.arange(40) % 10), from_file("y_test")),
    "labels-float": Row([*TRAIN, *NPZ_TRAIN], evaluate_labels(torch.arange(200, dtype=torch.float64) % 4 + 0.5, 200),
                        "data",
                        lambda tmp: small_npz(tmp, y_train=np.arange(200) % 4 + 0.5), from_file("y_train")),
    "labels-negative": Row([*TRAIN, *NPZ_TRAIN], evaluate_labels(torch.arange(40) % 5 - 1, 40), "data",
                           lambda tmp: small_npz(tmp, y_test=np.arange(40) % 5 - 1), from_file("y_test")),
    "labels-count": Row([*TRAIN, *NPZ_TRAIN], evaluate_labels(torch.arange(150) % 4, 200), "data",
                        lambda tmp: small_npz(tmp, y_train=np.arange(150) % 4), from_file("y_train")),
    # the training attack's keys: fastfair.PGD's fields and fastfair.per_class's radii (fastfair.method: sets=)
    "pgd-steps": bad_key("attack.steps", 0, lambda tmp: fastfair.PGD(steps=0), "attack.steps"),
    "pgd-objective": bad_key("attack.objective", "mse", lambda tmp: fastfair.PGD(objective="mse"), "attack.objective"),
    "pgd-init": bad_key("attack.init", "zeros", lambda tmp: fastfair.PGD(init="zeros"), "attack.init"),
    "pgd-bn-mode": bad_key("attack.bn_mode", "frozen", lambda tmp: fastfair.PGD(bn_mode="frozen"), "attack.bn_mode"),
    "pgd-eps": bad_key("attack.eps", 8, lambda tmp: fastfair.per_class(8, 10, "cpu"), "attack.eps"),
    "pgd-alpha": bad_key("attack.alpha", -1, lambda tmp: fastfair.per_class(-1, 10, "cpu", "attack.alpha"),
                         "attack.alpha"),
    "device": Row([*TRAIN, "--device", "gpu"], lambda tmp: fastfair.method("pgd-at", num_classes=10, device="gpu"),
                  "train.device"),
}

# fastfair.evaluate's keywords with no value the CLI checks, and why
NOTHING_TO_CHECK = {
    "model": "any nn.Module; its outputs are checked against the labels and class names",
    "classes": "names of the model's outputs (the CLI takes the data set's): checked against their number",
    "bf16": "a switch, --bf16", "progress": "a switch, --quiet", "out": "a path, written as fastfair eval writes",
    "source": "a record of where the model came from, written as given",
}


@pytest.mark.parametrize("name", list(ROWS))
def test_the_api_refuses_what_the_cli_refuses_with_its_message(name, tmp_path, capsys):
    row = ROWS[name]
    if row.setup:
        row.setup(tmp_path)
    assert cli.main([a.format(tmp=tmp_path) for a in row.argv]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    with pytest.raises(fastfair.UserError) as api_err:
        row.api(tmp_path)
    assert err[0] == "fastfair: error: " + row.cli_said(str(api_err.value), tmp_path)
    assert "Traceback" not in err[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", [n for n, row in ROWS.items() if row.argv[-2] == "--set"])
def test_train_and_method_refuse_the_same_keys(name, tmp_path, capsys):
    key, _, value = ROWS[name].argv[-1].partition("=")
    assert cli.main([a.format(tmp=tmp_path) for a in ROWS[name].argv]) == 2
    said = capsys.readouterr().err.strip().removeprefix("fastfair: error: ")
    sets = config.parse_set([f"{key}={value}"])
    with pytest.raises(fastfair.UserError) as err:
        fastfair.train("demo", out=tmp_path / "out", sets=sets)
    assert str(err.value) == said
    with pytest.raises(fastfair.UserError) as err:
        fastfair.method("pgd-at", num_classes=10, dataset="digits", sets=sets)
    assert str(err.value) == said


def test_every_check_is_walked():
    walked = {row.keyword for row in ROWS.values()}
    keywords = set(inspect.signature(fastfair.evaluate).parameters)
    assert keywords - walked == set(NOTHING_TO_CHECK), "classify the new keyword: a row, or NOTHING_TO_CHECK"
    assert set(api.EVALUATE_KEYS) <= walked
    for field, (key, _, rule) in pgd.CHECKED.items():
        if key.startswith("attack."):  # restarts: pgdKxR's, walked as an attack name
            assert key in walked, key
            assert (checks.RANGES.get(key) or checks.NAMES.get(key)) is rule, f"{field}: not the config's rule"


def test_eps_in_units_of_255_is_refused_as_the_cli_refuses_it():
    """The issue's case: eps=8 reported 0.00 % for every class; eps is in [0, 1] on both sides, 8/255 is 0.0314."""
    with pytest.raises(fastfair.UserError, match=r"^eval.eps=8.0 is out of range: it must be within \[0, 1\] "
                                                 r"\(images are in \[0, 1\]: 8/255 is 0.0314\)$"):
        fastfair.evaluate(model(), data(), eps=8)
    r = fastfair.evaluate(model(), data(), attacks=["pgd2"], eps=[8 / 255] * 4, alpha=2 / 255, progress=False)
    assert r.record["eps"] == [8 / 255] * 4


def test_train_refuses_autoattack_on_three_classes_before_it_trains(tmp_path, capsys):
    """eval.attacks' aa on a data set of 3 classes: refused as training starts, not after it, in the final evaluation
    (pyautoattack's IndexError)."""
    model_file(tmp_path, classes=3)  # its .npz
    out = tmp_path / "out"
    argv = ["train", *(a.format(tmp=tmp_path) for a in NPZ_TRAIN), "--epochs", "1", "--device", "cpu", "--quiet",
            "--set", "eval.attacks=['clean', 'aa']", "--out", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["fastfair: error: eval.attacks: AutoAttack (aa) needs a model of at least 4 classes (its APGD-T's "
                   "targeted DLR loss reads the 4 largest logits) and this one has 3; fastfair has no AutoAttack "
                   "without its targeted attacks, so use pgd100 and cw100 (or pgd20, cw20)"], err
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
