"""Tian et al. KDD 2021 ("tian-kdd"), "Analysis and Applications of Class-wise Robustness in Adversarial Training":
its figures, and Table 4, as ``fastfair reproduce`` targets.

The inventory lists every table and figure with numbers or a plot of measured results, in the paper's order.
Tables 1, 3 and 5 are the table targets tian-kdd-t1, -t3 and -t5. Table 2 lists CIFAR-10's and STL-10's
super-classes (class names, no measured number) and is left out. Figs. 1 and 2 draw the runs of Table 5's
adversarially trained rows (the ICLR submission's Fig. 1 models: its 75th epoch's, ImageNet's 14th), Fig. 3 those of
Table 1, Fig. 4(a)/(b) Fig. 2(b)'s CIFAR-10 model and its re-trainings without each class (the ICLR submission's
Fig. 3 runs: tian-iclr-fig3-madry-without-*), Fig. 4(c) and Table 4 (with Fig. 6) the TRADES models of Sec. 6.1
(presets tian-kdd-fig4c-*), Fig. 5 the coloured-MNIST run of Sec. 6.2.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from fastfair import build, config, data
from fastfair.data.background import border_masks
from fastfair.evaluation import homing, measures
from fastfair.evaluation.background import background_counts
from fastfair.reports import figures
from fastfair.reproduce.figures.registry import FigureRuns, figure, inventory
from fastfair.reproduce.figures.tian_iclr import HOMING_WITHOUT, SAMPLED
from fastfair.reproduce.verdict import Comparison
from fastfair.rundir import read_json, write_npz_atomic

SOURCE = "tian-kdd"
inventory(SOURCE, ["Fig. 1", "Fig. 2", "Table 1", "Fig. 3", "Table 3", "Fig. 4", "Table 4", "Fig. 5",
                   "Fig. 6", "Table 5"])

# Sec. 4's adversarially trained models, one per data set, in the panel order of Fig. 2 ((a) MNIST, (b) CIFAR-10,
# (c) CIFAR-100, (d) SVHN, (e) STL-10, (f) ImageNet: the text names 2(b), 2(d), 2(e)); Fig. 1's text places SVHN,
# CIFAR-10, STL-10 and CIFAR-100 in (b)-(e) without their order, read as Fig. 2's
SEC4 = {"a": ("MNIST", "tian-kdd-t5-mnist-madry"), "b": ("CIFAR-10", "tian-kdd-t5-cifar10-madry"),
        "c": ("CIFAR-100", "tian-kdd-t5-cifar100-madry"), "d": ("SVHN", "tian-kdd-t5-svhn-madry"),
        "e": ("STL-10", "tian-kdd-t5-stl10-madry"), "f": ("ImageNet", "tian-kdd-t5-imagenet-fgsm-rs")}
BASE, ADJUSTED = "tian-kdd-fig4c-trades-beta5-6", "tian-kdd-fig4c-trades-beta5-0.5"  # Sec. 6.1's beta_5 = 6 and 0.5
# Sec. 6.1: "Figure 4(a) and Figure 2(b) are similar" (counts for percentages), and 4(b) re-trains that model without
# each confound class: Fig. 2(b)'s PGD-AT model, whose config is the ICLR submission's Fig. 1(b) model (one rule, issue
# 50), so its re-trainings are that paper's Fig. 3(b) runs of the same homing experiment (a re-training starts afresh)
HOMING_BASE = SEC4["b"][1]
WITHOUT = HOMING_WITHOUT
FIG5 = "tian-kdd-fig5-madry-mnist-background"
CAT, DOG = 3, 5  # CIFAR-10's class 3 (cat), Sec. 6's most vulnerable class, and its confound class 5 (dog)
HOMING_ATTACK = "pgd20"  # Fig. 4(a) repeats Fig. 2(b) (PGD-20) in counts; configs/grids/tian-kdd-fig4-homing.toml's
TPGD = "tpgd20@t0.2"  # Temperature-PGD-20 at 1/T = 5: Table 3's TRADES row, whose cat (26.2) is Table 4's line 4
TABLE1 = {"Madry": "tian-kdd-t1-madry", "TRADES": "tian-kdd-t1-trades", "MART": "tian-kdd-t1-mart",
          "HE": "tian-kdd-t1-he"}


def _present(runs: FigureRuns) -> dict[str, tuple[str, str]]:
    """Sec. 4's panels whose runs finished (a data set absent at this scale leaves its panel out)."""
    return {letter: (name, preset) for letter, (name, preset) in SEC4.items() if runs.runs.get(preset)}


