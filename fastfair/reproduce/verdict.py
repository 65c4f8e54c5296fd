"""Each number the paper reports beside ours: the difference, its interval, and a verdict.

The rule (docs/reproduce.md, "Verdicts", derives it and states what it guarantees; tests/test_verdict_stats.py
simulates each statement): d = mean(ours) - paper, ours over k seeds, the paper's over its n_p runs. Its variance is
a sum of measured components, the seeds' spread on each side and, only where the two sides scored different test
images, the binomial error of those images (:func:`binomial_sd`); its degrees of freedom are Welch-Satterthwaite's
(Satterthwaite 1946), the binomial term counting as known.

- Both sides measured a spread (k >= 2 seeds; the paper prints a std): the wider of Student's interval (the stds
  pooled, k + n_p - 2 df: exact where both sides are one distribution) and Welch's (SE^2 = s^2 / k + s_p^2 / n_p,
  Welch 1947: valid where the spreads differ). A printed std is read as its upper bound, s_p plus half a unit of
  its last printed digit, so a printed 0.0 means "below 0.05".
- Only ours (k >= 2; the paper prints none): the paper's runs are taken to spread as ours do, the null hypothesis of
  a reproduction: SE^2 = s^2 (1 / k + 1 / n_p) with k - 1 df (the prediction interval of n_p more runs' mean).
- One seed of ours measures no spread: no test, whatever the paper prints (:data:`ONE_SEED`); Welch needs each side's
  own spread, and borrowing the paper's for ours would make one seed reach verdicts more easily than two.
- Seeds whose spread is 0 with no printed std give an interval of width 0: no test either (:data:`NO_SPREAD`).

A number **agrees** when the 90 % interval of d lies within the practical margin +-delta (two one-sided tests at
5 %, Schuirmann 1987), is **higher**/**lower** when the 95 % interval excludes 0, and :data:`UNDECIDED` otherwise.
The margin delta per kind (:data:`DEFAULT_TOLERANCE`): averages move by well under a point between seeds,
worst-class and single-class accuracies by several (CFA Sec. 3.3), so 1 and 3 points; MCD 5 points; CV
:data:`CV_TOLERANCE` of the paper's (at least 1 %^2). The class-wise spread's binomial error propagates the
per-class one (Tian et al. KDD 2021's CV = (1/C) sum_k (a_k - mean a)^2): dCV/da_k = (2/C)(a_k - mean a), so
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
# the fewest seeds that can show agreement at the spreads papers print: k seeds against one run agree only when
# their sd is below delta / (t_0.95,k-1 sqrt(1/k + 1)), delta / 7.7 at 2 seeds, delta / 3.4 at 3 (docs/reproduce.md)
SEEDS_TO_TELL = 3
# the verdicts, in one place (write.py draws each in its own colour and marker)
AGREES, HIGHER, LOWER = "agrees", "higher", "lower"
UNDECIDED = "within noise: too few seeds to say"
CANNOT_TELL = "cannot tell"  # no test: each such verdict names why after a colon
ONE_SEED = f"{CANNOT_TELL}: one seed measures no spread; run --seeds {SEEDS_TO_TELL}"
NO_SPREAD = f"{CANNOT_TELL}: our seeds gave one value and the paper prints no std"
UNCOUNTED = f"{CANNOT_TELL}: ours scored other images than the paper's and no confusion matrix counts them"
NO_RESULT = "no result"
NOT_COMPARABLE = "not comparable to the paper"
VERDICTS = (AGREES, HIGHER, LOWER, UNDECIDED, ONE_SEED, NO_SPREAD, UNCOUNTED, NO_RESULT, NOT_COMPARABLE)


def binomial_sd(q: float | np.ndarray, images: int | np.ndarray) -> float | np.ndarray:
    """sd of an accuracy (%) of true rate ``q`` (%) over ``images`` test images: 100 sqrt(q (1 - q) / N)."""
    p = np.clip(np.asarray(q, dtype=float) / 100, 0, 1)
    return 100 * np.sqrt(p * (1 - p) / np.maximum(images, 1))


def spread_sd(stat: str, value: float, per_class: np.ndarray, images: np.ndarray) -> float:
    """The binomial error of a class-wise spread (``cv`` of about ``value``, or ``mcd``) of the per-class accuracies
    ``per_class`` (%) over ``images`` test images a class: sd(CV) = 2 sqrt(CV / C) sigma_class (the rms of the
    classes' binomial errors), sd(MCD) = sqrt(sigma_best^2 + sigma_worst^2) (the module's docstring derives both)."""
    sd = binomial_sd(per_class, images)
    if stat == "cv":
        return float(2 * np.sqrt(max(value, 0.0) / len(per_class)) * np.sqrt(np.mean(sd ** 2)))
    return float(np.hypot(sd[np.argmax(per_class)], sd[np.argmin(per_class)]))


def half_digit(decimals: int) -> float:
    """Half a unit of the last digit a number is printed to: the most a printed value is off by rounding."""
    return 0.5 * 10.0 ** -decimals


def _half_width(level: float, parts: list[tuple[np.ndarray, float]]) -> np.ndarray:
    """t_((1 + level) / 2, df) sqrt(sum v) for variance components (v, df), df by Welch-Satterthwaite:
    (sum v)^2 / sum (v^2 / df) (Satterthwaite 1946, Eq. 17); a known component (df inf) adds no term."""
    total = sum(v for v, _ in parts)
    with np.errstate(divide="ignore", invalid="ignore"):
        df = total ** 2 / sum(v ** 2 / f for v, f in parts if np.isfinite(f))
    return sps.t.ppf((1 + level) / 2, df) * np.sqrt(total)


def intervals(ours: np.ndarray, paper: float | np.ndarray, paper_std: float | np.ndarray | None, paper_n: int,
              image_sd: float | np.ndarray = 0.0, paper_decimals: int = 2
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(d, the half-width of its 90 % interval, of its 95 %) for each line of ``ours`` (trials x k seeds) against
    the paper's mean over ``paper_n`` runs and its std (None where it prints none; printed to ``paper_decimals``),
    with ``image_sd`` the binomial error the two sides' different test images add (0 where they scored the same).
    The half-widths are NaN where there is no test: one seed of ours, or no spread on either side. Where both sides
    measured a spread the interval is the wider of Student's (the stds pooled: exact when both sides are one
    distribution) and Welch's (each side its own: valid when their spreads differ), so it holds the level of both.
    Vectorised, so a simulation runs it on many trials at once."""
    ours = np.atleast_2d(np.asarray(ours, dtype=float))
    k = ours.shape[1]
    d = ours.mean(axis=1) - paper
    if k < 2:
        nan = np.full(len(ours), np.nan)
        return d, nan, nan
    s2 = ours.var(axis=1, ddof=1)
    images = (np.square(image_sd), np.inf)
    if paper_std is not None and paper_n >= 2:
        sp2 = np.square(np.asarray(paper_std, dtype=float) + half_digit(paper_decimals))
        df = k + paper_n - 2
        pooled = ((k - 1) * s2 + (paper_n - 1) * sp2) / df
        variants = [[(pooled * (1 / k + 1 / paper_n), df), images], [(s2 / k, k - 1), (sp2 / paper_n, paper_n - 1),
                                                                     images]]
        spread = pooled
    else:  # the paper's runs spread as ours: the prediction interval of its n_p runs' mean
        variants, spread = [[(s2 * (1 / k + 1 / paper_n), k - 1), images]], s2

    def half(level: float) -> np.ndarray:
        widest = np.max([_half_width(level, parts) for parts in variants], axis=0)
        return np.where(spread > 0, widest, np.nan)

    return d, half(EQUIVALENCE), half(DIFFERENCE)


