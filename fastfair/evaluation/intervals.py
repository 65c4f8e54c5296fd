"""fastfair's statistics, in one place: intervals for per-class accuracies and the measures over them, paired
comparisons of two evaluations on the same images, and seed aggregates. Built on ``scipy.stats`` alone.

Accuracies are in percent, as everywhere in fastfair. Per-image inputs are numpy arrays: ``correct`` (bool, one per
image), ``labels`` (int class of each image, in 0..num_classes-1). A class without images (*absent*) is left out of
every measure, as :mod:`fastfair.evaluation.measures` does.

The bootstrap is stratified by class (rliable's convention, Agarwal et al. NeurIPS 2021, Sec. 4): each resample draws
each class's images with replacement from that class's own images, so every resample has the evaluated class sizes.
Resampling ``n_c`` images of a class with replacement only matters through how many of them fall in each outcome
(correct or not; for a pair of evaluations, the four joint outcomes), and those counts are Multinomial(n_c, observed
shares) (Efron & Tibshirani 1993, *An Introduction to the Bootstrap*, Sec. 6.2: the bootstrap sample is a draw from the
empirical distribution). So the resamples draw those counts directly: the same bootstrap distribution as drawing
image indices, at a cost that grows with classes, not images. ``scipy.stats.bootstrap`` has no stratified resampling,
which is why the draw is here; intervals are its ``method="percentile"`` (Efron & Tibshirani 1993, Sec. 13.3).
"""
from __future__ import annotations

import math

import numpy as np
from scipy import stats

from fastfair.evaluation.measures import cv, mcd

LEVEL = 0.95  # every interval's coverage unless a caller asks for another
RESAMPLES = 2000  # bootstrap resamples: the percentile interval's ends move by well under 0.1 of its width
BIASED_LOW = ("the worst class's interval bootstraps the minimum over classes, which is biased low: a resample's "
              "weakest class is at least as weak as the class that is weakest on average")


def class_interval(correct: int, total: int, level: float = LEVEL, method: str = "wilson") -> tuple[float, float]:
    """(lo, hi) in percent for ``correct`` of ``total`` images: Wilson's score interval (Wilson 1927, JASA 22:209,
    eq. 4; ``method="exact"``: Clopper & Pearson 1934, Biometrika 26:404), by ``scipy.stats.binomtest(...)
    .proportion_ci``; (nan, nan) for no images."""
    if total == 0:
        return (math.nan, math.nan)
    ci = stats.binomtest(int(correct), int(total)).proportion_ci(confidence_level=level, method=method)
    return (100.0 * ci.low, 100.0 * ci.high)


def confusion_intervals(confusion, level: float = LEVEL) -> np.ndarray:
    """(C, 2) Wilson (lo, hi) of each class's accuracy from a confusion matrix's counts (rows: true class; diagonal:
    correct), :func:`class_interval` row by row; NaN for an absent class."""
    m = np.asarray(confusion)
    return np.array([class_interval(int(m[c, c]), int(m[c].sum()), level) for c in range(len(m))], dtype=np.float64)


def _check(correct, labels, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    correct, labels = np.asarray(correct, dtype=bool), np.asarray(labels, dtype=np.int64)
    if correct.shape != labels.shape or correct.ndim != 1:
        raise ValueError(f"per-image correctness {correct.shape} and labels {labels.shape} must be one per image")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"labels {labels.min()}..{labels.max()} lie outside the {num_classes} classes")
    return correct, labels


def _outcome_counts(outcome: np.ndarray, labels: np.ndarray, num_classes: int, kinds: int) -> np.ndarray:
    """(C, kinds) how many images of each class have each outcome 0..kinds-1."""
    return np.bincount(labels * kinds + outcome, minlength=num_classes * kinds).reshape(num_classes, kinds)


def _resample_counts(counts: np.ndarray, seed: int, resamples: int) -> np.ndarray:
    """(resamples, C', kinds) outcome counts of stratified bootstrap resamples of the present classes' images: each
    class's counts ~ Multinomial(n_c, counts_c / n_c) (Efron & Tibshirani 1993, Sec. 6.2; see the module's note)."""
    n = counts.sum(axis=1)
    return np.random.default_rng(seed).multinomial(n, counts / n[:, None], size=(resamples, len(n)))


def _percentile(draws: np.ndarray, level: float) -> tuple[float, float]:
    """The percentile interval of bootstrap draws (Efron & Tibshirani 1993, Sec. 13.3)."""
    lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2])
    return (float(lo), float(hi))


def _measures(acc: np.ndarray) -> dict[str, np.ndarray]:
    """avg, worst, CV and MCD over the last axis (classes) of per-class accuracies (:mod:`measures`'s definitions,
    vectorised over resamples); ``overall`` is added by the caller, since it weighs classes by their images."""
    return {"avg": acc.mean(axis=-1), "worst": acc.min(axis=-1), "cv": acc.var(axis=-1),
            "mcd": acc.max(axis=-1) - acc.min(axis=-1)}