def _shown(letter: str, classes: list[str]) -> list[int]:
    """Panel ``letter``'s classes: every one, or the 12 the paper "randomly sample[s]" of CIFAR-100 and ImageNet. The
    KDD copy names none of them; its Fig. 1 is the ICLR submission's (same caption, text and models), whose axes do
    (:data:`tian_iclr.SAMPLED`, ImageNet's 11 legible)."""
    return [k for k in SAMPLED.get(letter, range(len(classes))) if k < len(classes)]


def robust_history(runs: FigureRuns, preset: str) -> tuple[list[int], np.ndarray, str]:
    """(epochs, per-class robust accuracy after each epoch (epochs, C) averaged over seeds, the attack's name):
    the test set's, as Table 5's rows keep no split (train.select_split = test)."""
    histories = runs.history(preset)
    attack = next(k for k in histories[0][0]["val"] if k != "clean")
    per_seed = np.asarray([[e["val"][attack]["per_class"] for e in h] for h in histories], dtype=float)
    return [e["epoch"] for e in histories[0]], per_seed.mean(axis=0), attack


# Sec. 4.1's gaps: MNIST "still has 6%" and ImageNet "finally up to 80%" at the end of training; SVHN, CIFAR-10,
# STL-10 and CIFAR-100's "can reach 40%-50%" at their widest over training (the middle of the range, +-5)
GAPS = {"a": (6.0, "last", None), "b": (45.0, "widest", 5.0), "c": (45.0, "widest", 5.0), "d": (45.0, "widest", 5.0),
        "e": (45.0, "widest", 5.0), "f": (80.0, "last", None)}


@figure(SOURCE, "Fig. 1", "class-wise robustness at different epochs in the test set, six data sets "
        "(Sec. 4.1)", rows=tuple(preset for _, preset in SEC4.values()),
        partial="the KDD copy names none of the 12 classes sampled of CIFAR-100 and ImageNet: drawn are those "
                "the ICLR submission's Fig. 1, the same figure, names on its axes; ImageNet's ninth is "
                "illegible there, so 11 of its 12")
def fig1(runs: FigureRuns) -> list[Comparison]:
    """Fig. 1: a panel per data set, a line per class over epochs, the span between the lowest and the highest class
    shaded (the paper's 12 classes of CIFAR-100 and ImageNet: :func:`_shown`). Numbers: the text's class-wise
    robustness gaps (highest minus lowest of the classes shown): "40%-50%" is recorded as 45 with margin 5, the
    range it states."""
    out = []
    for letter, (name, preset) in _present(runs).items():
        epochs, v, attack = robust_history(runs, preset)
        classes = runs.records[preset][0]["classes"]
        keep = _shown(letter, classes)
        figures.class_gap_curves(  # the ICLR submission's Fig. 1 is the same figure: one way to draw both
            epochs, v[:, keep], [classes[k] for k in keep], v.mean(axis=1),
            f"Tian et al. KDD 2021 Fig. 1({letter}): {name}, per-class {attack} accuracy on the test set",
            runs.png(f"{letter}-{name.lower()}"), f"{attack} accuracy (%)")
        paper, when, tol = GAPS[letter]
        per_seed = [np.asarray([e["val"][attack]["per_class"] for e in h], dtype=float)[:, keep]
                    for h in runs.history(preset)]
        gaps = [float((s.max(axis=1) - s.min(axis=1))[-1 if when == "last" else slice(None)].max()) for s in per_seed]
        out.append(runs.number(f"Sec. 4.1, Fig. 1({letter}) {name}: robustness gap between classes, {when}",
                               "max - min class", paper, gaps, "mcd", tol))
    return out


