"""Tian et al., "Intriguing class-wise properties of adversarial training" (ICLR 2021 submission): its figures.

Figs. 1, 2, 4, 6 and 7 share one robust model per data set, Sec. 3's (``tian-iclr-fig1-<dataset>-*``: PGD-AT,
ImageNet by FGSM-RS as Wong et al., the 75th epoch's model, the 14th on ImageNet), evaluated on the test set after
every epoch for Fig. 1's curves. Fig. 3(b) re-trains the CIFAR-10 one without each class in turn
(``tian-iclr-fig3-madry-without-*``). Fig. 7's standard models are KDD Table 5's (the published version of this
paper, the same setups). Fig. 5 reads Tables 2 and 5's rows. The paper draws CIFAR-100 and ImageNet with 12 of
their classes (Sec. 1: "we randomly sample 12 classes"), named on its axes: :data:`SAMPLED`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fastfair import build
from fastfair.attacks import parse_attack, per_class
from fastfair.data.superclasses import superclass_order
from fastfair.evaluation import measures, seeds
from fastfair.evaluation.diagnose import diagnose_checkpoint
from fastfair.evaluation.homing import homing
from fastfair.reports import figures
from fastfair.reproduce.figures.registry import FigureRuns, figure, inventory
from fastfair.reproduce.verdict import Comparison, default_margin
from fastfair.rundir import RunDir, read_json

SOURCE = "tian-iclr"
# Fig. 1's panels (a)-(f), the order Figs. 2, 4 and 7 keep: data set -> (name, its robust row, the test attack)
PANELS = {
    "a": ("MNIST", "tian-iclr-fig1-mnist-madry", "pgd40"),
    "b": ("CIFAR-10", "tian-iclr-fig1-cifar10-madry", "pgd20"),
    "c": ("CIFAR-100", "tian-iclr-fig1-cifar100-madry", "pgd20"),
    "d": ("SVHN", "tian-iclr-fig1-svhn-madry", "pgd20"),
    "e": ("STL-10", "tian-iclr-fig1-stl10-madry", "pgd20"),
    "f": ("ImageNet", "tian-iclr-fig1-imagenet-fgsm-rs", "pgd50"),
}
ROBUST = tuple(row for _, row, _ in PANELS.values())
# Fig. 7's standard models, panel by panel: KDD Table 5's rows (its App. A.1 setups are Sec. 3's)
STANDARD = {"a": "tian-kdd-t5-mnist-standard", "b": "tian-kdd-t5-cifar10-standard",
            "c": "tian-kdd-t5-cifar100-standard", "d": "tian-kdd-t5-svhn-standard",
            "e": "tian-kdd-t5-stl10-standard", "f": "tian-kdd-t5-imagenet-standard"}
# the 12 classes the paper plots of CIFAR-100 (Figs. 1(c), 4(c), 7(c)) and ImageNet (Figs. 4(f), 7(f)), read off
# their axes; ImageNet's ninth label is illegible in our copy ("8?"), so 11 of its 12
SAMPLED = {"c": [69, 9, 1, 28, 89, 79, 81, 93, 96, 27, 4, 80],
           "f": [22, 127, 562, 471, 383, 580, 101, 353, 60, 848, 899]}
HOMING_BASE = PANELS["b"][1]
HOMING_WITHOUT = tuple(f"tian-iclr-fig3-madry-without-{k}-{name}" for k, name in enumerate(
    ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")))


def _plotted(panel: str, values: np.ndarray, classes: list[str]) -> tuple[np.ndarray, list[str]]:
    """The classes the paper plots of a panel: every one, or its 12 sampled (the last axis of ``values``)."""
    keep = [k for k in SAMPLED.get(panel, range(len(classes))) if k < len(classes)]
    return values[..., keep], [classes[k] for k in keep]


def _panels(runs: FigureRuns, rows: dict[str, str]) -> dict[str, str]:
    """The panels whose row has finished runs here (a data set with no subset file is left out at subset scale)."""
    done = {p: row for p, row in rows.items() if runs.runs.get(row)}
    for p in sorted(rows.keys() - done.keys()):
        runs.echo(f"{runs.key}: panel ({p}) {PANELS[p][0]} not drawn: {rows[p]} has no finished run at this scale")
    return done


def _classes(runs: FigureRuns, row: str) -> list[str]:
    return runs.records[row][0]["classes"]


def _diagnosis(run: Path, attack: str, runs: FigureRuns, tsne_points: int = 0) -> dict:
    """``fastfair diagnose``'s record of the run's checkpoint under ``attack`` on the test set: the one it wrote
    already when it is of this checkpoint and newer, else a new one (weight norms, CVC, t-SNE, ...)."""
    ck = build.checkpoint_path(run)
    path = RunDir(run).diagnostics_file(ck, "test", attack)
    if path.is_file() and path.stat().st_mtime >= ck.stat().st_mtime:
        rec = read_json(path)
        if rec.get("checkpoint") == str(ck) and ("tsne" in rec or not tsne_points):
            return rec
    return diagnose_checkpoint(ck, attack=attack, device=runs.device, tsne_points=tsne_points, quiet=True)


def _ranged(runs: FigureRuns, what: str, stat: str, low: float, high: float, ours: list[float],
            kind: str) -> Comparison:
    """A number the text gives as a range (``low``-``high``): its middle, within half the range plus the
    tables' margin for ``kind``."""
    middle = (low + high) / 2
    return runs.number(what, stat, middle, ours, kind, (high - low) / 2 + default_margin(kind, middle))


