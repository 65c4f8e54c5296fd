"""CFA (Wei et al. 2023) figures as ``fastfair reproduce`` targets, and what of the paper cannot run here.

Secs. 3.1-3.3 plot every epoch's PGD-10 robustness, which a run logs per class on its validation split
(``metrics.jsonl``, ``train.val_attack``); the paper's curves are on its test set, so ours are labelled "validation
split". A paper window of epochs ("101-120 of 200") keeps its share of a shorter run (epoch 3 of 5). Sec. 5.3 and
App. C plot the selected checkpoint's test robustness under the attack the paper names; a row whose evaluation
lacks it is evaluated here (``FigureRuns.results`` adds it to the run's record).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fastfair import config
from fastfair.reports import figures
from fastfair.reproduce.figures.registry import FigureRuns, figure, inventory, pending
from fastfair.reproduce.verdict import Comparison
from fastfair.rundir import RunDir

inventory("cfa", ["Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 1", "Table 2", "Fig. 5", "Table 3",
                  "Table 4", "Fig. 6", "Fig. 7"])

VAL = "pgd10"  # the robustness Secs. 3.1-3.3 plot, and every CFA preset's train.val_attack
SHOWN = {"aa": "AutoAttack", VAL: "PGD-10", "clean": "clean"}  # an attack as the paper names it on an axis
BEST, LAST = (101, 120), (181, 200)  # Sec. 3.1's windows of the 200 epochs: the best robustness, the last epochs
# Figs. 2-4 are per-epoch curves: what of them a run cannot give as the paper does
ON_VAL = ("each epoch's accuracies (the curves, and the means over epochs) are on fastfair's validation split "
          "(data.val_per_class held-out training images a class, the run's train.val_attack), not the paper's test "
          "set (Sec. 3 names no held-out split; FAWA's 2 % comes in Sec. 4.3): fastfair evaluates the test set once, "
          "on the selected checkpoint")


def _val(runs: FigureRuns, preset: str, attack: str = VAL, averaged: bool = False) -> np.ndarray:
    """(seeds, epochs, classes) per-class validation accuracy under ``attack``, over the epochs every seed logged;
    ``averaged``: the EMA/FAWA model's, over the epochs it was validated (from train.avg_begin on)."""
    def line(e: dict) -> dict | None:
        return e.get("average", {}).get("val") if averaged else e["val"]

    seeds = [[line(e)[attack]["per_class"] for e in h if line(e)] for h in runs.history(preset)]
    if not seeds or not all(seeds):
        raise ValueError(f"{runs.key}: {preset} has no finished run with per-epoch {attack} validation accuracies")
    n = min(map(len, seeds))
    return np.asarray([s[-n:] for s in seeds], dtype=float)


def _kept(n: int, first: int, last: int, of: int = 200) -> list[int]:
    """The epochs (1-based) of an ``n``-epoch run standing for the paper's ``first``..``last`` of ``of``: those with
    (first - 1) / of < e / n <= last / of (at 5 epochs 101-120 is epoch 3, 181-200 epoch 5), at least the last."""
    return [e for e in range(1, n + 1) if (first - 1) * n / of < e <= last * n / of] or [n]


def _window(v: np.ndarray, first: int, last: int) -> np.ndarray:
    """(seeds, classes): the mean over the epochs :func:`_kept` keeps for the paper's ``first``..``last``."""
    return v[:, [e - 1 for e in _kept(v.shape[1], first, last)]].mean(axis=1)


def _window_text(v: np.ndarray, first: int, last: int) -> str:
    kept = _kept(v.shape[1], first, last)
    ours = f"epoch {kept[0]}" if len(kept) == 1 else f"epochs {kept[0]}-{kept[-1]}"
    return ours if (kept[0], kept[-1]) == (first, last) else f"{ours} of {v.shape[1]} (the paper's {first}-{last})"