def _robust_attack(record: dict) -> str:
    return next(a for a in record["results"] if a != "clean")


def _percent(confusion) -> np.ndarray:
    """A confusion matrix in % of each true class's images (rows)."""
    m = np.asarray(confusion, dtype=float)
    return 100 * m / np.maximum(m.sum(axis=1, keepdims=True), 1)


@figure(SOURCE, "Fig. 2", "confusion matrices of robustness on the test set, six data sets (Sec. 4.2)",
        rows=tuple(preset for _, preset in SEC4.values()))
def fig2(runs: FigureRuns) -> list[Comparison]:
    """Fig. 2: a panel per data set, the test set's confusion matrix under the row's test attack (rows: true
    class, columns: prediction) in % of the true class, averaged over seeds. The text states no number."""
    for letter, (name, preset) in _present(runs).items():
        records = runs.records[preset]
        attack = _robust_attack(records[0])
        m = np.mean([_percent(r["results"][attack]["confusion"]) for r in records], axis=0)
        figures.heatmap(m, records[0]["classes"], f"Tian et al. KDD 2021 Fig. 2({letter}): {name}, test set under "
                        f"{attack}", runs.png(f"{letter}-{name.lower()}"), cbar="% of the true class's images")
    return []


def _cvc(run: Path, device: str) -> np.ndarray:
    """Def. 5.1's CVC per class of the run's selected checkpoint on its natural test images."""
    _, cfg, dev, model, bundle, (x, y) = build.from_checkpoint(build.checkpoint_path(run), split="test",
                                                                device_name=device, data_dir=None, batch_size=None)
    loader = build.eval_loader(cfg, (x, y), dev, False)
    p = homing.probabilities(model, loader, "clean", eps=cfg.eval.eps, alpha=cfg.eval.alpha,
                             num_classes=bundle.num_classes)
    return measures.cvc(p, y.numpy(), bundle.num_classes)


PGD_STEPS = (1, 10, 20)  # Fig. 3(b)-(d): the attack after 1, 10 and 20 iterations


def _example(y: np.ndarray) -> int:
    """Fig. 3(b)-(d)'s image: the test set's image 127 (a cat in CIFAR-10), else its first cat."""
    return 127 if len(y) > 127 and y[127] == CAT else int(np.flatnonzero(y == CAT)[0])


@figure(SOURCE, "Fig. 3", "class-wise variance of confidence of Table 1's defenses; MART's output for one "
        "cat under PGD and Temperature-PGD after 1, 10 and 20 steps (Sec. 5)",
        rows=(*TABLE1.values(), "tian-kdd-t1-standard"),
        partial="(a): CVC of the natural test images (the text does not say natural or adversarial); "
                "(b)-(d): the paper's image 127 where the run's test set holds it, else its first cat")