@figure(SOURCE, "Fig. 1", "class-wise robustness on the test set after every epoch, per data set (MNIST, "
        "CIFAR-10, CIFAR-100, SVHN, STL-10, ImageNet), the gap between classes shaded",
        partial="ImageNet's ninth plotted class is illegible in the paper; 11 of its 12 are drawn")
def fig1(runs: FigureRuns) -> list[Comparison]:
    """Fig. 1(a)-(f): each plotted class's robustness (the row's test attack) after every epoch, the overall line,
    and the band between the lowest and highest class. The text's numbers (Sec. 1): MNIST above 95 % overall
    robustness, its largest class gap 6 %; CIFAR-10, CIFAR-100, SVHN and STL-10's largest gaps "40%-50%"; ImageNet's
    "up to 80%". The largest gap is the band's widest point over the epochs; a range the text gives is compared as
    its middle, within half its width plus the tables' margin (:func:`_ranged`)."""
    out = []
    for p, row in _panels(runs, {p: row for p, (_, row, _) in PANELS.items()}).items():
        name, _, attack = PANELS[p]
        curves = []
        for history in runs.history(row):
            per_epoch = np.asarray([e["val"][attack]["per_class"] for e in history], dtype=float)
            overall = np.asarray([e["val"][attack]["avg"] for e in history], dtype=float)
            curves.append((per_epoch, overall))
        epochs = list(range(1, min(len(v) for v, _ in curves) + 1))
        classes = _classes(runs, row)
        mean = np.mean([v[: len(epochs)] for v, _ in curves], axis=0)
        shown, names = _plotted(p, mean, classes)
        figures.class_gap_curves(epochs, shown, names, np.mean([o[: len(epochs)] for _, o in curves], axis=0),
                                 f"Fig. 1({p}) {name}: class-wise {attack} robustness, test set"
                                 + (f" (mean of {len(curves)} seeds)" if len(curves) > 1 else ""),
                                 runs.png(p), f"{attack} accuracy (%)")
        gaps = [float(np.ptp(_plotted(p, v, classes)[0], axis=1).max()) for v, _ in curves]
        where = f"Sec. 1, Fig. 1({p}) {name}"
        if p == "a":
            out.append(_ranged(runs, f"{where}: overall {attack} robustness (more than 95 %)", "avg", 95.0, 100.0,
                               [float(v.mean()) for v in runs.per_class(row, attack)], "avg"))
            out.append(runs.number(f"{where}: largest class gap over the epochs", "gap", 6.0, gaps, "mcd"))
        elif p == "f":
            out.append(runs.number(f"{where}: largest class gap over the epochs (up to 80 %)", "gap", 80.0, gaps,
                                   "mcd"))
        else:
            out.append(_ranged(runs, f"{where}: largest class gap over the epochs (40 %-50 %)", "gap", 40.0, 50.0,
                               gaps, "mcd"))
    return out


