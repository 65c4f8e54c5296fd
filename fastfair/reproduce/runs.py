"""A paper table expanded into runs: rows x seeds, at a scale, each a grid job in its own run folder.

Scales (:data:`SCALES`) say exactly what they change. ``full`` runs the presets as they are on the
full data set; ``subset`` keeps every method setting but swaps in a small real data set (the
first images of each class of an ``.npz``), fastfair's tiny CNN and a few epochs, with every
epoch count of the schedule (the keys naming an epoch, :func:`fastfair.checks.epoch_keys`) scaled to them
and kept within them; its numbers say how the code
behaves, never how close the paper came.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastfair import config, data
from fastfair.attacks import autoattack, names
from fastfair.checks import epoch_keys, last_acting
from fastfair.errors import UserError
from fastfair.registry import Registry
from fastfair.reproduce.paper import PaperRow
from fastfair.reproduce.tables import Table
from fastfair.rundir import RunDir

SUBSET_EPOCHS = 5
SUBSET_TRAIN_PER_CLASS = 100  # of which SUBSET_VAL_PER_CLASS form the validation split
SUBSET_VAL_PER_CLASS = 5
SUBSET_TEST_PER_CLASS = 50
SUBSET_MODEL = {"model.name": "tiny-cnn", "model.width": 16}
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# Where torchvision's loader (fastfair.data.datasets) finds each data set the tables use, under the data folder.
FULL_DATA = {"cifar10": ("cifar-10-batches-py", "CIFAR-10 python version (cifar-10-python.tar.gz)")}


@dataclass(frozen=True)
class Scale:
    comparable: bool  # may a verdict compare its numbers with the paper's
    # (data_dir, the reproduce folder) -> the data keys every run gets; checks the data first
    data: Callable[[str, Path], dict[str, Any]]
    # (the row's resolved config as flat keys, the user's --set keys) -> the keys this scale changes
    changes: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    # a paper's attack name -> the attack this scale runs for it (the subset scale shortens the costly ones)
    attack: Callable[[str], str] = lambda name: name


SCALES: Registry[Scale] = Registry("scale")


def _full_data(data_dir: str, out: Path) -> dict[str, Any]:
    root = Path(data_dir or os.environ.get("FASTFAIR_DATA", "~/.cache/fastfair/data")).expanduser()
    folder, what = FULL_DATA["cifar10"]
    if not (root / folder).is_dir():
        raise UserError(f"the paper tables use the full CIFAR-10, and {root / folder} does not exist: download the "
                        f"{what} from {CIFAR_URL}, unpack it into a folder and pass --data-dir FOLDER "
                        f"(or run --scale subset --data-dir FILE.npz for a quick look)")
    return {"data.data_dir": str(root)}


def _subset_data(data_dir: str, out: Path) -> dict[str, Any]:
    src = Path(data_dir).expanduser() if data_dir else None
    if src is None or src.suffix != ".npz" or not src.is_file():
        raise UserError(f"--scale subset reads a small real data set from an .npz file (uint8 x_train/x_test, int "
                        f"y_train/y_test, e.g. a CIFAR-10 subset); pass --data-dir FILE.npz (got {data_dir!r})")
    dest = out / "data" / "subset.npz"
    if not dest.is_file():  # written once, so a second invocation trains on the very same images
        # read as --dataset npz reads it: the file's format checked, its classes named as the npz data set names
        # them (its class_names, else a known data set's by file name and image shape, else "class i")
        classes = data.load("npz", src).classes
        with np.load(src) as f:
            train = _first_per_class(f["y_train"], SUBSET_TRAIN_PER_CLASS)
            test = _first_per_class(f["y_test"], SUBSET_TEST_PER_CLASS)
            arrays = {"x_train": f["x_train"][train], "y_train": f["y_train"][train],
                      "x_test": f["x_test"][test], "y_test": f["y_test"][test], "class_names": np.array(classes)}
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_suffix(f".{os.getpid()}.npz")  # complete or absent, whoever else reads it
        np.savez(partial, **arrays)
        os.replace(partial, dest)
    return {"data.dataset": "npz", "data.data_dir": str(dest.resolve()), "data.val_per_class": SUBSET_VAL_PER_CLASS}


def _first_per_class(labels: np.ndarray, n: int) -> np.ndarray:
    """Indices of the first ``n`` images of each class, in the file's order."""
    keep = np.zeros(len(labels), dtype=bool)
    for c in np.unique(labels):
        keep[np.flatnonzero(labels == c)[:n]] = True
    return np.flatnonzero(keep)