def fig3(runs: FigureRuns) -> list[Comparison]:
    """Fig. 3(a): Def. 5.1's CVC per class of Madry, TRADES, MART and HE (Table 1's models; the standard row is the
    transfer attack's substitute there), as bars per class; (b)-(d): MART's softmax output for one cat after 1, 10
    and 20 steps of PGD (step 0.003, Table 1's) and of Temperature-PGD at 1/T = 5 (Sec. 5). The text states no
    number: its claims are orders (cat's and deer's CVC lowest), which the plot shows."""
    dev = runs.device
    cvc = {name: np.mean([_cvc(run, dev) for run in runs.runs[preset]], axis=0) * 1e3
           for name, preset in TABLE1.items() if runs.runs.get(preset)}
    classes = runs.classes
    if cvc:
        figures.per_class_bars(classes, {name: (v.tolist(), None) for name, v in cvc.items()},
                               "Tian et al. KDD 2021 Fig. 3(a): class-wise variance of confidence (CVC), natural "
                               "test images", runs.png("a-cvc"), ylabel="CVC (x 1e-3)", percent=False)
    if runs.runs.get(TABLE1["MART"]):
        _, cfg, devc, model, bundle, (x, y) = build.from_checkpoint(
            build.checkpoint_path(runs.runs[TABLE1["MART"]][0]), split="test", device_name=dev, data_dir=None,
            batch_size=None)
        i = _example(y.numpy())
        loader = build.eval_loader(cfg, (x[i:i + 1], y[i:i + 1]), devc, False)
        for steps, letter in zip(PGD_STEPS, "bcd"):
            series = {}
            for label, attack in ((f"PGD-{steps}", f"pgd{steps}"), ("Temperature-PGD (1/T = 5)", f"tpgd{steps}@t0.2")):
                p = homing.probabilities(model, loader, attack, eps=cfg.eval.eps, alpha=cfg.eval.alpha,
                                         num_classes=bundle.num_classes, seed=cfg.eval.seed,
                                         cw_kappa=cfg.eval.cw_kappa, clip_start=cfg.eval.clip_start)[0]
                series[label] = ((100 * p).tolist(), None)
            figures.per_class_bars(bundle.classes, series, f"Tian et al. KDD 2021 Fig. 3({letter}): MART's output "
                                   f"for test image {i} ({bundle.classes[CAT]}) after {steps} step(s)",
                                   runs.png(f"{letter}-steps{steps}"), ylabel="confidence (%)")
    return []


@figure(SOURCE, "Fig. 4", "misclassified and homing confusion matrices; class-wise Temperature-PGD "
        "robustness as beta_5 changes (Sec. 6.1)", rows=(HOMING_BASE, *WITHOUT, BASE, ADJUSTED))
def fig4(runs: FigureRuns) -> list[Comparison]:
    """Fig. 4(a)/(b) by ``fastfair homing`` (PGD-20, as Fig. 2, which 4(a) repeats in counts) on Fig. 2(b)'s PGD-AT
    model (:data:`HOMING_BASE`) and its re-trainings without each class (:data:`WITHOUT`), seed by seed; (c): the
    per-class Temperature-PGD accuracy of the beta_5 = 6 and 0.5 TRADES models, a bar per setting (their cat and dog
    numbers are the rows' own). Numbers: Sec. 6.1's 200 of the 1000 test cats sent to dog (as % of the test cats:
    20.0) and the 119 of them that home without dog (as % of those: 59.5)."""
    sent, home, mats = [], [], []
    for seed, base in enumerate(runs.runs.get(HOMING_BASE, [])):
        without = [runs.runs[row][seed] for row in WITHOUT if len(runs.runs.get(row, [])) > seed]
        if not without:
            continue
        folder = runs.out / f"{runs.key}-homing-s{seed}"
        homing.homing([str(base), *map(str, without)], attack=HOMING_ATTACK, out=str(folder), device=runs.device,
                      quiet=True)
        rec = read_json(folder / "homing.json")
        mis = np.asarray(rec["misclassified"], dtype=float)
        hom = np.asarray([[np.nan if v is None else v for v in row] for row in rec["homing"]], dtype=float)
        cats = rec["images"] / len(rec["classes"])  # CIFAR-10's test set (and its subsets) is balanced
        sent.append(100 * mis[CAT, DOG] / cats)
        if mis[CAT, DOG] and not np.isnan(hom[CAT, DOG]):  # a share of none, or with no run without dog: no number
            home.append(100 * hom[CAT, DOG] / mis[CAT, DOG])
        mats.append((mis, hom))
    out = []
    if mats:
        figures.homing_heatmaps(np.mean([m for m, _ in mats], axis=0), np.mean([h for _, h in mats], axis=0),
                                runs.classes, f"{HOMING_ATTACK}, {len(mats)} seed(s)", runs.png("ab"))
        out += [runs.number("Sec. 6.1, Fig. 4(a): test cats the attack sends to dog (200 of 1000)", "% of cats",
                            20.0, sent),
                runs.number("Sec. 6.1, Fig. 4(b): of those, home to cat without dog (119 of 200)", "% of them",
                            59.5, home)]
    series = {}
    for preset, label in ((BASE, "'6666666666' (beta_5 = 6)"), (ADJUSTED, "'66666X6666', X = beta_5 = 0.5")):
        records = runs.records.get(preset, [])
        if records:
            v = np.asarray([r["results"]["tpgd20@grid"]["per_class"] for r in records], dtype=float)
            series[label] = (v.mean(axis=0).tolist(), v.std(axis=0).tolist() if len(v) > 1 else None)
    if series:
        figures.per_class_bars(runs.classes, series, "Tian et al. KDD 2021 Fig. 4(c): class-wise Temperature-PGD-20 "
                               "robustness (best 1/T of 2, 5, 10, 50)", runs.png("c"))
    return out


