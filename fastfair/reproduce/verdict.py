"""Each number the paper reports beside ours: the difference, its interval, and a verdict.

The rule (docs/reproduce.md, "Verdicts", derives it): d = mean(ours) - paper. The per-seed std sigma is pooled
from the sides that measured one (ours with n - 1 degrees of freedom, the paper's std with n_p - 1), then floored
at the evaluation's own sampling noise, the binomial error of an accuracy over the test images behind it
(:func:`binomial_sd`); SE = sigma sqrt(1/n + 1/n_p) (the two-sample t statistic's SE, Student 1908). Quantiles are
Student's t with the pooled df where either side measured a std (even where the floor is larger: the level holds),
the normal where neither did (the floor is then sigma, a fixed value). A number **agrees** when the 90 % interval
of d lies within the practical margin +-delta (two one-sided tests at 5 %, Schuirmann 1987), is
**higher**/**lower** when the 95 % interval excludes 0, and is :data:`UNDECIDED` otherwise: the data cannot tell.

The margin delta per kind (:data:`DEFAULT_TOLERANCE`): averages move by well under a point between seeds,
worst-class and single-class accuracies by several (CFA Sec. 3.3), so 1 and 3 points; MCD 5 points; CV
:data:`CV_TOLERANCE` of the paper's (at least 1 %^2). The class-wise spread's floor propagates the per-class
binomial error (Tian et al. KDD 2021's CV = (1/C) sum_k (a_k - mean a)^2): dCV/da_k = (2/C)(a_k - mean a), so
sd(CV) = 2 sqrt(CV / C) sigma_class; MCD = best - worst, so sd(MCD) = sqrt(sigma_best^2 + sigma_worst^2).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from fastfair.evaluation.measures import cv, mcd, rho
from fastfair.reproduce.paper import SPREAD, Number, PaperRow

DEFAULT_TOLERANCE = {"avg": 1.0, "worst": 3.0, "class": 3.0, "mcd": 5.0}
CV_TOLERANCE = 0.25  # of the paper's CV, and at least 1 (% squared): near 0 the seeds' own noise dominates
EQUIVALENCE = 0.90  # the interval inside the margin: two one-sided tests at 5 %
DIFFERENCE = 0.95  # the interval that must exclude 0 for higher/lower: a two-sided test at 5 %
# the verdicts, in one place (write.py draws each in its own colour and marker)
AGREES, HIGHER, LOWER = "agrees", "higher", "lower"
UNDECIDED = "within noise: too few seeds to say"
NO_RESULT = "no result"
NOT_COMPARABLE = "not comparable to the paper"
VERDICTS = (AGREES, HIGHER, LOWER, UNDECIDED, NO_RESULT, NOT_COMPARABLE)


def binomial_sd(q: float | np.ndarray, images: int | np.ndarray) -> float | np.ndarray:
    """sd of an accuracy (%) of true rate ``q`` (%) over ``images`` test images: 100 sqrt(q (1 - q) / N)."""
    p = np.clip(np.asarray(q, dtype=float) / 100, 0, 1)
    return 100 * np.sqrt(p * (1 - p) / np.maximum(images, 1))


def spread_floor(stat: str, value: float, per_class: np.ndarray, images: np.ndarray) -> float:
    """The binomial error of a class-wise spread (``cv`` of about ``value``, or ``mcd``) of the per-class accuracies
    ``per_class`` (%) over ``images`` test images a class: sd(CV) = 2 sqrt(CV / C) sigma_class (the rms of the
    classes' binomial errors), sd(MCD) = sqrt(sigma_best^2 + sigma_worst^2) (the module's docstring derives both)."""
    sd = binomial_sd(per_class, images)
    if stat == "cv":
        return float(2 * np.sqrt(max(value, 0.0) / len(per_class)) * np.sqrt(np.mean(sd ** 2)))
    return float(np.hypot(sd[np.argmax(per_class)], sd[np.argmin(per_class)]))


def intervals(ours: np.ndarray, paper: float | np.ndarray, paper_std: float | np.ndarray | None, paper_n: int,
              floor: float | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, the half-width of its 90 % interval, of its 95 %) for each line of ``ours`` (trials x n seeds) against the
    paper's mean, its std over ``paper_n`` runs (None where it prints none), and the evaluation's noise ``floor``:
    sigma pooled from the measured stds and floored, SE = sigma sqrt(1/n + 1/n_p), Student's t quantiles with the
    pooled df where a std was measured, the normal's where none was (the floor is sigma). Vectorised, so a
    simulation runs it on many trials at once."""
    ours = np.atleast_2d(np.asarray(ours, dtype=float))
    n = ours.shape[1]
    squares, df = np.zeros(len(ours)), 0
    if n >= 2:
        squares, df = (n - 1) * ours.var(axis=1, ddof=1), n - 1
    if paper_std is not None and paper_n >= 2:
        squares, df = squares + (paper_n - 1) * np.square(paper_std), df + paper_n - 1
    se = np.maximum(np.sqrt(squares / max(df, 1)), floor) * np.sqrt(1 / n + 1 / paper_n)

    def half(level: float) -> float | np.ndarray:  # two-sided: the (1 + level) / 2 quantile
        # Student's t whenever a std was measured, even where the floor is larger: a low measured std does not
        # show the floor is the true sigma, and t keeps the test's level (the normal gave 6 % false alarms at 3 seeds)
        return (sps.t.ppf((1 + level) / 2, df) if df else sps.norm.ppf((1 + level) / 2)) * se

    return ours.mean(axis=1) - paper, half(EQUIVALENCE), half(DIFFERENCE)