def _subset_changes(flat: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    epochs = int(user.get("train.epochs", SUBSET_EPOCHS))
    factor = epochs / flat["train.epochs"]

    def shrink(v: int) -> int:  # 0 keeps its meaning (from the start, never); others stay >= 1
        return v and max(1, round(v * factor))

    out = {**SUBSET_MODEL, "train.epochs": epochs}
    # every key naming an epoch shrinks with train.epochs, so a schedule keeps its shape, and stays where it acts
    # (DAFA/TRIX: at least one epoch with the weights after the warm-up); else check_epochs refuses the run
    for key, use in epoch_keys().items():
        if key not in flat:
            continue
        v, last = flat[key], last_acting(use, epochs)
        if isinstance(v, list):  # a milestone the shorter run never reaches is left out: it would not act
            out[key] = [n for n in map(shrink, v) if use.first(n) <= epochs]
        else:
            out[key] = shrink(v) if use.cut_short or last is None else min(shrink(v), last)
    return out


SUBSET_SEARCH = {"cwinf": 20, "nattack": 10}  # iterations of the optimisation and query attacks at subset scale
SUBSET_ATTACK_PER_CLASS = 5  # images a class of a NAME/N attack at subset scale


def _subset_attack(name: str) -> str:
    """The cheaper attack the subset scale runs for a paper's ``name``: C&W L-inf and NATTACK with
    :data:`SUBSET_SEARCH` iterations, ``NAME/N`` on at most :data:`SUBSET_ATTACK_PER_CLASS` images a class."""
    prefix = names.TRANSFER if names.is_transfer(name) else ""
    base, _, cap = name[len(prefix):].partition("/")
    base = next((f"{kind}{n}" for kind, n in SUBSET_SEARCH.items() if base == kind), base)
    cap = f"/{min(int(cap), SUBSET_ATTACK_PER_CLASS)}" if cap else ""
    return f"{prefix}{base}{cap}"


SCALES.register("full", "the presets as they are, on the full CIFAR-10 (--data-dir FOLDER): the paper's table")(
    Scale(True, _full_data, lambda flat, user: {}))
SCALES.register("subset", f"the first {SUBSET_TRAIN_PER_CLASS} train / {SUBSET_TEST_PER_CLASS} test images per class "
                          f"of --data-dir FILE.npz ({SUBSET_VAL_PER_CLASS} per class for validation), tiny-cnn width "
                          f"16, {SUBSET_EPOCHS} epochs with the schedule's epoch counts scaled, C&W L-inf and "
                          f"NATTACK at {SUBSET_SEARCH['cwinf']} and {SUBSET_SEARCH['nattack']} iterations on at most "
                          f"{SUBSET_ATTACK_PER_CLASS} images a class: for CI and a quick look, not comparable to the "
                          "paper")(Scale(False, _subset_data, _subset_changes, _subset_attack))


@dataclass(frozen=True)
class PlannedRun:
    row: PaperRow
    seed: int
    name: str  # folder name under OUT/runs
    sets: dict[str, Any]  # every override of the preset, as --set takes them
    attacks: tuple[str, ...]  # the attacks the run evaluates
    averaged: bool  # the paper's number is the EMA/FAWA model's
    runs_for: dict[str, str]  # a paper's attack name -> the attack run for it (the scale's)

    def run_dir(self, out: Path) -> Path:
        return out / "runs" / self.name


def paper_attacks(row: PaperRow) -> tuple[str, ...]:
    """The attacks the paper's numbers need, clean first (cheap, and every report shows it)."""
    return tuple(dict.fromkeys(["clean", *row.numbers]))


def plan(table: Table, seeds: int, scale: str, data_dir: str, out: Path, user_sets: dict[str, Any]) -> list[PlannedRun]:
    """Every run of ``table``: its rows x seeds 0..seeds-1, with the scale's and the user's overrides."""
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1; got {seeds}")
    spec = SCALES.get(scale)
    data = spec.data(data_dir, out)
    runs = []
    for row in table.ordered():
        flat = config.flatten(config.resolve(row.preset).to_dict())
        runs_for = {a: spec.attack(a) for a in paper_attacks(row)}
        attacks = tuple(dict.fromkeys(runs_for.values()))
        for seed in range(seeds):
            name = f"{row.preset}-s{seed}"
            sets = {**data, **spec.changes(flat, user_sets), "train.seed": seed, "eval.attacks": list(attacks)}
            if row.init_from:  # FRL fine-tunes the same seed's run of the row it names, its selected checkpoint
                base = config.resolve(row.init_from)
                sets["train.init_from"] = str(RunDir(out / "runs" / f"{row.init_from}-s{seed}")
                                              .selected_checkpoint(base.train.select).resolve())
            if row.substitute:  # transfer attacks are made on the same seed's run of the row it names
                sets["eval.substitute"] = str((out / "runs" / f"{row.substitute}-s{seed}").resolve())
            sets.update(user_sets)
            runs.append(PlannedRun(row, seed, name, sets, attacks, flat["train.averaging"] != "none", runs_for))
    return runs


def needs_autoattack(runs: list[PlannedRun]) -> bool:
    return any(autoattack.NAME in r.attacks for r in runs)