# Table 4, typed from the paper: images of the 1000 test cats predicted as each class
TABLE4 = {
    "1 original, natural": [18, 4, 43, 710, 38, 88, 64, 15, 6, 14],
    "2 + white background, natural": [39, 10, 48, 742, 13, 59, 63, 5, 3, 18],
    "3 + training adjustment, natural": [35, 15, 56, 758, 23, 24, 61, 6, 8, 14],
    "4 original, Temperature-PGD-20": [34, 16, 82, 262, 113, 254, 139, 53, 14, 33],
    "5 + white background, Temperature-PGD-20": [76, 22, 72, 403, 80, 136, 116, 38, 7, 50],
    "6 + training adjustment, Temperature-PGD-20": [93, 31, 80, 435, 72, 84, 111, 35, 3, 56],
}
MASK_THRESHOLD = 0.1  # fastfair data masks' default: a channel within 0.1 of the border colour is background


def _masks(run: Path, bundle) -> Path:
    """Foreground masks of the run's test cats (``border_masks``, standing in for the paper's hand-made ones),
    written once beside the run's results."""
    path = run / "eval" / "background-masks-cat.npz"
    if not path.is_file():
        x = bundle.x_test[bundle.y_test == CAT].numpy()
        write_npz_atomic({"masks": border_masks(x, MASK_THRESHOLD), "class_index": CAT, "rule": "border-colour",
                          "threshold": MASK_THRESHOLD}, path, compressed=True)
    return path


def background(runs: FigureRuns, examples: int) -> list[dict]:
    """``fastfair background`` on each seed's beta = 6 model (the adjusted beta_5 = 0.5 model beside it): the test
    cats natural and under :data:`TPGD`, before and after a white background."""
    out = []
    for seed, (base, adjusted) in enumerate(zip(runs.runs.get(BASE, []), runs.runs.get(ADJUSTED, []))):
        ck = build.checkpoint_path(base)
        cfg = runs.config(BASE, seed)
        mask = _masks(base, data.load(cfg.data.dataset, cfg.data.data_dir))
        out.append(background_counts(ck, cls=str(CAT), mask=str(mask), attacks=["clean", TPGD],
                                     adjusted=build.checkpoint_path(adjusted), examples=examples,
                                     device=runs.device, quiet=True))
    return out


@figure(SOURCE, "Table 4", "test cats predicted as each class, natural and under Temperature-PGD-20, with a "
        "white background and with the training adjustment (Sec. 6.2)", rows=(BASE, ADJUSTED),
        partial="the backgrounds are found by fastfair data masks' border rule, not drawn by hand")
