"""A paper table expanded into runs: rows x seeds, at a scale, each a grid job in its own run folder.

Scales (:data:`SCALES`) say exactly what they change. ``full`` runs the presets as they are on the
full data set; ``subset`` keeps every method setting but swaps in a small real data set (the
first images of each class of an ``.npz``), fastfair's tiny CNN and a few epochs, with every
epoch count of the schedule (the keys naming an epoch, :func:`fastfair.checks.epoch_keys`) scaled to them
and kept within them; its numbers say how the code
behaves, never how close the paper came. A table whose rows train on several data sets (Tian et al. KDD
Table 5) takes, at subset scale, a folder of ``<dataset>-subset.npz`` files; a row whose data set has none
there is not run, and the report says so.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from fastfair import config, data
from fastfair.attacks import autoattack, names
from fastfair.checks import epoch_keys, last_acting
from fastfair.data.shared_subsets import SUBSETS
from fastfair.errors import UserError
from fastfair.evaluation import robustbench as rb
from fastfair.registry import Registry
from fastfair.reproduce.paper import PaperRow
from fastfair.reproduce.tables import Table
from fastfair.rundir import RunDir, write_npz_atomic
from fastfair.training.optim import READ_BY

SUBSET_EPOCHS = 5
SUBSET_TRAIN_PER_CLASS = 100  # of which SUBSET_VAL_PER_CLASS form the validation split
SUBSET_VAL_PER_CLASS = 5
SUBSET_TEST_PER_CLASS = 50
SUBSET_MODEL = {"model.name": "tiny-cnn", "model.width": 16}
# model.width per architecture where a section compares architectures (Benz et al. Sec. 3.1) at subset scale: each
# row keeps its layers and connections, with about a quarter of the paper's channels (a 2-core CPU trains the section
# in minutes); 0 keeps the paper's width
SUBSET_WIDTHS: dict[str, int] = {"lenet": 0, "vgg16": 16, "vgg19": 16, "resnet18": 16, "resnet50-cifar": 16,
                                  "densenet121": 16, "densenet169": 16, "googlenet": 48, "inception-v3": 8}
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
# Where fastfair's loaders (fastfair.data.datasets) find each data set the tables use, under the data folder,
# what to put there, and from where.
FULL_DATA = {
    "cifar10": ("cifar-10-batches-py", "CIFAR-10 python version (cifar-10-python.tar.gz)", CIFAR_URL),
    "cifar100": ("cifar-100-python", "CIFAR-100 python version (cifar-100-python.tar.gz)", CIFAR_URL),
    "mnist": ("MNIST/raw", "MNIST's four idx files (torchvision.datasets.MNIST(FOLDER, download=True) puts them there)",
              "https://yann.lecun.com/exdb/mnist/"),
    "svhn": ("test_32x32.mat", "SVHN's train_32x32.mat and test_32x32.mat", "http://ufldl.stanford.edu/housenumbers/"),
    "stl10": ("stl10_binary", "STL-10 binary version (stl10_binary.tar.gz)", "https://cs.stanford.edu/~acoates/stl10/"),
    "imagenet": ("imagenet", "ImageNet ILSVRC-2012 train/ and val/, a folder per class (wnid)",
                 "https://image-net.org/download.php"),
}


class NoData(UserError):
    """A row's data set is not in the subset folder: the row is not run at this scale."""


@dataclass(frozen=True)
class Scale:
    comparable: bool  # may a verdict compare its numbers with the paper's
    # (data_dir, the reproduce folder, the row's data set) -> the data keys its runs get; checks the data first
    # (raises NoData where a row's data set is absent and the row can be left out)
    data: Callable[[str, Path, str], dict[str, Any]]
    # (the row's resolved config as flat keys, the user's --set keys) -> the keys this scale changes
    changes: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]
    # a paper's attack name -> the attack this scale runs for it (the subset scale shortens the costly ones)
    attack: Callable[[str], str] = lambda name: name
    # a row's model name -> the model keys this scale sets where the model is what a study's section varies
    # (Benz et al. Sec. 3.1, architectures): the row keeps its architecture, made small enough for the scale
    architecture: Callable[[str], dict[str, Any]] = lambda name: {}


SCALES: Registry[Scale] = Registry("scale")


def _full_data(data_dir: str, out: Path, dataset: str) -> dict[str, Any]:
    root = Path(data_dir or os.environ.get("FASTFAIR_DATA", "~/.cache/fastfair/data")).expanduser()
    folder, what, url = FULL_DATA[dataset]
    if not (root / folder).exists():
        raise UserError(f"the paper tables use the full {dataset}, and {root / folder} does not exist: download the "
                        f"{what} from {url}, unpack it into a folder and pass --data-dir FOLDER "
                        f"(or run --scale subset --data-dir FILE.npz for a quick look)")
    # torchvision's data sets live side by side under one folder; ImageNet is its own folder (train/, val/)
    return {"data.data_dir": str(root / folder if dataset == "imagenet" else root)}