def _series(v: np.ndarray) -> tuple[list[float], list[float] | None]:
    """(seeds, ...) -> (mean over seeds, std over seeds or None for one seed), as the plotting helpers take them."""
    return v.mean(0).tolist(), v.std(0).tolist() if len(v) > 1 else None


def _epochs(*arrays: np.ndarray) -> list[int]:
    return list(range(1, min(a.shape[1] for a in arrays) + 1))


pending(
    "cfa", "Fig. 1", "the toy binary model of Sec. 2.2: its data (a) and each class's clean and robust accuracy "
            "against the classifier's weight on the non-robust features (b)",
    "a closed-form illustration of Sec. 2.2's toy distribution, nothing trained or measured; its parameters (the "
    "two classes' p, eta, the dimension) are equations of App. A that the paper's text lost, so the curve cannot "
    "be drawn from what fastfair reads. Route: type App. A's values from the PDF (arXiv 2303.14460) and evaluate "
    "Eqs. 13 and 16 (clean and robust accuracy per class) over the weight; no run is needed")

pending(
    "cfa", "Table 4", "AT, TRADES and FAT with EMA and with CFA on Tiny-ImageNet, ResNet-18: clean and AutoAttack, "
             "average and worst-20 % classes, best and last checkpoints (App. C.1)",
    "Tiny-ImageNet is not available offline (no subset ships with fastfair's test data) and the table's second "
    "statistic is the mean of the worst 20 % of classes, which a preset's [paper] numbers do not hold. Route: with "
    "the data in DIR (tiny-imagenet-200/), per row train a Table 1 preset on it, e.g. `fastfair train --config "
    "cfa-t1-at-cfa-paper --dataset tiny-imagenet --data-dir DIR --model resnet18 --set attack.eps=0.01568627 --set "
    "eval.eps=0.01568627 --out runs/t4-at-cfa` (App. C.1: eps 4/255), then `fastfair eval runs/t4-at-cfa "
    "--attacks clean,aa` (best) and `fastfair eval runs/t4-at-cfa/checkpoints/last.pt --attacks clean,aa` (last): "
    "their tables print avg and worst20 beside the paper's")

F2 = {k: f"cfa-f2-at-eps{k}" for k in range(4, 12)}  # training eps k/255


@figure("cfa", "Fig. 2", "vanilla AT at eight training margins: overall PGD-10 robustness over training "
                         "(a); class-wise robustness averaged over epochs 101-120 (b) and 181-200 (c)",
        partial=ON_VAL)
def fig2(runs: FigureRuns) -> list[Comparison]:
    """Sec. 3.1 states no number (only that larger margins hurt the hard classes at the best epochs and help every
    class at the last ones): three panels, nothing compared."""
    v = {k: _val(runs, preset) for k, preset in F2.items()}
    epochs = _epochs(*v.values())
    figures.curves(epochs, {f"eps {k}/255": _series(x[:, : len(epochs)].mean(2)) for k, x in v.items()},
                   "CFA Fig. 2(a): AT by training eps, overall robustness", runs.png("a"),
                   ylabel="PGD-10 accuracy (%), validation split", paired=False)
    for panel, (first, last) in (("b", BEST), ("c", LAST)):
        figures.per_class_bars(runs.classes, {f"eps {k}/255": _series(_window(x, first, last)) for k, x in v.items()},
                               f"CFA Fig. 2({panel}): class-wise robustness, mean of "
                               f"{_window_text(next(iter(v.values())), first, last)}",
                               runs.png(panel), ylabel="PGD-10 accuracy (%), validation split")
    return []


F3 = {b: f"cfa-f3-trades-beta{b}" for b in range(1, 9)}  # TRADES beta


@figure("cfa", "Fig. 3", "TRADES at beta 1 to 8: class-wise robust (a) and clean (b) accuracy averaged "
                         "over the best epochs", partial=ON_VAL)