def _by_superclass(confusion: np.ndarray, classes: list[str]) -> tuple[np.ndarray, list[str]] | None:
    """CIFAR-100's confusion summed into its 20 super-classes (Fig. 2(c)'s axes), else None."""
    found = superclass_order(classes)
    if found is None:
        return None
    order, blocks = found
    member = np.zeros((len(classes), len(blocks)))  # class -> its super-class, one-hot
    for s, b in enumerate(blocks):
        member[order[b.start: b.start + b.size], s] = 1
    return member.T @ confusion @ member, [str(s) for s in range(len(blocks))]


@figure(SOURCE, "Fig. 2", "confusion matrices of robustness on the test set (row: true class, column: the "
        "attack's prediction, % of the row), per data set; CIFAR-100 by super-class", rows=ROBUST)
def fig2(runs: FigureRuns) -> list[Comparison]:
    """Fig. 2(a)-(f): the selected model's confusion under the row's test attack, each row in % of its class's test
    images (its diagonal is the class's robustness); CIFAR-100 summed by super-class (the figure's index axes),
    ImageNet's 1000 classes by index. The text states no number of it."""
    for p, row in _panels(runs, {p: row for p, (_, row, _) in PANELS.items()}).items():
        name, _, attack = PANELS[p]
        conf = np.sum([r["confusion"] for r in runs.results(row, attack)], axis=0)
        classes = _classes(runs, row)
        coarse = _by_superclass(conf, classes) if p == "c" else None
        m, names = coarse if coarse else (conf, classes)
        figures.heatmap(measures.confusion_percent(m), names, f"Fig. 2({p}) {name}: confusion matrix of robustness, "
                        f"{attack} on the test set" + (", by super-class" if coarse else ""), runs.png(p),
                        cbar="% of the true class's images")
    return []


@figure(SOURCE, "Fig. 3", "CIFAR-10: (a) misclassified confusion matrix (counts, diagonal hidden), "
        "(b) homing confusion matrix (re-trained without each confound class)",
        rows=(HOMING_BASE,))  # the re-trainings are its own rows (their [paper] names Fig. 3(b))