def _subset_data(data_dir: str, out: Path, dataset: str) -> dict[str, Any]:
    src = Path(data_dir).expanduser() if data_dir else None
    if src is not None and src.is_dir():  # a folder of <dataset>-subset.npz files: a table over several data sets
        found = src / f"{dataset}-subset.npz"
        if not found.is_file():
            raise NoData(f"no {found.name} in {src}{_make_subset(dataset, found)}")
        src, dest = found, out / "data" / found.name
    elif src is not None and src.suffix == ".npz" and not src.is_file():
        raise UserError(f"--data-dir {src} does not exist{_make_subset(dataset, src)}")
    elif src is None or src.suffix != ".npz" or not src.is_file():
        raise UserError(f"--scale subset reads a small real data set from an .npz file (uint8 x_train/x_test, int "
                        f"y_train/y_test, e.g. a CIFAR-10 subset); pass --data-dir FILE.npz, or a folder of "
                        f"<dataset>-subset.npz files for a table over several data sets (got {data_dir!r})")
    else:
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
        write_npz_atomic(arrays, dest)  # complete or absent, whoever else reads it
    return {"data.dataset": "npz", "data.data_dir": str(dest.resolve()), "data.val_per_class": SUBSET_VAL_PER_CLASS}


def _make_subset(dataset: str, path: Path) -> str:
    """How to make the project's real-data subset of ``dataset`` at ``path`` ('' where there is none)."""
    return (f"; make it from the official {dataset} files with `fastfair data subset {dataset} --data-dir FOLDER "
            f"--out {path}`" if dataset in SUBSETS else "")


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
        section, _, name = key.partition(".")
        choice, readers = READ_BY.get(name, ("", ())) if section == "train" else ("", ())
        if key not in flat or (choice and flat[f"train.{choice}"] not in readers):  # absent, or unread by this run
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
                          f"{SUBSET_ATTACK_PER_CLASS} images a class (a section comparing architectures keeps each "
                          "row's at a quarter of its width): for CI and a quick look, not comparable to the paper")(
    Scale(False, _subset_data, _subset_changes, _subset_attack,
          lambda name: {"model.name": name, "model.width": SUBSET_WIDTHS.get(name, 0)}))


@dataclass(frozen=True)
class PlannedRun:
    row: PaperRow
    seed: int
    name: str  # folder name under OUT/runs
    sets: dict[str, Any]  # every override of the preset, as --set takes them
    attacks: tuple[str, ...]  # the attacks the run evaluates
    averaged: bool  # the paper's number is the EMA/FAWA model's
    runs_for: dict[str, str]  # a paper's attack name -> the attack run for it (the scale's)
    missing: str = ""  # why the run is left out at this scale (its data set is not in the subset folder)

    def run_dir(self, out: Path) -> Path:
        return out / "runs" / self.name


def paper_attacks(row: PaperRow, preset_attacks: list[str]) -> tuple[str, ...]:
    """The attacks the paper's numbers need, clean first (cheap, and every report shows it); a protocol row, which
    has no numbers, runs its preset's ``eval.attacks``."""
    return tuple(dict.fromkeys(["clean", *(preset_attacks if row.protocol else [*row.numbers, *row.last])]))


def _released_missing(row: PaperRow, model_dir: str | None) -> str:
    """Why the row's released model cannot be evaluated here ('' when it can): RobustBench's package or weights, or
    the authors' file not placed yet."""
    if row.released:
        placed = row.released.path(model_dir).is_file()
        return "" if placed else f"the authors' released model is not there yet: {row.released.place(model_dir)}"
    return _robustbench_missing(row.robustbench, model_dir)


def _robustbench_missing(name: str, model_dir: str | None) -> str:
    """Why RobustBench's model ``name`` (a row's, or a distillation row's teacher) cannot be used here ('' when it
    can): the package or the weights."""
    if not rb.installed():
        return "it is RobustBench's model and needs fastfair[robustbench] (pip install 'fastfair[robustbench]')"
    path = rb.model_file(name, model_dir=model_dir)
    if not path.is_file():
        return f"no weights for RobustBench's {name} at {path}: {rb.place(name, 'cifar10', rb.THREAT, model_dir)}"
    return ""


def row_seeds(row: PaperRow, seeds: int | None, scale: str) -> int:
    """The seeds ``row`` runs: ``seeds`` (``--seeds N``) where given; else its paper's count (``[paper] seeds``) at a
    scale comparable to the paper, and 1 at one that is not (its verdicts say "not comparable" whatever the seeds,
    so a quick look, CI's included, runs once a row)."""
    if seeds is not None and seeds < 1:
        raise UserError(f"--seeds must be at least 1; got {seeds}")
    if seeds is not None:
        return seeds
    return row.seeds if SCALES.get(scale).comparable else 1