def fig3(runs: FigureRuns) -> list[Comparison]:
    """Sec. 3.2 states no number; the text's epoch window was lost, and fastfair averages Sec. 3.1's 101-120 (the
    presets say so)."""
    for panel, attack, what in (("a", VAL, "robust"), ("b", "clean", "clean")):
        v = {b: _val(runs, preset, attack) for b, preset in F3.items()}
        figures.per_class_bars(runs.classes, {f"beta {b}": _series(_window(x, *BEST)) for b, x in v.items()},
                               f"CFA Fig. 3({panel}): TRADES by beta, class-wise {what} accuracy, mean of "
                               f"{_window_text(next(iter(v.values())), *BEST)}", runs.png(panel),
                               ylabel=f"{SHOWN[attack]} accuracy (%), validation split")
    return []


def _fluctuation(runs: FigureRuns, v: np.ndarray, first_epoch: int, title: str, panel: str) -> None:
    """Overall and worst-class robustness over epochs, and how far the worst class moved from the epoch before."""
    avg, worst = v.mean(2), v.min(2)
    moved = np.abs(np.diff(worst, axis=1, prepend=worst[:, :1]))
    epochs = list(range(first_epoch, first_epoch + v.shape[1]))
    figures.curves(epochs, {"overall": _series(avg), "worst class": _series(worst),
                            "worst class: change from the epoch before": _series(moved)},
                   title, runs.png(panel), ylabel="PGD-10 accuracy (%), validation split", paired=False)


@figure("cfa", "Fig. 4", "the fluctuation of the worst class over training: overall and worst-class PGD-10 "
                         "robustness and the worst class's change between adjacent epochs, AT (a) and "
                         "AT + FAWA (b)", rows=("cfa-t1-at", "cfa-t3-at-fawa-paper"),
        partial=f"{ON_VAL}; so are Sec. 3.3's four numbers (epochs 108 and 110), on 1,000 images, where a "
                "class moves in steps of 1 %")
def fig4(runs: FigureRuns) -> list[Comparison]:
    """Sec. 3.3's four numbers, from AT's curve: the epoch of the highest overall robustness (the paper's epoch
    108: 53.2 %, worst class 23.5 %) and the fairer checkpoint the text prefers (epoch 110: 52.6 % and 28.1 %), which
    fastfair takes as the epoch of the highest sum of overall and worst-class robustness (Sec. 5.1's rule). Ours are
    on the validation split (1,000 images, so a class moves in steps of 1 %), the paper's on its test set."""
    v = _val(runs, "cfa-t1-at")
    _fluctuation(runs, v, 1, "CFA Fig. 4(a): AT, robustness over training", "a")
    fawa = "cfa-t3-at-fawa-paper"
    logged = [e["epoch"] for e in runs.history(fawa)[0] if e.get("average", {}).get("val")]
    if logged:
        averaged = _val(runs, fawa, averaged=True)
        _fluctuation(runs, averaged, logged[-averaged.shape[1]],
                     "CFA Fig. 4(b): AT + FAWA, the averaged model's robustness over training", "b")
    else:  # no epoch's worst class passed the threshold (a short run's often does not): nothing was averaged
        _fluctuation(runs, _val(runs, fawa), 1, "CFA Fig. 4(b): AT + FAWA, no epoch passed FAWA's threshold, so no "
                                                "averaged model: the run's own weights", "b")
    avg, worst = v.mean(2), v.min(2)
    seeds = np.arange(len(v))
    best, fair = avg.argmax(1), (avg + worst).argmax(1)
    where = "Sec. 3.3, AT, PGD-10 over training"
    held = runs.config("cfa-t1-at").data.val_per_class  # ours on these validation images a class, not the test set
    return [runs.number(f"{where}: the epoch of the highest overall robustness (epoch 108)", "avg", 53.2,
                        avg[seeds, best].tolist(), "avg", other_split=held),
            runs.number(f"{where}: that epoch's worst class", "worst", 23.5, worst[seeds, best].tolist(), "worst",
                        other_split=held),
            runs.number(f"{where}: the fairer checkpoint (epoch 110; ours: highest avg + worst)", "avg", 52.6,
                        avg[seeds, fair].tolist(), "avg", other_split=held),
            runs.number(f"{where}: the fairer checkpoint's worst class", "worst", 28.1, worst[seeds, fair].tolist(),
                        "worst", other_split=held)]