def fig3(runs: FigureRuns) -> list[Comparison]:
    """Fig. 3 through ``fastfair homing`` (:func:`fastfair.evaluation.homing.homing`) per seed: the CIFAR-10 model
    and its re-trainings without one class each, all attacked with PGD-20 on the same test images. The text's
    numbers (Sec. 3.1): 147 trucks (class 9) sent to automobile (class 1), 116 of which home without class 1; the
    rest of Fig. 3(a)'s truck row is printed in its cells (49, 15, 30, 7, 15, 23, 21, 73 to classes 0, 2..8). They
    are compared as shares: of the class's 1,000 test images for (a) (a subset keeps fewer), of the 147 for (b)."""
    records = []
    for seed, base in enumerate(runs.runs.get(HOMING_BASE, [])):
        without = [runs.runs[row][seed] for row in HOMING_WITHOUT if len(runs.runs.get(row, [])) > seed]
        if not without:
            continue
        md = homing([str(base), *map(str, without)], attack="pgd20", out=str(runs.out / f"homing-s{seed}"),
                    device=runs.device, quiet=True)
        records.append(read_json(md.with_suffix(".json")))
    if not records:
        runs.echo(f"{runs.key}: not drawn: no finished seed of {HOMING_BASE} with a re-trained run beside it")
        return []
    mis = np.mean([r["misclassified"] for r in records], axis=0)
    home = np.mean([[[np.nan if v is None else v for v in row] for row in r["homing"]] for r in records], axis=0)
    figures.homing_heatmaps(mis, home, records[0]["classes"],
                            f"CIFAR-10, PGD-20 on {records[0]['images']} test images"
                            + (f", mean of {len(records)} seeds" if len(records) > 1 else ""),
                            runs.png(), cite="Tian et al. ICLR 2021 submission, Fig. 3")
    trucks = sum(runs.records[HOMING_BASE][0]["results"]["clean"]["confusion"][9])  # the test set's, every seed's
    out = [runs.number(f"Fig. 3(a): trucks sent to {name} ({n} of 1,000 in the paper)", "% of trucks", n / 10,
                       [100 * r["misclassified"][9][j] / trucks for r in records])
           for j, (name, n) in enumerate(zip(records[0]["classes"], (49, 147, 15, 30, 7, 15, 23, 21, 73)))]
    shares = [100 * r["homing"][9][1] / r["misclassified"][9][1] for r in records
              if r["homing"][9][1] is not None and r["misclassified"][9][1]]
    if not shares:  # the verdict below reads "no result": say it is no failure
        runs.echo(f"{runs.key}: no seed's attack sent a truck to automobile (or none was re-trained without it): "
                  "Sec. 3.1's homing share (116 of 147) has nothing to count here")
    out.append(runs.number("Sec. 3.1, Fig. 3(b): trucks sent to automobile that home without it (116 of 147)",
                           "% homing", 100 * 116 / 147, shares))
    return out


@figure(SOURCE, "Fig. 4", "each class's robustness beside its classifier weight's L2 norm, both "
        "normalised, per data set", rows=ROBUST)
def fig4(runs: FigureRuns) -> list[Comparison]:
    """Fig. 4(a)-(f): per plotted class, its robustness under the row's test attack and ||w_k||_2 of its row of the
    last layer (Sec. 3.2), each divided by its largest class's value (the paper says "normalize" and its axis ends
    at 1.0), from ``fastfair diagnose`` of the selected model; mean over seeds. The text states no number of it."""
    for p, row in _panels(runs, {p: row for p, (_, row, _) in PANELS.items()}).items():
        name, _, attack = PANELS[p]
        diags = [_diagnosis(run, attack, runs) for run in runs.runs[row]]
        classes = _classes(runs, row)
        robust, names = _plotted(p, np.mean([d["accuracy"]["adv"] for d in diags], axis=0), classes)
        norms, _ = _plotted(p, np.mean([d["weight_norms"] for d in diags], axis=0), classes)
        figures.per_class_bars(names, {f"robustness ({attack})": (100 * robust / max(robust.max(), 1e-9), None),
                                       "classifier weight norm": (100 * norms / norms.max(), None)},
                               f"Fig. 4({p}) {name}: robustness and classifier weight norm, normalised",
                               runs.png(p), ylabel="% of the largest class's value")
    return []


# Fig. 5's models: (a) Table 2's (fastfair's re-trained TRADES and MART), (e) Table 5's; (b)-(d) and (f)-(h) follow one
# cat through the PGD-20 iterations: test image 127 under Madry and MART, 46 under HE at 1/T = 1 and 10
CVC_MODELS = {"a": ("tian-iclr-t2-madry", "tian-iclr-t2-trades", "tian-iclr-t2-mart"),
              "e": ("tian-iclr-t5-madry", "tian-iclr-t5-he", "tian-iclr-t5-he-lis", "tian-iclr-t5-he-cmp")}