def judge(ours: np.ndarray, paper: float | np.ndarray, paper_std: float | np.ndarray | None, paper_n: int,
          margin: float, image_sd: float | np.ndarray = 0.0, paper_decimals: int = 2) -> np.ndarray:
    """The verdict of each line of ``ours`` (trials x k seeds), :func:`intervals` read by the module's rule."""
    ours = np.atleast_2d(np.asarray(ours, dtype=float))
    d, half90, half95 = intervals(ours, paper, paper_std, paper_n, image_sd, paper_decimals)
    if ours.shape[1] < 2:
        return np.full(len(d), ONE_SEED, dtype=object)
    tested = np.where(np.abs(d) + half90 <= margin, AGREES,
                      np.where(d - half95 > 0, HIGHER, np.where(d + half95 < 0, LOWER, UNDECIDED)))
    untested = np.where(np.isnan(image_sd), UNCOUNTED, NO_SPREAD)
    return np.where(np.isnan(half95), untested, tested).astype(object)


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
    image_sd: float = 0.0  # the binomial error of the sides' different test images; 0 where both scored the same
    paper_decimals: int = 2  # the digits after the point the paper prints its std with

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
    def ours_interval(self) -> tuple[float, float] | None:
        """The 95 % interval of our mean over the seeds: mean +- t_0.975,k-1 sd / sqrt(k) (Student 1908); None
        under two seeds."""
        if len(self.ours) < 2:
            return None
        low, high = sps.t.interval(DIFFERENCE, len(self.ours) - 1, loc=self.mean,
                                   scale=self.std / np.sqrt(len(self.ours)))
        return float(low), float(high)

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval of :attr:`diff` the verdict reads (None without a result, or without a test)."""
        if not self.ours:
            return None
        d, _, half = intervals(np.asarray([self.ours]), self.paper, self.paper_std, self.paper_n, self.image_sd,
                               self.paper_decimals)
        return None if np.isnan(half[0]) else (float(d[0] - half[0]), float(d[0] + half[0]))

    @property
    def verdict(self) -> str:
        if not self.ours:
            return NO_RESULT
        if not self.comparable:
            return NOT_COMPARABLE
        return str(judge(np.asarray([self.ours]), self.paper, self.paper_std, self.paper_n, self.margin,
                         self.image_sd, self.paper_decimals)[0])


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


def scored_the_papers_images(records: list[dict], attack: str) -> bool:
    """Whether every record scored ``attack`` on the whole of its test split, as the paper did: no quick run's part
    of it (its ``subset`` note), no attack capped at N images a class (its result counts its ``images``)."""
    return all(rec.get("split", "test") == "test" and not rec.get("subset")
               and "images" not in rec["results"][attack] for rec in records)


def _image_sd(records: list[dict], attack: str, kind: str, k: int | None, paper: float, ours: list[float],
              whole_test_set: bool) -> float:
    """The binomial error that scoring other test images than the paper's adds to one number: 0 where our records
    scored the paper's (``whole_test_set``: the data is the paper's test set, and :func:`scored_the_papers_images`);
    else q (1 - q) / N over the N images our confusion matrices count (avg: all; a class: its row;
    worst: the worst class's), at q the mean of the paper's value and ours, and a spread's propagated
    (:func:`spread_sd`). Ours are a part of the paper's test set there, so the finite-population correction
    1 - N / N_paper is left out (conservative). NaN where the images differ and no confusion matrix counts them."""
    if not ours or (whole_test_set and scored_the_papers_images(records, attack)):
        return 0.0
    results = [rec["results"][attack] for rec in records]
    if not all("confusion" in r for r in results):
        return float("nan")
    rows = np.mean([np.asarray(r["confusion"], dtype=float).sum(axis=1) for r in results], axis=0)
    # an absent class's cell is null (NaN here): it has no images and is left out, as the summaries leave it out
    per_class = np.mean([np.asarray(r["per_class"], dtype=float) for r in results], axis=0)
    q = (paper + float(np.mean(ours))) / 2
    if kind in SPREAD:
        present = ~np.isnan(per_class)
        return spread_sd(kind, q, per_class[present], rows[present])
    images = rows.sum() if kind == "avg" else rows[k] if k is not None else rows[np.nanargmin(per_class)]
    return float(binomial_sd(q, images))


def compare_row(row: PaperRow, records: list[dict], comparable: bool, classes: list[str],
                runs_for: dict[str, str] | None = None, whole_test_set: bool = True) -> list[Comparison]:
    """Every number of ``row`` beside ours from ``records`` (one evaluation record per finished seed); ``runs_for``
    names the attack run for each of the paper's (the scale's; itself by default); ``whole_test_set``: the records'
    test split is the paper's whole test set (the full scale's), not a part of it (the subset scale's .npz)."""
    out = []
    for attack, number in row.numbers.items():
        ran = (runs_for or {}).get(attack, attack)
        scored = [rec for rec in records if ran in rec["results"]]
        for label, paper, k, kind in _stats(number, classes):
            ours = [v for rec in scored if (v := _ours(rec, ran, label, k)) is not None]
            out.append(Comparison(row.preset, row.row, attack, label, paper, ours, default_margin(kind, paper),
                                  "default", comparable, row.seeds,
                                  number.std.get(kind) if kind in ("avg", "worst") else None,
                                  _image_sd(scored, ran, kind, k, paper, ours, whole_test_set), number.decimals))
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
