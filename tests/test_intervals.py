"""fastfair.evaluation.intervals against values known from their sources or from a closed form."""
import math
import time

import numpy as np
import pytest
from scipy import stats

from fastfair.evaluation import intervals


def test_wilson_7_of_10_matches_the_textbook_value():
    # Wilson's score interval (Wilson 1927, eq. 4) written out: centre (k + z²/2) / (n + z²), half-width
    # z / (n + z²) sqrt(n p (1 - p) + z²/4); for 7/10 at 95 % the textbook 0.3968-0.8922
    z = stats.norm.ppf(0.975)
    centre, half = (7 + z * z / 2) / (10 + z * z), z / (10 + z * z) * math.sqrt(10 * 0.7 * 0.3 + z * z / 4)
    lo, hi = intervals.class_interval(7, 10)
    assert (lo, hi) == pytest.approx((100 * (centre - half), 100 * (centre + half)), abs=1e-9)
    assert (round(lo, 2), round(hi, 2)) == (39.68, 89.22)


def test_clopper_pearson_of_none_correct_is_the_closed_form():
    # 0 of n: the exact upper end solves (1 - p)^n = alpha / 2
    lo, hi = intervals.class_interval(0, 10, method="exact")
    assert lo == 0 and hi == pytest.approx(100 * (1 - 0.025 ** (1 / 10)), abs=1e-9)  # 30.85 %


def test_no_images_has_no_interval():
    assert all(math.isnan(v) for v in intervals.class_interval(0, 0))


def test_confusion_intervals_are_each_rows_wilson():
    m = np.array([[7, 3, 0], [0, 0, 0], [1, 1, 8]])
    ci = intervals.confusion_intervals(m)
    assert ci[0] == pytest.approx(intervals.class_interval(7, 10))
    assert np.isnan(ci[1]).all()
    assert ci[2] == pytest.approx(intervals.class_interval(8, 10))


def test_mcnemar_exact_matches_the_binomial_of_the_discordant_pairs():
    # 10 discordant pairs, 8 favouring A: p = 2 * P(X >= 8), X ~ Bin(10, 1/2) = 2 * 56 / 1024
    a = np.array([1] * 8 + [0] * 2 + [1] * 5 + [0] * 5, dtype=bool)
    b = np.array([0] * 8 + [1] * 2 + [1] * 5 + [0] * 5, dtype=bool)
    assert intervals.mcnemar_exact(a, b) == pytest.approx(112 / 1024)
    assert intervals.mcnemar_exact(a, a) == 1.0


def test_class_mcnemar_tests_each_class_on_its_own_images():
    a = np.array([1, 1, 1, 0, 1, 1], dtype=bool)
    b = np.array([0, 0, 0, 0, 1, 1], dtype=bool)
    p = intervals.class_mcnemar(a, b, np.array([0, 0, 0, 0, 2, 2]), 3)
    assert p[0] == pytest.approx(0.25) and math.isnan(p[1]) and p[2] == 1.0


def test_holm_adjusts_step_down_and_skips_classes_without_a_test():
    # Holm 1979: sorted 0.01, 0.02, 0.04 of m = 3 -> 0.03, 0.04, 0.04 (made non-decreasing)
    adjusted = intervals.holm([0.04, float("nan"), 0.01, 0.02])
    assert adjusted[[0, 2, 3]] == pytest.approx([0.04, 0.03, 0.04]) and math.isnan(adjusted[1])
    assert intervals.holm([0.5, 0.6]).tolist() == [1.0, 1.0]


def test_bootstrap_of_one_class_is_the_binomial_of_its_images():
    # one class: a resample's accuracy is Bin(n, p_hat) / n, so the percentile interval is the binomial's quantiles
    n, k = 200, 130
    correct, labels = np.arange(n) < k, np.zeros(n, dtype=int)
    out = intervals.bootstrap_measures(correct, labels, 1, resamples=20000)
    point, lo, hi = out["avg"]
    assert point == 65.0 and out["worst"] == out["avg"] and out["cv"][0] == 0
    assert lo == pytest.approx(100 * stats.binom.ppf(0.025, n, k / n) / n, abs=0.6)  # one image is 0.5 points
    assert hi == pytest.approx(100 * stats.binom.ppf(0.975, n, k / n) / n, abs=0.6)