TRAJECTORIES = {"bcd": (127, {"Madry: 1/T=1": ("tian-iclr-t2-madry", 1.0), "MART: 1/T=1": ("tian-iclr-t2-mart", 1.0)}),
                "fgh": (46, {"HE: 1/T=1": ("tian-iclr-t5-he", 1.0), "HE: 1/T=10": ("tian-iclr-t5-he", 10.0)})}
STEPS = (1, 10, 20)
CAT = 3


def _row_name(preset: str) -> str:
    return preset.removeprefix("tian-iclr-t2-").removeprefix("tian-iclr-t5-").upper().replace("MADRY", "Madry")


def _cat(y: torch.Tensor, index: int, full: bool) -> tuple[int, bool]:
    """The test image Fig. 5 follows: the paper's ``index`` where the test set is the paper's (``full``: the whole
    official one, in its order) and that image is a cat, else the set's first cat (a subset renumbers its images:
    its image 127 is another one); returns (its index, whether it is the paper's image)."""
    same = full and index < len(y) and int(y[index]) == CAT
    return (index if same else int(torch.nonzero(y == CAT)[0])), same


def _trajectory(run: Path, index: int, inv_t: float, device: str, full: bool) -> tuple[np.ndarray, int, bool]:
    """The softmax output (at temperature ``1 / inv_t``, as Eq. 1 of Temperature-PGD) on one test cat (:func:`_cat`)
    after each of :data:`STEPS` PGD iterations (``tpgd`` at 1/T = ``inv_t``, the run's eval eps and step): one random
    start for all, so each is one attack stopped after n iterations; returns (probabilities (steps, C), the image,
    whether it is the paper's)."""
    ck, cfg, dev, model, bundle, (x, y) = build.from_checkpoint(build.checkpoint_path(run), split="test",
                                                                device_name=device, data_dir=None, batch_size=None,
                                                                channels_last_ok=False)
    i, same = _cat(y, index, full)
    model.eval()
    xi, yi = next(iter(build.eval_loader(cfg, (x[i: i + 1], y[i: i + 1]), dev, False)))  # scaled as eval scales
    c = bundle.num_classes
    eps, alpha = per_class(cfg.eval.eps, c, dev, "eval.eps"), per_class(cfg.eval.alpha, c, dev, "eval.alpha")
    probs = []
    for n in STEPS:
        name = f"pgd{n}" if inv_t == 1 else f"tpgd{n}@t{1 / inv_t:g}"
        with seeds.seeded(cfg.eval.seed, "tian-iclr-f5", index, device=dev):
            adv = parse_attack(name)(model, xi, yi, eps, alpha)
        with torch.no_grad():
            probs.append((inv_t * model(adv).float()).softmax(1)[0].cpu().numpy())
    return np.asarray(probs), i, same


@figure(SOURCE, "Fig. 5", "(a), (e): class-wise variance of the predicted probability (Madry, TRADES, "
        "MART; Madry, HE, HE-LIS, HE-CMP); (b)-(d), (f)-(h): one cat's predicted distribution after 1, 10 "
        "and 20 PGD iterations",  # Table 2's rows come with the substitute of their transfer attack
        rows=(*CVC_MODELS["a"], "tian-iclr-t2-standard", *CVC_MODELS["e"]),
        partial="TRADES and MART are fastfair's re-trained rows (the paper's are the authors' released "
                "models: tian-iclr-t2-*-released, evaluated by tian-iclr-t2)")
