"""The ME-AT/ME-TRADES paper (ICLR 2022 submission): its figures as ``fastfair reproduce`` targets.

Every figure reads the finished runs' selected checkpoints on the test split as the paper does (Sec. 1, Sec. 2):
per-class natural and PGD-10 accuracy from the runs' evaluation records (:meth:`FigureRuns.per_class`, which
evaluates PGD-10 once where a row's record lacks it), and what no record holds, measured here: in the penultimate
feature space each class's inter-class similarity (the largest cosine between its feature mean and another
class's, Fig. 2a) and intra-class variance (Fig. 2b), through :func:`fastfair.evaluation.diagnose.collect` and
:mod:`fastfair.evaluation.measures`. Features and similarities are of clean test images: the paper measures "each
class in the CIFAR10 test set" and names no attack for them.

The figures state few numbers: Fig. 3's (cat 7.03 / 0, car 98.4 / 72.2) and Fig. 5's (cat vs dog, cat vs car)
are in their row presets' ``[paper]`` sections, which reproduce compares; the rest of the text describes shapes
("almost half", "the largest"), which the drawers draw and do not score.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from fastfair import build, config
from fastfair.errors import UserError, WriteError
from fastfair.evaluation import diagnose, measures
from fastfair.reports import figures
from fastfair.reproduce.figures.registry import FigureRuns, figure, inventory, pending
from fastfair.reproduce.verdict import Comparison
from fastfair.rundir import RunDir, load_checkpoint, load_npz, notice, write_npz_atomic

SOURCE = "me"
ST, ST_2D = "me-fig1-standard", "me-fig4-standard-2d"
PGD_AT, PGD_AT_LS, ME_AT = "me-table3-pgd-at", "me-table3-pgd-at-ls", "me-table3-me-at-b0.5"
TRADES, TRADES_LS, ME_TRADES = "me-table2-trades-l6", "me-table4-trades-ls", "me-table2-me-trades-l15"
TRADES_L1, TRADES_L12 = "me-fig9-trades-l1", "me-table2-trades-l12"
SINGLE_AT = {1: "me-fig3-single-at-car", 3: "me-fig3-single-at-cat",
             **{k: f"me-fig8-single-at-{n}" for k, n in ((0, "airplane"), (2, "bird"), (4, "deer"), (5, "dog"),
                                                         (6, "frog"), (7, "horse"), (8, "ship"), (9, "truck"))}}
PAIRS = ("airplane", "car", "bird", "deer", "dog", "frog", "horse", "ship", "truck")  # Fig. 5: cat vs each
BINARY = {m: tuple(f"me-fig5-binary-cat-{k}-{m}" for k in PAIRS) for m in ("pgd-at", "trades")}
CAT = 3  # CIFAR-10's cat, the class Fig. 5 pairs with every other
ATTACK = "pgd10"  # the robust errors of every figure (Sec. 1: PGD-10)

inventory(SOURCE, ["Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6", "Table 1", "Fig. 7",
                   "Table 2", "Table 3", "Table 4", "Fig. 8", "Fig. 9", "Table 5"])


@dataclass(frozen=True)
class Measured:
    """One run's selected checkpoint's clean features on the test split (its accuracies are its record's)."""

    classes: list[str]
    cosine: np.ndarray  # (C, C) cosine of the class means of clean features
    similarity: np.ndarray  # each class's largest cosine to another class (Fig. 2a)
    variance: np.ndarray  # each class's feature variance (Fig. 2b)
    features: np.ndarray  # (N, 2) clean features for the scatter of Figs. 3 and 8; (N, 0) where D > 2 (not drawn)
    labels: np.ndarray


def _settings(cfg) -> dict:
    """What a measurement depends on besides the checkpoint's weights: the test set."""
    return {"split": "test", "dataset": cfg.data.dataset, "data_dir": cfg.data.data_dir,
            "test_per_class": cfg.data.test_per_class}


def _measure(path: Path, device: str) -> Measured:
    """The checkpoint's clean features' measures on the test split (no attack: the features are of clean images)."""
    _, cfg, dev, model, bundle, data = build.from_checkpoint(path, split="test", device_name=device, data_dir=None,
                                                             batch_size=None, channels_last_ok=False)
    c = bundle.num_classes
    d = diagnose.collect(model, build.eval_loader(cfg, data, dev, False), "clean", eps=cfg.eval.eps,
                         alpha=cfg.eval.alpha, num_classes=c)
    y = d["y"]
    return Measured(list(bundle.classes), measures.class_mean_cosine(d["feat_clean"], y, c),
                    measures.inter_class_similarity(d["feat_clean"], y, c)[0],
                    measures.intra_class_variance(d["feat_clean"], y, c),
                    d["feat_clean"] if d["feat_clean"].shape[1] == 2 else d["feat_clean"][:, :0], y)


def _stored(path: Path, key: str) -> Measured | None:
    """The measurement in ``path`` if it was made under ``key``; None when there is none, it is of another key, or
    the file is damaged (cut short by a full disk or a copy, bytes changed: numpy checks each part's CRC-32):
    said, and measured again rather than refused, as it is fastfair's own cache."""
    if not path.is_file():
        return None
    try:
        f = load_npz(path, "measuring again")
        if str(f["key"]) != key:
            return None
        return Measured(**{k.name: f[k.name] for k in fields(Measured)} | {"classes": f["classes"].tolist()})
    except UserError as err:
        notice(f"warning: {err}")
        return None
    except (OSError, KeyError):  # unreadable, or of an older layout
        return None


def _measured_checkpoint(path: Path, device: str, echo) -> Measured:
    """:func:`_measure` of the checkpoint, kept beside its run (``diagnostics/<checkpoint>-test-clean.npz``) and
    reused while the checkpoint (its path and mtime) and the settings (:func:`_settings`) are those it was made
    with: Figs. 2, 6 and 9 share runs."""
    store = RunDir.of_checkpoint(path).measures_file(path, "test", "clean")
    mtime_ns = path.stat().st_mtime_ns  # before reading: a checkpoint rewritten meanwhile is measured again next time
    cfg = config.load_saved_text(load_checkpoint(path, needs=("config",))["config"])
    # the resolved path: reproduce's run folders are as --out was typed, relative or not, from wherever it ran
    key = json.dumps({"checkpoint": str(path.resolve()), "mtime_ns": mtime_ns, **_settings(cfg)}, sort_keys=True)
    got = _stored(store, key)
    if got is None:
        echo(f"measure {store.parent.parent.name}'s {path.name} on the test set (clean features)")
        got = _measure(path, device)
        try:
            write_npz_atomic({"key": np.array(key), **asdict(got), "classes": np.array(got.classes)}, store)
        except WriteError as err:  # runs copied read-only, a full disk: the figure is still drawn
            notice(f"warning: {err.what}; the figure is drawn, and its next drawing measures this run again")
    return got


def measured(runs: FigureRuns, preset: str) -> list[Measured]:
    """Each finished seed of ``preset``, its selected checkpoint (``train.select``) measured (on the GPU where
    there is one unless ``--gpus cpu``, as reproduce's diagnoses), or its stored measurement reused."""
    return [_measured_checkpoint(build.checkpoint_path(run), runs.device, runs.echo)
            for run in runs.runs.get(preset, [])]


def mean(ms: list[Measured], what: str) -> np.ndarray:
    """The seeds' mean of one measurement."""
    return np.mean([getattr(m, what) for m in ms], axis=0)


def _label(preset: str) -> str:
    """A row's name as the paper's legend gives it (its preset's ``[paper] row``)."""
    return config.read_paper(preset)["row"]


def errors(runs: FigureRuns, preset: str) -> dict[str, np.ndarray]:
    """The seeds' mean per-class natural and PGD-10 errors, % (the runs' evaluation records)."""
    return {"natural error": 100 - runs.per_class(preset, "clean").mean(axis=0),
            "PGD-10 error": 100 - runs.per_class(preset, ATTACK).mean(axis=0)}


def _similarity_and_variance(runs: FigureRuns, presets: list[str]) -> tuple[dict, dict] | None:
    """The similarity and the variance panel of Figs. 2, 6 and 9: a line per model over the classes (None when no
    model has a finished run)."""
    got = {p: ms for p in presets if (ms := measured(runs, p))}
    if not got:
        return None
    classes = next(iter(got.values()))[0].classes
    return ({"classes": classes, "ylabel": "inter-class similarity (max cosine)",
             "series": {_label(p): mean(ms, "similarity") for p, ms in got.items()}},
            {"classes": classes, "ylabel": "intra-class variance",
             "series": {_label(p): mean(ms, "variance") for p, ms in got.items()}})


def drop_share(standard, adversarial) -> np.ndarray:
    """Fig. 1(c): each class's share (%) of the accuracy AT loses, (ST_k - AT_k) / sum_j (ST_j - AT_j)."""
    drop = np.asarray(standard, dtype=float) - np.asarray(adversarial, dtype=float)
    return 100 * drop / drop.sum() if drop.sum() > 0 else np.zeros_like(drop)


@figure(SOURCE, "Fig. 1", "class-wise natural/PGD-10 errors of standard training and PGD-AT; each class's "
        "share of the accuracy drop", rows=(PGD_AT,))
def draw_fig1(runs: FigureRuns) -> list[Comparison]:
    """(a), (b): class-wise natural and PGD-10 errors of the standard and the PGD-AT model; (c): each class's share
    of the natural accuracy the PGD-AT model loses against the standard one (:func:`drop_share`). The text states
    no number of its own ("the cat and bird ... contribute almost half"): none is scored."""
    if not (runs.runs.get(ST) and runs.runs.get(PGD_AT)):
        return []
    classes = runs.records[ST][0]["classes"]
    st, at = errors(runs, ST), errors(runs, PGD_AT)
    figures.class_lines({"(a) standard training": {"classes": classes, "ylabel": "error (%)", "series": st},
                         "(b) PGD-AT": {"classes": classes, "ylabel": "error (%)", "series": at}},
                        "ME paper Fig. 1(a, b): class-wise natural and PGD-10 errors", runs.png("ab"))
    share = drop_share(100 - st["natural error"], 100 - at["natural error"])
    figures.per_class_bars(classes, {"share of the natural accuracy drop, ST to PGD-AT": (share.tolist(), None)},
                           "ME paper Fig. 1(c): contribution of each class to the total accuracy drop",
                           runs.png("c"), ylabel="share of the drop (%)")
    return []


@figure(SOURCE, "Fig. 2", "inter-class similarity and intra-class variance per class: standard training, "
        "PGD-AT, TRADES", rows=(ST, PGD_AT, TRADES))
def draw_fig2(runs: FigureRuns) -> list[Comparison]:
    """A line per model over the classes; no number is stated (the text: the cat has the largest similarity, not
    the largest variance)."""
    panels = _similarity_and_variance(runs, [ST, PGD_AT, TRADES])
    if panels:
        figures.class_lines(dict(zip(["(a) inter-class similarity", "(b) intra-class variance"], panels)),
                            "ME paper Fig. 2: penultimate features of the test set", runs.png())
    return []


def _single_at(runs: FigureRuns, item: str, by_class: dict[int, str], ncols: int) -> None:
    """Figs. 3 and 8: each single-AT model's class-wise errors (top) and 2-D features (bottom, one PNG each)."""
    got = {k: ms for k, p in by_class.items() if (ms := measured(runs, p))}
    if not got:
        return
    classes = next(iter(got.values()))[0].classes
    title = {k: f"({'abcdefgh'[i]}) single AT of class {k} ({classes[k]})" for i, k in enumerate(by_class) if k in got}
    figures.class_lines({title[k]: {"classes": classes, "ylabel": "error (%)", "series": errors(runs, by_class[k])}
                         for k in got}, f"ME paper {item} (top): class-wise errors", runs.png("errors"),
                        ncols)
    figures.feature_scatter({title[k]: (ms[0].features, ms[0].labels) for k, ms in got.items()}, classes,
                            f"ME paper {item} (bottom): 2-D features of the test set (seed 0)", runs.png("features"),
                            ncols)


@figure(SOURCE, "Fig. 3", "single AT of car and of cat: class-wise errors and 2-D features")
def draw_fig3(runs: FigureRuns) -> list[Comparison]:
    """The text's numbers (car 98.4 / 72.2, cat 7.03 / 0) are the rows' own; the drawer adds none."""
    _single_at(runs, "Fig. 3", {1: SINGLE_AT[1], 3: SINGLE_AT[3]}, 0)
    return []


@figure(SOURCE, "Fig. 4", "inter-class similarity of each class in its single-AT model and in standard "
        "training (2-D features)", rows=tuple(SINGLE_AT[k] for k in range(10)))
def draw_fig4(runs: FigureRuns) -> list[Comparison]:
    """Class k's point on the single-AT line is its similarity in the model adversarially trained on k alone; the
    other line is the standard model's (both with 2-D features, App. A.1). No number is stated."""
    single = {k: ms for k in range(10) if (ms := measured(runs, SINGLE_AT[k]))}
    st = measured(runs, ST_2D)
    if not (single and st):
        return []
    ks = sorted(single)
    figures.class_lines({"inter-class similarity, 2-D features": {
        "classes": [st[0].classes[k] for k in ks], "ylabel": "inter-class similarity (max cosine)",
        "series": {"single AT (each class in its own model)": [mean(single[k], "similarity")[k] for k in ks],
                   "standard training": mean(st, "similarity")[ks]}}},
        "ME paper Fig. 4: inter-class similarity, single AT vs standard training", runs.png())
    return []


@figure(SOURCE, "Fig. 5", "binary cat-vs-class PGD-AT and TRADES: natural/PGD-10 error against the "
        "class's similarity to the cat in standard training", rows=(ST,))
def draw_fig5(runs: FigureRuns) -> list[Comparison]:
    """x: the class paired with the cat, sorted by its cosine similarity to the cat in the standard model (the
    green line); the errors are the binary model's over both classes' test images. The text's numbers (cat vs dog,
    cat vs car) are the rows' own."""
    st = measured(runs, ST)
    if not st:
        return []
    cos = mean(st, "cosine")[CAT]
    panels = {}
    for panel, method in (("(a) PGD-AT", "pgd-at"), ("(b) TRADES", "trades")):
        # the binary models' errors are their records' alone (no features are drawn): over both classes' images
        got = {config.resolve(p).data.classes[1]: errors(runs, p) for p in BINARY[method] if runs.runs.get(p)}
        order = sorted(got, key=lambda k: cos[k])
        panels[panel] = {"classes": [st[0].classes[k] for k in order], "ylabel": "error (%)",
                         "series": {what: [got[k][what].mean() for k in order]
                                    for what in ("natural error", "PGD-10 error")},
                         "right": ("similarity to cat (standard training)", cos[order], "cosine similarity")}
    figures.class_lines(panels, "ME paper Fig. 5: binary classification of the cat against each class, the "
                        "classes sorted by their similarity to the cat in standard training", runs.png())
    return []


@figure(SOURCE, "Fig. 6", "inter-class similarity and intra-class variance with LS and ME, in PGD-AT and "
        "TRADES", rows=(PGD_AT, PGD_AT_LS, ME_AT, TRADES, TRADES_LS, ME_TRADES),
        partial="the paper names no beta for its ME-AT nor lambda for its ME-TRADES: fastfair draws ME-AT "
                "beta = 0.5 (Table 4's) and ME-TRADES beta = 1, lambda = 15 (Table 4's first)")
def draw_fig6(runs: FigureRuns) -> list[Comparison]:
    """(a, b) PGD-AT, PGD-AT+LS, ME-AT; (c, d) TRADES, TRADES+LS, ME-TRADES. No number is stated."""
    panels = {}
    for (a, b), presets in ((("(a) similarity in PGD-AT", "(b) variance in PGD-AT"), [PGD_AT, PGD_AT_LS, ME_AT]),
                            (("(c) similarity in TRADES", "(d) variance in TRADES"), [TRADES, TRADES_LS, ME_TRADES])):
        panels.update(zip((a, b), _similarity_and_variance(runs, presets) or ()))
    if panels:
        figures.class_lines(panels, "ME paper Fig. 6: LS and ME against inter-class similarity and intra-class "
                            "variance", runs.png(), ncols=2)
    return []


@figure(SOURCE, "Fig. 7", "mean prediction entropy of PGD-AT and TRADES after each epoch, clean and "
        "adversarial", rows=(PGD_AT, TRADES),
        partial="the paper measures the test set; the rows score their validation split each epoch (the "
                "test set itself with --paper-selection, their train.select_split = test)")
def draw_fig7(runs: FigureRuns) -> list[Comparison]:
    """Each epoch's mean prediction entropy (nats) on the split the run scores each epoch (``metrics.jsonl``'s
    ``val``), on clean images and under its ``train.val_attack``, the seeds averaged. The text's 2.3 is the largest
    entropy of 10 classes (ln 10), drawn as a line, not a measurement. No number is stated."""
    got = {p: hs for p in (PGD_AT, TRADES)
           if (hs := [h for h in runs.history(p) if h and "entropy" in h[0]["val"]["clean"]])}
    if not got:  # no run, or runs trained before fastfair recorded the entropy
        return []
    n = min(len(h) for hs in got.values() for h in hs)
    cfg = runs.config(next(iter(got)))
    attack = cfg.train.val_attack
    lines = {f"{_label(p)}, {name}": (np.mean([[e["val"][tag]["entropy"] for e in h[:n]] for h in hs], axis=0), None)
             for p, hs in got.items() for tag, name in (("clean", "clean"), (attack, f"adversarial ({attack})"))}
    lines["ln 10, the largest entropy of 10 classes"] = (np.full(n, np.log(10)), None)
    split = "test set" if cfg.train.select_split == "test" else "validation split"
    figures.curves(list(range(1, n + 1)), lines, f"ME paper Fig. 7: prediction entropy on the {split}",
                       runs.png(), ylabel="mean entropy (nats)")
    return []


@figure(SOURCE, "Fig. 8", "single AT of the other eight classes: class-wise errors and 2-D features")
def draw_fig8(runs: FigureRuns) -> list[Comparison]:
    """As Fig. 3 for classes 0, 2, 4-9; the text names panels (b)-(d) as overlapping, no number."""
    _single_at(runs, "Fig. 8", {k: SINGLE_AT[k] for k in (0, 2, 4, 5, 6, 7, 8, 9)}, 4)
    return []


@figure(SOURCE, "Fig. 9", "inter-class similarity and intra-class variance of TRADES (lambda 1, 6, 12) "
        "and PGD-AT", rows=(PGD_AT, TRADES_L12, TRADES))
def draw_fig9(runs: FigureRuns) -> list[Comparison]:
    """A line per model, as the paper's legend orders them; no number is stated."""
    panels = _similarity_and_variance(runs, [PGD_AT, TRADES_L12, TRADES, TRADES_L1])
    if panels:
        figures.class_lines(dict(zip(["(a) inter-class similarity", "(b) intra-class variance"], panels)),
                            "ME paper Fig. 9: TRADES' lambda against similarity and variance", runs.png())
    return []


pending(
    SOURCE, "Table 5", "AutoAttack on CIFAR-10, WideResNet-28-10, eps 8/255: ME-RST (+BIN) beside six RobustBench "
    "models",
    "ME-RST trains on Carmon et al.'s 500k pseudo-labelled TinyImages (ti_500K_pseudo_labeled.pickle, from "
    "github.com/yaircarmon/semisup-adv), not available offline, and fastfair has no loader for extra unlabelled "
    "data. Route: the compared rows are released models, `fastfair eval rb:NAME --attacks clean,aa --model-dir DIR` "
    "for Gowal2020Uncovering_28_10_extra, Rade2021Helper_extra, Rebuffi2021Fixing_28_10_cutmix_ddpm, "
    "Wu2020Adversarial_extra, Sridhar2021Robust and Carmon2019Unlabeled (the paper: 89.48/62.8, 88.16/60.97, "
    "87.33/60.75, 88.25/60.04, 89.46/59.66, 89.69/59.53); ME-RST is semisup-adv's robust_self_training.py with "
    "--beta 27 and the entropy term -1 * H(p(x)) added to its loss (App. A.3.1: 88.51/59.96), ME-RST+BIN the same "
    "with its BatchNorm layers replaced by batch-instance norm (fastfair's model.norm = bin; 89.11/60.37)")