def table4(runs: FigureRuns) -> list[Comparison]:
    """Table 4's 60 counts, each as % of the test cats (the paper's 1000; the text's 26.2 -> 40.3 -> 43.5 % are
    its class-3 column), lines 1-3 natural, 4-6 under Temperature-PGD-20 at 1/T = 5 (:data:`TPGD`)."""
    records = background(runs, examples=0)
    if not records:
        return []
    ours = {}
    for rec in records:
        n = rec["images"]
        for attack, tag in (("clean", "natural"), (TPGD, "Temperature-PGD-20")):
            for line, counts in zip((1, 2, 3) if attack == "clean" else (4, 5, 6),
                                    (rec["counts"]["original"][attack], rec["counts"]["replaced"][attack],
                                     rec["adjusted"]["counts"][attack])):
                ours.setdefault(line, []).append([100 * c / n for c in counts])
    out = []
    for line, (what, paper) in enumerate(TABLE4.items(), start=1):
        for k, name in enumerate(records[0]["classes"]):
            out.append(runs.number(f"Table 4 line {what}", f"% predicted {name}", paper[k] / 10,
                                   [seed[k] for seed in ours[line]]))
    return out


@figure(SOURCE, "Fig. 5", "MNIST with a background colour per class: the images, and the natural and "
        "adversarial confusion matrices of adversarial training (Sec. 6.2)", rows=(FIG5,),
        partial="(a): fastfair's colours (classes 2k and 2k+1 share one, the text's reading), not the "
                "figure's")
def fig5(runs: FigureRuns) -> list[Comparison]:
    """Fig. 5(a): a test image of each class; (b), (c): the test set's confusion matrices, natural and under the
    preset's PGD-40 (``fastfair eval`` of the run's checkpoint), in % of the true class, averaged over seeds. The
    text states no number."""
    if not runs.runs.get(FIG5):
        return []
    # the preset's: reproduce runs only the attacks a row's [paper] numbers need, and this row has none
    attack = next(a for a in config.resolve(FIG5).eval.attacks if a != "clean")
    mats = {what: [_percent(r["confusion"]) for r in runs.results(FIG5, name)]
            for what, name in (("clean", "clean"), ("adversarial", attack))}
    cfg = runs.config(FIG5, -1)
    bundle = data.load(cfg.data.dataset, cfg.data.data_dir)
    y = bundle.y_test.numpy()
    half = -(-len(bundle.classes) // 2)  # two rows of digits: a readable page, not one long strip
    columns = [[(bundle.x_test[int(np.flatnonzero(y == k)[0])].numpy(), [(f"class {bundle.classes[k]}", True)])
                for k in (j, j + half) if k < len(bundle.classes)] for j in range(half)]
    figures.image_grid(columns, [""] * half, ["", ""], "Tian et al. KDD 2021 Fig. 5(a): a test image of each "
                       "class with its background colour", runs.png("a"))
    for letter, what, label in (("b", "clean", "natural images"), ("c", "adversarial", f"{attack} images")):
        figures.heatmap(np.mean(mats[what], axis=0), bundle.classes, f"Tian et al. KDD 2021 Fig. 5({letter}): "
                        f"confusion matrix, {label}", runs.png(letter), cbar="% of the true class's images")
    return []


@figure(SOURCE, "Fig. 6", "test cats before and after their background turns white, with the two most "
        "likely classes natural and under attack (Sec. 6.2)", rows=(BASE, ADJUSTED),
        partial="the images are the two whose confidence in cat rises most with the new background, not "
                "the paper's test images 2261 and 3634; the backgrounds by fastfair data masks' border rule")
def fig6(runs: FigureRuns) -> list[Comparison]:
    """Fig. 6 as ``fastfair background`` draws it for the first seed's beta = 6 model under :data:`TPGD`. The text
    states no number (the boxes' confidences are only in the figure)."""
    records = background(runs, examples=2)
    if records:
        shutil.copyfile(records[0]["figure"], runs.png())
    return []


