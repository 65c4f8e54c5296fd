"""Property-based tests of every per-class measure in :mod:`fastfair.evaluation.measures` (issue 49, item 3), each
against a plain reference computed with Python loops, on degenerate inputs: one class, one image, classes without
images, all correct, all wrong, duplicated images, unbalanced classes, labels outside the classes.

Invariants (P = the classes present, those with at least one image; a_c the accuracy of class c):
  1. a_c = correct_c / images_c in percent for c in P; NaN for c not in P (never 0).
  2. min_P a <= avg <= max_P a; worst = min_P a and a[worst_class] = worst; worst <= worst10 <= worst20 <= avg;
     CV >= 0, MCD >= 0, CV = 0 iff MCD = 0 iff every a_c (c in P) is equal; CV <= MCD^2 / 4.
  3. share_correct = trace / N, and equals avg when every class in P has the same number of images.
  4. Duplicating the whole data set (every image k times) changes no measure.
  5. Permuting the classes (relabelling rows and columns) permutes the per-class results and leaves the
     summary's values unchanged.
  6. confusion_percent rows of present classes sum to 100; misclassified_counts keeps the off-diagonal and
     sums to N - trace.
  7. cvc, entropy_per_class and intra_class_variance are >= 0 per present class and NaN per absent one;
     entropy <= log C; labels outside 0..C-1 are a ValueError, never a silently longer array.
  8. class_mean_cosine is symmetric with 1 on the diagonal of present classes with a non-zero mean;
     similarity_to_others' max >= mean.
  9. rho is 0 against itself, NaN against a baseline whose worst class or average is 0.
 10. AutoAttack's per-class numbers (its worst class after each sub-attack) agree with the reference.
A summary with no present class is a ValueError: there is no number to give.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fastfair.attacks import autoattack
from fastfair.evaluation import measures

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def labelled(draw, max_classes: int = 6, max_images: int = 30):
    """(labels, predictions, C): C classes, 1..max_images images; some classes may have none, one may hold all,
    every prediction may be right or every one wrong."""
    c = draw(st.integers(1, max_classes))
    n = draw(st.integers(1, max_images))
    y = draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n))
    mode = draw(st.sampled_from(["any", "all-correct", "all-wrong"]))
    if mode == "all-correct":
        pred = list(y)
    elif mode == "all-wrong":
        pred = [(k + 1) % c for k in y] if c > 1 else list(y)
    else:
        pred = draw(st.lists(st.integers(0, c - 1), min_size=n, max_size=n))
    return np.asarray(y), np.asarray(pred), c


def confusion_of(y, pred, c) -> np.ndarray:
    m = np.zeros((c, c), dtype=np.int64)
    for t, p in zip(y, pred):
        m[t, p] += 1
    return m


def reference_accuracy(y, pred, c) -> list[float]:
    """Invariant 1 by hand: per class, correct / images in percent; NaN without images."""
    out = []
    for k in range(c):
        images = [p for t, p in zip(y, pred) if t == k]
        out.append(math.nan if not images else 100.0 * sum(p == k for p in images) / len(images))
    return out


def reference_summary(acc: list[float]) -> dict:
    present = [a for a in acc if not math.isnan(a)]
    mean = sum(present) / len(present)
    ordered = sorted(present)

    def worst_k(fraction):
        k = max(1, math.ceil(fraction * len(present)))
        return sum(ordered[:k]) / k

    return {"avg": mean, "worst": min(present), "cv": sum((a - mean) ** 2 for a in present) / len(present),
            "mcd": max(present) - min(present), "worst10": worst_k(0.1), "worst20": worst_k(0.2)}


@SETTINGS
@given(labelled())
def test_accuracy_and_summary_match_the_reference_and_their_invariants(case):
    y, pred, c = case
    conf = confusion_of(y, pred, c)
    acc = measures.per_class_accuracy(conf)
    want = reference_accuracy(y, pred, c)
    np.testing.assert_allclose(acc, want, equal_nan=True)
    assert list(measures.present(conf)) == [not math.isnan(a) for a in want]
    s, ref = measures.summary_of_confusion(conf), reference_summary(want)
    for key, value in ref.items():
        assert s[key] == pytest.approx(value, abs=1e-9), key
    eps = 1e-9
    present = acc[~np.isnan(acc)]
    assert present.min() - eps <= s["avg"] <= present.max() + eps
    assert acc[s["worst_class"]] == s["worst"]
    assert s["worst"] - eps <= s["worst10"] <= s["worst20"] + eps <= s["avg"] + 2 * eps  # means of longer prefixes
    assert s["cv"] >= 0 and s["mcd"] >= 0 and s["cv"] <= s["mcd"] ** 2 / 4 + eps
    assert (s["cv"] < eps) == (s["mcd"] < eps) == bool(np.all(present == present[0]))
    assert s["overall"] == pytest.approx(100.0 * sum(t == p for t, p in zip(y, pred)) / len(y))
    counts = np.bincount(y, minlength=c)[measures.present(conf)]
    if np.all(counts == counts[0]):  # invariant 3: balanced present classes, the two averages agree
        assert s["overall"] == pytest.approx(s["avg"])
    assert measures.json_values(acc) == [None if math.isnan(a) else a for a in acc.tolist()]


@SETTINGS
@given(labelled(), st.integers(2, 4))
def test_duplicating_every_image_changes_no_measure(case, k):
    y, pred, c = case
    once, many = confusion_of(y, pred, c), confusion_of(np.tile(y, k), np.tile(pred, k), c)
    np.testing.assert_allclose(measures.per_class_accuracy(many), measures.per_class_accuracy(once), equal_nan=True)
    assert measures.summary_of_confusion(many) == pytest.approx(measures.summary_of_confusion(once))
    np.testing.assert_allclose(measures.confusion_percent(many), measures.confusion_percent(once), equal_nan=True)


@SETTINGS
@given(labelled(), st.randoms(use_true_random=False))
def test_permuting_the_classes_permutes_the_per_class_results(case, rnd):
    y, pred, c = case
    perm = list(range(c))
    rnd.shuffle(perm)
    perm = np.asarray(perm)  # class k is called perm[k]
    conf, moved = confusion_of(y, pred, c), confusion_of(perm[y], perm[pred], c)
    acc, acc_moved = measures.per_class_accuracy(conf), measures.per_class_accuracy(moved)
    np.testing.assert_allclose(acc_moved[perm], acc, equal_nan=True)
    s, t = measures.summary_of_confusion(conf), measures.summary_of_confusion(moved)
    assert {k: v for k, v in s.items() if k != "worst_class"} == pytest.approx(
        {k: v for k, v in t.items() if k != "worst_class"})
    assert acc_moved[t["worst_class"]] == s["worst"]


@SETTINGS
@given(labelled())
def test_confusion_percent_and_misclassified_counts(case):
    y, pred, c = case
    conf = confusion_of(y, pred, c)
    pct, wrong = measures.confusion_percent(conf), measures.misclassified_counts(conf)
    for k in range(c):
        row = [p for t, p in zip(y, pred) if t == k]
        if row:
            assert pct[k].sum() == pytest.approx(100.0)
            assert pct[k] == pytest.approx([100.0 * row.count(j) / len(row) for j in range(c)])
        else:
            assert np.isnan(pct[k]).all()
    assert np.all(np.diag(wrong) == 0) and wrong.sum() == len(y) - np.trace(conf)
    assert np.array_equal(wrong + np.diag(np.diag(conf)), conf)


@st.composite
def probabilities(draw):
    """(probs (N, C) rows summing to 1, labels, features (N, 3), C)."""
    y, _, c = draw(labelled(max_images=20))
    n = len(y)
    raw = draw(st.lists(st.floats(0.01, 10.0), min_size=n * c, max_size=n * c))
    p = np.asarray(raw).reshape(n, c)
    feats = np.asarray(draw(st.lists(st.floats(-5, 5), min_size=n * 3, max_size=n * 3))).reshape(n, 3)
    return p / p.sum(axis=1, keepdims=True), y, feats, c


@SETTINGS
@given(probabilities())
def test_class_means_of_probabilities_and_features_match_the_reference(case):
    p, y, f, c = case
    cvc, ent = measures.cvc(p, y, c), measures.entropy_per_class(p, y, c)
    var = measures.intra_class_variance(f, y, c)
    for k in range(c):
        rows = [i for i in range(len(y)) if y[i] == k]
        if not rows:
            assert math.isnan(cvc[k]) and math.isnan(ent[k]) and math.isnan(var[k])
            continue
        per_image_cvc = [sum((q - sum(p[i]) / c) ** 2 for q in p[i]) / c for i in rows]
        per_image_ent = [-sum(q * math.log(q) for q in p[i]) for i in rows]
        assert cvc[k] == pytest.approx(sum(per_image_cvc) / len(rows), abs=1e-12)
        assert ent[k] == pytest.approx(sum(per_image_ent) / len(rows))
        assert 0 <= ent[k] <= math.log(c) + 1e-9 and cvc[k] >= 0 and var[k] >= -1e-12
        mean = [sum(f[i][d] for i in rows) / len(rows) for d in range(3)]
        want = sum(sum((f[i][d] - mean[d]) ** 2 for i in rows) / len(rows) for d in range(3)) / 3
        assert var[k] == pytest.approx(want, abs=1e-9)


@SETTINGS
@given(probabilities())
def test_class_mean_similarity_is_symmetric_and_its_maximum_bounds_its_mean(case):
    _, y, f, c = case
    cos = measures.class_mean_cosine(f, y, c)
    assert np.allclose(cos, cos.T)
    mu = measures.class_means(f, y, c)
    for k in range(c):
        if (y == k).any() and np.linalg.norm(mu[k]) > 1e-9:
            assert cos[k, k] == pytest.approx(1.0)
    if c > 1:
        others = measures.similarity_to_others(cos)
        assert np.all(others["max"] >= others["mean"] - 1e-12)
        assert all(others["nearest"][k] != k for k in range(c))


@SETTINGS
@given(probabilities(), st.integers(1, 5))
def test_labels_outside_the_classes_are_refused_not_a_longer_array(case, over):
    p, y, f, c = case
    bad = y.copy()
    bad[0] = c - 1 + over
    for measure in (lambda: measures.cvc(p, bad, c), lambda: measures.entropy_per_class(p, bad, c),
                    lambda: measures.intra_class_variance(f, bad, c), lambda: measures.class_means(f, bad, c)):
        with pytest.raises(ValueError, match="outside the"):
            measure()


def test_a_summary_of_no_present_class_is_refused():
    with pytest.raises(ValueError, match="no class has images"):
        measures.summary_of_confusion(np.zeros((3, 3)))


@SETTINGS
@given(st.floats(0, 100), st.floats(0, 100), st.floats(0, 100), st.floats(0, 100))
def test_rho_is_zero_against_itself_and_undefined_against_a_zero_baseline(avg, worst, base_avg, base_worst):
    if avg > 0 and worst > 0:
        assert measures.rho(avg, worst, avg, worst) == 0.0
    value = measures.rho(avg, worst, base_avg, base_worst)
    if base_avg == 0 or base_worst == 0:
        assert math.isnan(value)
    else:
        assert value == pytest.approx((worst - base_worst) / base_worst + (avg - base_avg) / base_avg)


@settings(SETTINGS, max_examples=15)  # scipy's spearmanr costs ~0.1 s a call
@given(st.lists(st.one_of(st.floats(0, 100), st.none()), min_size=3, max_size=8),
       st.lists(st.floats(0, 100), min_size=8, max_size=8))
def test_rank_correlation_skips_absent_classes(acc, other):
    a = np.asarray(acc, dtype=float)
    b = np.asarray(other[: len(a)])
    known = ~np.isnan(a)
    got, want = measures.rank_correlation(a, b), measures.rank_correlation(a[known], b[known])
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


@SETTINGS
@given(labelled(), st.integers(0, 3))
def test_autoattack_s_worst_class_after_each_sub_attack_matches_the_reference(case, k):
    """broken_by per image: ROBUST, CLEAN_WRONG or 1 + the sub-attack that broke it; a class without images is
    nobody's worst."""
    y, pred, c = case
    rng = np.random.default_rng(len(y) * 7 + c)
    broken = np.where(pred == y, autoattack.ROBUST, autoattack.CLEAN_WRONG).astype(np.int8)
    fooled = (broken == autoattack.ROBUST) & (rng.random(len(y)) < 0.5)
    broken[fooled] = 1 + rng.integers(0, 4, fooled.sum())
    worst, acc = autoattack._worst_class_after(broken, y, k, c)
    robust = [b == autoattack.ROBUST or b > 1 + k for b in broken]
    ref = [math.nan if not (y == j).any() else 100.0 * sum(r for r, t in zip(robust, y) if t == j) / (y == j).sum()
           for j in range(c)]
    assert acc == pytest.approx(np.nanmin(ref)) and ref[worst] == pytest.approx(acc)
    assert autoattack._robust_after(broken, k) == pytest.approx(100.0 * sum(robust) / len(y))