def test_bootstrap_worst_is_the_minimum_of_classes_and_biased_low():
    # class 0 always right, class 1 right on 60 of 100: the worst class is class 1 in every resample, so its
    # interval is class 1's binomial one; with two equal classes the minimum of two draws sits below either
    labels = np.repeat([0, 1], 100)
    correct = np.concatenate([np.ones(100, bool), np.arange(100) < 60])
    out = intervals.bootstrap_measures(correct, labels, 2, resamples=20000)
    assert out["worst"][1] == pytest.approx(100 * stats.binom.ppf(0.025, 100, 0.6) / 100, abs=1.1)
    equal = intervals.bootstrap_measures(np.tile(np.arange(100) < 60, 2), labels, 2, resamples=4000)
    point, lo, hi = equal["worst"]
    assert point == 60 and (lo + hi) / 2 < point - 1  # biased low, as the docstring says


def test_bootstrap_is_seeded_and_leaves_absent_classes_out():
    rng = np.random.default_rng(1)
    labels, correct = rng.integers(0, 3, 300), rng.random(300) < 0.7  # class 3 of 4 absent
    a = intervals.bootstrap_measures(correct, labels, 4, seed=5)
    assert a == intervals.bootstrap_measures(correct, labels, 4, seed=5)
    assert a != intervals.bootstrap_measures(correct, labels, 4, seed=6)
    acc = [100 * correct[labels == c].mean() for c in range(3)]
    assert a["avg"][0] == pytest.approx(np.mean(acc)) and a["worst"][0] == pytest.approx(min(acc))
    for point, lo, hi in a.values():
        assert lo <= point <= hi


def test_bootstrap_draws_like_resampling_image_indices():
    # the counts shortcut has the distribution of the textbook resampling of images within each class
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(3), [30, 50, 20])
    correct = rng.random(100) < np.array([0.5, 0.8, 0.3])[labels]
    idx = [np.flatnonzero(labels == c) for c in range(3)]
    by_index = []
    for _ in range(4000):
        acc = [100 * correct[rng.choice(i, len(i))].mean() for i in idx]
        by_index.append(min(acc))
    lo, hi = np.quantile(by_index, [0.025, 0.975])
    out = intervals.bootstrap_measures(correct, labels, 3, resamples=4000)
    assert out["worst"][1:] == pytest.approx((lo, hi), abs=2.5)  # a class of 20 moves in 5-point steps


def test_paired_difference_of_identical_runs_is_zero_and_a_shift_is_seen():
    rng = np.random.default_rng(2)
    labels = np.repeat(np.arange(4), 250)
    a = rng.random(1000) < 0.6
    same = intervals.paired_difference(a, a, labels, 4)
    assert same == {"avg": (0.0, 0.0, 0.0), "worst": (0.0, 0.0, 0.0)}
    b = a & (rng.random(1000) < 0.8)  # B loses a fifth of A's right answers, nothing else
    diff = intervals.paired_difference(a, b, labels, 4)
    point, lo, hi = diff["avg"]
    assert point == pytest.approx(100 * (a.mean() - b.mean())) and 0 < lo < point < hi
    # paired: narrower than either run's own interval (an unpaired difference would be about 1.4 times wider)
    own = intervals.bootstrap_measures(a, labels, 4)["avg"]
    assert hi - lo < 0.7 * (own[2] - own[1])


def test_seed_interval_is_students_t():
    mean, sd, lo, hi = intervals.seed_interval([1.0, 2.0, 3.0])
    half = stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)  # 4.303 * 1 / sqrt 3
    assert (mean, sd) == (2.0, 1.0) and (lo, hi) == pytest.approx((2 - half, 2 + half))
    one = intervals.seed_interval([5.0])
    assert one[0] == 5.0 and all(math.isnan(v) for v in one[1:])


def test_bootstrap_of_ten_thousand_images_takes_well_under_a_second():
    rng = np.random.default_rng(0)
    labels, correct = rng.integers(0, 10, 10_000), rng.random(10_000) < 0.5
    start = time.process_time()
    intervals.bootstrap_measures(correct, labels, 10)
    intervals.paired_difference(correct, ~correct, labels, 10)
    assert time.process_time() - start < 0.5