def seeds_text(rows: list[PaperRow], seeds: int | None, scale: str) -> str:
    """How many seeds the rows run and why, in a phrase (``--list`` and the report say it)."""
    if seeds is not None:
        return f"{seeds} per row (--seeds {seeds})"
    if not SCALES.get(scale).comparable:
        return f"1 per row (the {scale} scale is not comparable to the paper; --seeds N runs more)"
    counts = Counter(r.seeds for r in rows)
    return "per row its paper's count: " + ", ".join(f"{n} ({k} row{'s' * (k > 1)})" for n, k in sorted(counts.items()))


def plan(table: Table, seeds: int | None, scale: str, data_dir: str, out: Path, user_sets: dict[str, Any],
         model_dir: str | None = None, paper_selection: bool = False) -> list[PlannedRun]:
    """Every run of ``table``: each row x its seeds 0..N-1 (:func:`row_seeds`), with the scale's and the user's
    overrides. A row that is a released model (``[paper] robustbench`` or ``released``) is evaluated, not trained: its
    runs take the data, seed, attacks and substitute keys only; without its weights it is left out at a scale that is
    not the paper's and refused at one that is, except an authors' file, which is placed by hand: its row is left
    out, pending, and says where to put the file. ``paper_selection``: the rows that record the paper's own
    checkpoint rule (``[paper] paper_selection``) pick their checkpoint by it."""
    spec = SCALES.get(scale)
    flats = {row.preset: config.flatten(config.resolve(row.preset).to_dict()) for row in table.ordered()}
    datasets = sorted({flat["data.dataset"] for flat in flats.values()})
    # a study's section whose rows differ in their model compares architectures: each row keeps its own
    architectures = table.protocol and len({flat["model.name"] for flat in flats.values()}) > 1
    if len(datasets) > 1 and not spec.comparable and data_dir and Path(data_dir).expanduser().is_file():
        raise UserError(f"{table.key} trains on {', '.join(datasets)}: at --scale {scale} pass --data-dir FOLDER "
                        f"holding {', '.join(f'{d}-subset.npz' for d in datasets)} (a row whose file is not there is "
                        "not run), not one file")
    runs = []
    for row in table.ordered():
        flat = flats[row.preset]
        try:
            data, missing = spec.data(data_dir, out, flat["data.dataset"]), ""
        except NoData as why:
            data, missing = {}, str(why)
        if row.evaluated and not missing and (missing := _released_missing(row, model_dir)):
            # an authors' file is placed by hand: its row waits, pending, beside the re-trained one
            if spec.comparable and not row.released:
                raise UserError(f"{table.key} row {row.row} ({row.preset}): {missing}")
        teacher = flat.get("method.teacher", "")  # a distillation row's RobustBench teacher (ABSLD), in --model-dir
        if teacher.startswith(rb.PREFIX) and not missing and (
                missing := _robustbench_missing(teacher[len(rb.PREFIX):], model_dir)):
            missing = f"its teacher: {missing}"
            if spec.comparable:
                raise UserError(f"{table.key} row {row.row} ({row.preset}): {missing}")
        runs_for = {a: spec.attack(a) for a in paper_attacks(row, flat["eval.attacks"])}
        attacks = tuple(dict.fromkeys(runs_for.values()))
        for seed in range(row_seeds(row, seeds, scale)):
            name = f"{row.preset}-s{seed}"
            trains = {} if row.evaluated else spec.changes(flat, user_sets)
            if architectures and trains:
                trains = {**trains, **spec.architecture(flat["model.name"])}
            sets = {**data, **trains, "train.seed": seed, "eval.attacks": list(attacks)}
            if teacher.startswith(rb.PREFIX) and model_dir:
                sets["method.teacher_model_dir"] = model_dir
            if row.init_from:  # FRL fine-tunes the same seed's run of the row it names, its selected checkpoint
                base = config.resolve(row.init_from)
                sets["train.init_from"] = str(RunDir(out / "runs" / f"{row.init_from}-s{seed}")
                                              .selected_checkpoint(base.train.select).resolve())
            # transfer attacks are made on the same seed's run of the row it names; none left by the user's
            # eval.attacks (a figure that reads no attack of the row): no substitute, which would be refused as idle
            if row.substitute and any(map(names.is_transfer, user_sets.get("eval.attacks", attacks))):
                sets["eval.substitute"] = str((out / "runs" / f"{row.substitute}-s{seed}").resolve())
            if paper_selection:
                sets.update(row.paper_selection)
            if sets.get("train.select_split", flat["train.select_split"]) == "test":  # nothing is held out (the
                sets.pop("data.val_per_class", None)  # paper's rule, or a preset scoring every epoch on the test
                # set: Tian et al.'s Fig. 1): the scale's validation size would only draw a does-nothing warning
            sets.update(user_sets)
            runs.append(PlannedRun(row, seed, name, sets, attacks, flat["train.averaging"] != "none", runs_for,
                                   missing))
    return runs


def needs_autoattack(runs: list[PlannedRun]) -> bool:
    return any(autoattack.NAME in r.attacks for r in runs)