def _budget_sweep(runs: FigureRuns, sweep: dict[float, str], base: tuple[str, str], attack: str, name: str,
                  title: str, xlabel: str) -> None:
    """Average and worst-class robustness of each base budget's run, the method without calibration beside them."""
    rob = {lam: runs.per_class(preset, attack) for lam, preset in sweep.items()}
    lines = {f"{name}, average": _series(np.asarray([r.mean(1) for r in rob.values()]).T),
             f"{name}, worst class": _series(np.asarray([r.min(1) for r in rob.values()]).T)}
    plain = runs.per_class(base[1], attack)
    figures.curves(list(rob), lines, title, runs.png("a"), ylabel=f"{SHOWN[attack]} accuracy (%), test set",
                   xlabel=xlabel, baselines={f"{base[0]}, average": float(plain.mean(1).mean()),
                                             f"{base[0]}, worst class": float(plain.min(1).mean())})


def _vector_curves(runs: FigureRuns, preset: str, vector: str, scale: float, title: str, ylabel: str,
                   base: tuple[str, str]) -> None:
    """A per-class vector the run logged each epoch (CCM's eps_k, CCR's beta_k), first seed, one line per class,
    beside ``base`` = (its name, the config key of the value every class had before calibration): the text reads the
    panel against it (hard classes train below it)."""
    history = runs.history(preset)[0]
    values = np.asarray([e["vectors"][vector] for e in history], dtype=float) * scale
    value = config.value_of(runs.config(preset), base[1]) * scale
    figures.per_class_curves([e["epoch"] for e in history], values, runs.classes, title, runs.png("b"), ylabel,
                             baselines={f"{base[0]} = {value:g}, uncalibrated": value})


F5 = {0.3: "cfa-f5-at-ccm-lambda03", 0.4: "cfa-f5-at-ccm-lambda04", 0.5: "cfa-t2-at-ccm",
      0.6: "cfa-f5-at-ccm-lambda06", 0.7: "cfa-f5-at-ccm-lambda07"}


@figure("cfa", "Fig. 5", "AT + CCM by base budget lambda_1 0.3-0.7 against AT: average and worst-class "
                         "AutoAttack robustness (a); the class-wise eps_k of lambda_1 = 0.5 over training (b)",
        rows=("cfa-t1-at", "cfa-t2-at-ccm"))
def fig5(runs: FigureRuns) -> list[Comparison]:
    """Sec. 5.3.1 states no number (0.5 performs best; the hard classes 2-5 train below 8/255): two panels."""
    _budget_sweep(runs, F5, ("AT", "cfa-t1-at"), "aa", "AT + CCM",
                  "CFA Fig. 5(a): AT + CCM by base budget lambda_1", "base perturbation budget lambda_1")
    _vector_curves(runs, "cfa-t2-at-ccm", "eps", 255.0, "CFA Fig. 5(b): AT + CCM (lambda_1 0.5), class-wise eps_k",
                   "eps_k (/255)", ("eps", "attack.eps"))
    return []


def _std(per_class: np.ndarray) -> list[float]:
    """Each seed's spread of class-wise robustness as App. C.2 gives it: the standard deviation (ddof 0) of
    accuracies in [0, 1], which the text calls variance (a variance of 0.15 would need classes near 0 and 1)."""
    return (per_class / 100.0).std(axis=1).tolist()