def fig5(runs: FigureRuns) -> list[Comparison]:
    """Fig. 5 (Sec. 4). (a), (e): per class, the mean over its natural test images of the variance of the predicted
    distribution (``fastfair diagnose``'s CVC, Tian et al. KDD Def. 5.1), as % of its largest possible value
    (C - 1) / C^2; Madry's row appears in (e) as Table 5's, since the paper compares HE with it there. (b)-(d),
    (f)-(h): the distribution of one cat (:func:`_trajectory`) after iterations 1, 10 and 20, first seed. The text
    states no number of it."""
    for p, rows in CVC_MODELS.items():
        rows = [r for r in rows if runs.runs.get(r)]
        series = {}
        for row in rows:
            c = len(_classes(runs, row))
            cvc = np.asarray([_diagnosis(run, "pgd20", runs)["cvc"]["clean"] for run in runs.runs[row]],
                             dtype=float)  # an absent class's null cells: NaN, not an object array
            series[_row_name(row)] = (100 * cvc.mean(0) * c * c / (c - 1), cvc.std(0) * 100 * c * c / (c - 1)
                                      if len(cvc) > 1 else None)
        if series:
            figures.per_class_bars(_classes(runs, rows[0]), series, f"Fig. 5({p}): class-wise variance of the "
                                   "predicted probability, natural test images", runs.png(p),
                                   ylabel="variance, % of (C-1)/C^2", percent=False)  # its own scale: a few %
    for panels, (index, models) in TRAJECTORIES.items():
        found = {label: (runs.runs[row][0], inv_t) for label, (row, inv_t) in models.items() if runs.runs.get(row)}
        if not found:
            continue
        done = {label: _trajectory(run, index, inv_t, runs.device, runs.scale == "full")
                for label, (run, inv_t) in found.items()}
        _, image, same = next(iter(done.values()))
        which = f"test image {image}" + ("" if same else f" of this test set (not the paper's {index})")
        classes = _classes(runs, models[next(iter(found))][0])
        for k, (panel, n) in enumerate(zip(panels, STEPS)):
            figures.per_class_bars(classes, {label: (100 * probs[k], None) for label, (probs, _, _) in done.items()},
                                   f"Fig. 5({panel}): predicted distribution of {which}, a cat, after PGD iteration "
                                   f"{n}", runs.png(panel), ylabel="probability (%)")
    return []


@figure(SOURCE, "Fig. 6", "number of classes per robustness interval: CIFAR-100 (75th epoch), "
        "ImageNet (14th epoch)", rows=(PANELS["c"][1], PANELS["f"][1]))
def fig6(runs: FigureRuns) -> list[Comparison]:
    """Fig. 6 (App. A): every class's robustness (PGD-20; ImageNet PGD-50) counted into [0, 10], (10, 20], ...,
    (90, 100], one panel per data set; mean over seeds of each class first. The text states no number of it."""
    edges = np.arange(0, 101, 10)
    labels = ["[0,10]", *(f"({a},{a + 10}]" for a in edges[1:-1])]
    counts = {}
    for p, row in _panels(runs, {"c": PANELS["c"][1], "f": PANELS["f"][1]}).items():
        name, _, attack = PANELS[p]
        acc = runs.per_class(row, attack).mean(axis=0)
        bins = np.clip(np.ceil(acc / 10).astype(int) - 1, 0, 9)  # (a, a + 10], with 0 in the first
        counts[f"({'ab'[p == 'f']}) {name} ({attack})"] = np.bincount(bins, minlength=10).tolist()
    if counts:
        figures.interval_counts(counts, labels, "Fig. 6: number of classes per robustness interval", runs.png(),
                                "robustness interval (%)")
    return []


# Fig. 7's gaps, as App. C prints them: panel -> (standard training's, adversarial training's)
GAPS = {"b": (10.7, 52.8), "c": (30.0, 47.0), "d": (5.4, 37.0), "e": (36.1, 51.0)}


def _gap(values: np.ndarray, names: list[str]) -> str:
    """Fig. 7's legend note (App. C): the largest gap between the plotted classes of the seeds' mean, and its highest
    and lowest class (the paper's "52.8%(Class 1-Class 3)")."""
    mean = values.mean(0)
    if not np.ptp(mean):  # every class alike (an untrained model's 0 %): no pair of classes to name
        return "no gap between classes"
    # "between A and B": MNIST's classes are digits, and "0 - 3" would read as a subtraction
    return f"largest gap {np.ptp(mean):.1f} between {names[int(mean.argmax())]} and {names[int(mean.argmin())]}"