def bootstrap_measures(correct, labels, num_classes: int, *, seed: int = 0, resamples: int = RESAMPLES,
                       level: float = LEVEL) -> dict[str, tuple[float, float, float]]:
    """{"avg", "worst", "cv", "mcd", "overall"}: (point, lo, hi) from per-image correctness, a stratified bootstrap
    over the images (rliable, Agarwal et al. NeurIPS 2021, Sec. 4) with percentile intervals (Efron & Tibshirani
    1993, Sec. 13.3). The worst class's interval bootstraps the minimum, which is biased low (:data:`BIASED_LOW`)."""
    correct, labels = _check(correct, labels, num_classes)
    counts = _outcome_counts(correct.astype(np.int64), labels, num_classes, 2)
    counts = counts[counts.sum(axis=1) > 0]
    if not len(counts):
        raise ValueError("no class has images: a per-class measure needs at least one present class")
    n = counts.sum(axis=1)
    point_acc = 100.0 * counts[:, 1] / n
    draws = _resample_counts(counts, seed, resamples)[..., 1]
    boot = _measures(100.0 * draws / n)
    boot["overall"] = 100.0 * draws.sum(axis=-1) / n.sum()
    point = {"avg": float(point_acc.mean()), "worst": float(point_acc.min()), "cv": cv(point_acc),
             "mcd": mcd(point_acc), "overall": float(100.0 * counts[:, 1].sum() / n.sum())}
    return {k: (point[k], *_percentile(boot[k], level)) for k in point}


def paired_difference(correct_a, correct_b, labels, num_classes: int, *, seed: int = 0, resamples: int = RESAMPLES,
                      level: float = LEVEL) -> dict[str, tuple[float, float, float]]:
    """{"avg", "worst"}: (A minus B, lo, hi) in points for two evaluations of the same images, by a paired stratified
    bootstrap: each resample draws images, keeping each image's pair of outcomes (Efron & Tibshirani 1993, Sec. 6.2;
    rliable's stratified bootstrap, Agarwal et al. NeurIPS 2021), with percentile intervals (ibid., Sec. 13.3). Each
    side's worst class is that resample's own minimum, biased low on both sides (:data:`BIASED_LOW`)."""
    correct_a, labels = _check(correct_a, labels, num_classes)
    correct_b, _ = _check(correct_b, labels, num_classes)
    counts = _outcome_counts(2 * correct_a + correct_b, labels, num_classes, 4)  # 0: both wrong .. 3: both right
    counts = counts[counts.sum(axis=1) > 0]
    if not len(counts):
        raise ValueError("no class has images: a per-class measure needs at least one present class")
    n = counts.sum(axis=1)

    def accs(c):  # per-class accuracy of A and of B from outcome counts (..., C', 4)
        return 100.0 * (c[..., 2] + c[..., 3]) / n, 100.0 * (c[..., 1] + c[..., 3]) / n

    draws_a, draws_b = accs(_resample_counts(counts, seed, resamples))
    point_a, point_b = accs(counts)
    out = {}
    for key in ("avg", "worst"):
        boot = _measures(draws_a)[key] - _measures(draws_b)[key]
        out[key] = (float(_measures(point_a)[key] - _measures(point_b)[key]), *_percentile(boot, level))
    return out


def mcnemar_exact(correct_a, correct_b) -> float:
    """Two-sided exact p of McNemar's test (McNemar 1947, Psychometrika 12:153) on paired outcomes: the images right
    under A only, of the discordant ones, against Binomial(discordant, 1/2) (the exact conditional test, Fagerland,
    Lydersen & Laake 2013, BMC Med. Res. Methodol. 13:91, eq. 2), by ``scipy.stats.binomtest``; 1 with no discordant
    image."""
    a, b = np.asarray(correct_a, dtype=bool), np.asarray(correct_b, dtype=bool)
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    if only_a + only_b == 0:
        return 1.0
    return float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def class_mcnemar(correct_a, correct_b, labels, num_classes: int) -> np.ndarray:
    """(C,) :func:`mcnemar_exact` on each class's images (NaN for an absent class)."""
    correct_a, labels = _check(correct_a, labels, num_classes)
    correct_b, _ = _check(correct_b, labels, num_classes)
    return np.array([mcnemar_exact(correct_a[labels == c], correct_b[labels == c]) if (labels == c).any()
                     else math.nan for c in range(num_classes)])


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (Holm 1979, Scand. J. Statist. 6:65): the i-th smallest of m times
    (m - i + 1), made non-decreasing, at most 1; a NaN (no test) is left out of m and stays NaN."""
    p = np.asarray(pvalues, dtype=np.float64)
    out = np.full(p.shape, np.nan)
    known = np.flatnonzero(~np.isnan(p))
    order = known[np.argsort(p[known], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    return out


def seed_interval(values, level: float = LEVEL) -> tuple[float, float, float, float]:
    """(mean, sd, lo, hi) of one number over seeds: the sample sd (n - 1) and Student's t interval mean +- t_{n-1}
    sd / sqrt(n) (Student 1908, Biometrika 6:1), by ``scipy.stats.t``; sd and interval NaN for one seed."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        raise ValueError("no values to aggregate over seeds")
    mean = float(v.mean())
    if len(v) == 1:
        return (mean, math.nan, math.nan, math.nan)
    sd = float(v.std(ddof=1))
    half = float(stats.t.ppf((1 + level) / 2, len(v) - 1)) * sd / math.sqrt(len(v))
    return (mean, sd, mean - half, mean + half)