def _averaged(runs: FigureRuns, preset: str, name: str) -> str:
    """``name``, saying so where a weight-averaging row's result is of the run's own weights: FAWA averages only the
    epochs whose worst class passes its threshold, and a short run's may pass none (reproduce then evaluates the
    plain checkpoint)."""
    own = 0
    for seed, (run, rec) in enumerate(zip(runs.runs[preset], runs.records[preset])):
        cfg = runs.config(preset, seed)
        averaged = RunDir(run).selected_checkpoint(cfg.train.select, averaged=True).name
        own += cfg.train.averaging != "none" and Path(rec["checkpoint"]).name != averaged
    if not own:
        return name
    seeds = len(runs.records[preset])
    some = "" if own == seeds else f"{own} of {seeds} seeds "
    return f"{name}, {some}not averaged (no epoch passed FAWA's threshold)"


@figure("cfa", "Fig. 6", "class-wise AutoAttack robustness of CFA against EMA on CIFAR-10 (App. C.2)",
        rows=("cfa-t1-at-ema-paper", "cfa-t1-at-cfa-paper"))
def fig6(runs: FigureRuns) -> list[Comparison]:
    """App. C.2's two numbers, the spread of class-wise robustness: CFA 0.15, EMA 0.17. The text does not say which
    base method the figure shows; fastfair draws AT's (the base of Sec. 5.3's figures). Margin 0.02: the
    paper's values have two decimals and one class moving 10 points moves the spread by about 0.01; a std of
    accuracies is no accuracy over images, so no binomial floor: the seeds' own spread alone."""
    attack = "aa"
    ema, cfa = runs.per_class("cfa-t1-at-ema-paper", attack), runs.per_class("cfa-t1-at-cfa-paper", attack)
    figures.per_class_bars(runs.classes, {_averaged(runs, "cfa-t1-at-ema-paper", "AT + EMA"): _series(ema),
                                          _averaged(runs, "cfa-t1-at-cfa-paper", "AT + CFA"): _series(cfa)},
                           "CFA Fig. 6: class-wise robustness, CFA against EMA", runs.png(),
                           ylabel=f"{SHOWN[attack]} accuracy (%), test set")
    where = f"App. C.2, {attack}: spread of class-wise robustness (std of accuracies in [0, 1])"
    return [runs.number(f"{where}, AT + CFA", "std", 0.15, _std(cfa), margin=0.02, accuracy=False),
            runs.number(f"{where}, AT + EMA", "std", 0.17, _std(ema), margin=0.02, accuracy=False)]


F7 = {0.3: "cfa-f7-trades-ccm-ccr-lambda03", 0.4: "cfa-f7-trades-ccm-ccr-lambda04", 0.5: "cfa-t2-trades-ccm-ccr-paper",
      0.6: "cfa-f7-trades-ccm-ccr-lambda06", 0.7: "cfa-f7-trades-ccm-ccr-lambda07"}


@figure("cfa", "Fig. 7", "TRADES + CCM + CCR by base regularization lambda_2 0.3-0.7 against TRADES: average "
                         "and worst-class PGD-10 robustness (a); the class-wise beta_k of lambda_2 = 0.5 over "
                         "training (b)", rows=("cfa-t1-trades-paper", "cfa-t2-trades-ccm-ccr-paper"))
def fig7(runs: FigureRuns) -> list[Comparison]:
    """App. C.3 states no number (the worst class beats TRADES at every lambda_2, the average at 0.4-0.6; hard
    classes train with beta_k below beta): two panels."""
    _budget_sweep(runs, F7, ("TRADES", "cfa-t1-trades-paper"), "pgd10", "TRADES + CCM + CCR",
                  "CFA Fig. 7(a): TRADES + CCM + CCR by base regularization lambda_2",
                  "base regularization budget lambda_2")
    _vector_curves(runs, "cfa-t2-trades-ccm-ccr-paper", "kl_weight", 1.0,
                   "CFA Fig. 7(b): TRADES + CCM + CCR (lambda_2 0.5), class-wise beta_k", "beta_k",
                   ("beta", "method.kl_weight"))
    return []