@figure(SOURCE, "Fig. 7", "class-wise clean accuracy of standard training beside class-wise robustness of "
        "adversarial training, per data set", rows=(*ROBUST, *STANDARD.values()),
        partial="ImageNet's standard model is trained (KDD Table 5's row), not PyTorch's pre-trained "
                "ResNet-50 the paper uses (no download here: fastfair eval --model resnet50 FILE); "
                "MNIST's and ImageNet's gaps are illegible in the paper, so not compared")
def fig7(runs: FigureRuns) -> list[Comparison]:
    """Fig. 7(a)-(f) (App. C): per plotted class, the standard model's clean accuracy beside the robust model's
    robustness (the row's test attack), and each one's largest gap between classes. The text's gaps: CIFAR-10
    10.7 and 52.8 (class 1 - class 3), SVHN 5.4 and 37.0 (class 1 - class 8), STL-10 36.1 and 51.0 (class 0 - class
    5), CIFAR-100 30.0 (class 9 - class 80) and 47.0 (class 69 - class 80) among its 12 plotted classes."""
    out = []
    for p, row in _panels(runs, {p: row for p, (_, row, _) in PANELS.items()}).items():
        name, _, attack = PANELS[p]
        classes = _classes(runs, row)
        robust, names = _plotted(p, runs.per_class(row, attack), classes)
        series = {f"adversarial training: {attack}, {_gap(robust, names)}": (
            robust.mean(0), robust.std(0) if len(robust) > 1 else None)}
        standard = _plotted(p, runs.per_class(STANDARD[p], "clean"), classes)[0] if runs.runs.get(
            STANDARD[p]) else None
        if standard is not None:
            series = {f"standard training: clean, {_gap(standard, names)}": (
                standard.mean(0), standard.std(0) if len(standard) > 1 else None), **series}
        figures.per_class_bars(names, series, f"Fig. 7({p}) {name}: standard accuracy and adversarial robustness",
                               runs.png(p))
        if p in GAPS:
            where = f"App. C, Fig. 7({p}) {name}"
            if standard is not None:
                out.append(runs.number(f"{where}: largest class gap, standard training", "gap clean", GAPS[p][0],
                                       np.ptp(standard, axis=1).tolist(), "mcd"))
            out.append(runs.number(f"{where}: largest class gap, adversarial training", f"gap {attack}", GAPS[p][1],
                                   np.ptp(robust, axis=1).tolist(), "mcd"))
    return out


@figure(SOURCE, "Fig. 8", "t-SNE of CIFAR-10's penultimate features: (a) natural, (b) adversarial test "
        "images", rows=(HOMING_BASE,))
def fig8(runs: FigureRuns) -> list[Comparison]:
    """Fig. 8 (App. D): t-SNE of the robust CIFAR-10 model's penultimate features on natural and PGD-20 test
    images, embedded together (``fastfair diagnose``, 500 images), first seed. The text states no number of it."""
    if not runs.runs.get(HOMING_BASE):
        runs.echo(f"{runs.key}: not drawn: {HOMING_BASE} has no finished run at this scale")
        return []
    d = _diagnosis(runs.runs[HOMING_BASE][0], "pgd20", runs, tsne_points=500)
    t = d["tsne"]
    figures.tsne(t["clean"], t["adv"], t["labels"], d["classes"], "Fig. 8: t-SNE of CIFAR-10 (robust model)",
                 runs.png(), attack="pgd20")
    return []


inventory(SOURCE, ["Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 2", "Fig. 5", "Table 3", "Fig. 6",
                   "Fig. 7", "Fig. 8", "Table 4", "Table 5", "Table 6"])