def judge(ours: np.ndarray, paper: float | np.ndarray, paper_std: float | np.ndarray | None, paper_n: int,
          floor: float | np.ndarray, margin: float) -> np.ndarray:
    """The verdict of each line of ``ours`` (trials x n seeds), :func:`intervals` read by the module's rule."""
    d, half90, half95 = intervals(ours, paper, paper_std, paper_n, floor)
    return np.where(np.abs(d) + half90 <= margin, AGREES,
                    np.where(d - half95 > 0, HIGHER, np.where(d + half95 < 0, LOWER, UNDECIDED)))


@dataclass(frozen=True)
class Comparison:
    preset: str
    row: str
    attack: str
    stat: str  # avg | worst | a class name
    paper: float
    ours: list[float]  # one value per seed that finished
    margin: float  # the practical margin delta: how far ours may be and still agree
    margin_from: str  # "default" | "figure" (the default plus the figure's reading half-width, or the drawer's)
    comparable: bool
    paper_n: int = 1  # the paper's runs behind its number ([paper] seeds)
    paper_std: float | None = None  # the paper's std over them, where it prints one
    floor: float = 0.0  # the evaluation's own sampling noise per seed (binomial error), 0 for a non-accuracy

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.ours)) if self.ours else None

    @property
    def std(self) -> float | None:
        return float(np.std(self.ours, ddof=1)) if len(self.ours) > 1 else None

    @property
    def diff(self) -> float | None:
        return None if self.mean is None else self.mean - self.paper

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval of :attr:`diff` the verdict reads (None without a result)."""
        if not self.ours:
            return None
        d, _, half = intervals(np.asarray([self.ours]), self.paper, self.paper_std, self.paper_n, self.floor)
        return float(d[0] - half[0]), float(d[0] + half[0])

    @property
    def verdict(self) -> str:
        if not self.ours:
            return NO_RESULT
        if not self.comparable:
            return NOT_COMPARABLE
        return str(judge(np.asarray([self.ours]), self.paper, self.paper_std, self.paper_n, self.floor,
                         self.margin)[0])


def _ours(record: dict, attack: str, stat: str, k: int | None) -> float | None:
    """Our value of one statistic from an evaluation record (accuracies in %); None for a class absent from the
    evaluated images (no value to compare)."""
    result = record["results"][attack]
    if stat in SPREAD:  # over the present classes (measures.cv and mcd leave absent ones out)
        return (cv if stat == "cv" else mcd)(np.asarray(result["per_class"], dtype=float))
    if k is not None:
        value = result["per_class"][k]
        return None if value is None else float(value)
    if stat == "avg":  # the papers' "accuracy" is the share of test images correct
        return float(result["summary"].get("overall", result["summary"]["avg"]))
    return float(result["summary"]["worst"])


def _stats(number: Number, classes: list[str]) -> list[tuple[str, float, int | None, str]]:
    """(label, paper value, class index or None, tolerance kind) for every value the paper gives."""
    out = [(s, v, None, s) for s, v in (("avg", number.avg), ("worst", number.worst)) if v is not None]
    out += [(classes[k], v, k, "class") for k, v in enumerate(number.per_class)]
    out += [(name, v, classes.index(name), "class") for name, v in number.classes.items() if name in classes]
    return out + [(s, v, None, s) for s in SPREAD if (v := getattr(number, s)) is not None]


def default_margin(kind: str, paper: float) -> float:
    """The default margin of a number of ``kind`` (avg, worst, class, cv, mcd) whose paper value is ``paper``."""
    return max(CV_TOLERANCE * paper, 1.0) if kind == "cv" else DEFAULT_TOLERANCE[kind]


def _floor(results: list[dict], kind: str, k: int | None, paper: float, ours: list[float]) -> float:
    """The evaluation's own noise behind one number: the binomial error over the test images the confusion
    matrices count (avg: all; a class: its row; worst: the worst class's), at the mean of the paper's value and
    ours; a spread's propagated (:func:`spread_floor`). 0 where the records hold no confusion matrix to count."""
    if not ours or not all("confusion" in r for r in results):
        return 0.0
    rows = np.mean([np.asarray(r["confusion"], dtype=float).sum(axis=1) for r in results], axis=0)
    # an absent class's cell is null (NaN here): it has no images and is left out, as the summaries leave it out
    per_class = np.mean([np.asarray(r["per_class"], dtype=float) for r in results], axis=0)
    q = (paper + float(np.mean(ours))) / 2
    if kind in SPREAD:
        present = ~np.isnan(per_class)
        return spread_floor(kind, q, per_class[present], rows[present])
    images = rows.sum() if kind == "avg" else rows[k] if k is not None else rows[np.nanargmin(per_class)]
    return float(binomial_sd(q, images))


def compare_row(row: PaperRow, records: list[dict], comparable: bool, classes: list[str],
                runs_for: dict[str, str] | None = None) -> list[Comparison]:
    """Every number of ``row`` beside ours from ``records`` (one evaluation record per finished seed); ``runs_for``
    names the attack run for each of the paper's (the scale's; itself by default)."""
    out = []
    for attack, number in row.numbers.items():
        ran = (runs_for or {}).get(attack, attack)
        results = [rec["results"][ran] for rec in records if ran in rec["results"]]
        for label, paper, k, kind in _stats(number, classes):
            ours = [v for rec in records if ran in rec["results"] if (v := _ours(rec, ran, label, k)) is not None]
            out.append(Comparison(row.preset, row.row, attack, label, paper, ours, default_margin(kind, paper),
                                  "default", comparable, row.seeds,
                                  number.std.get(kind) if kind in ("avg", "worst") else None,
                                  _floor(results, kind, k, paper, ours)))
    return out


@dataclass(frozen=True)
class Rho:
    """One row's rho against its table's baseline row for one attack: the paper's, from its own numbers, and ours."""

    preset: str
    row: str
    attack: str
    baseline: str  # the baseline row's label
    paper: float
    ours: float | None  # from the seed means; None until both rows have results


def rho_rows(rows: list[PaperRow], comparisons: list[Comparison]) -> list[Rho]:
    """rho (:func:`~fastfair.evaluation.measures.rho`) of every row naming a ``baseline``, per attack whose average
    and worst class both rows report; the paper's rho comes from the numbers it prints, ours from our seed means
    of the same cells."""
    by_preset = {r.preset: r for r in rows}
    means = {(c.preset, c.attack, c.stat): c.mean for c in comparisons}
    out = []
    for row in rows:
        base = by_preset.get(row.baseline)
        if base is None:
            continue
        for attack, number in row.numbers.items():
            ref = base.numbers.get(attack)
            if ref is None or None in (number.avg, number.worst, ref.avg, ref.worst):
                continue
            cells = [means.get((p, attack, s)) for p in (row.preset, base.preset) for s in ("avg", "worst")]
            ours = None if None in cells else rho(cells[0], cells[1], cells[2], cells[3])
            out.append(Rho(row.preset, row.row, attack, base.row, rho(number.avg, number.worst, ref.avg, ref.worst),
                           ours))
    return out
