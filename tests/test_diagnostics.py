"""Each diagnostic against a hand-computed answer on constructed inputs."""
import math

import numpy as np
import pytest
import torch

from fastfair.evaluation import measures as dg


def test_confusion_percent_and_misclassified_counts():
    conf = np.array([[3, 1, 0], [0, 0, 0], [2, 2, 4]])
    nan = np.nan  # class 1 has no images: its row is undefined, not 0 % of everything
    np.testing.assert_allclose(dg.confusion_percent(conf), [[75, 25, 0], [nan, nan, nan], [25, 25, 50]])
    np.testing.assert_array_equal(dg.misclassified_counts(conf), [[0, 1, 0], [0, 0, 0], [2, 2, 0]])


def test_cvc_one_hot_and_uniform():
    # class 0: one one-hot image (variance ((1/2)^2 + (1/2)^2)/2 = 1/4) and one uniform image (0) -> 1/8
    # class 1: one one-hot image -> 1/4
    probs = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.0, 1.0]])
    y = torch.tensor([0, 0, 1])
    np.testing.assert_allclose(dg.cvc(probs, y, 2), [0.125, 0.25])


def test_inter_class_similarity_and_nearest_class():
    # class means (1, 0), (1, 1), (0, 1): cos 1/sqrt 2 between neighbours, 0 between the ends
    feats = np.array([[1.0, 0.0], [1.0, 0.0], [2.0, 2.0], [0.0, 3.0]])
    y = np.array([0, 0, 1, 2])
    sim, nearest = dg.inter_class_similarity(feats, y, 3)
    np.testing.assert_allclose(sim, [1 / math.sqrt(2)] * 3)
    assert nearest[0] == 1 and nearest[2] == 1 and nearest[1] in (0, 2)


def test_intra_class_variance_is_mean_per_dimension_variance():
    feats = np.array([[0.0, 0.0], [2.0, 4.0], [5.0, 5.0]])
    y = np.array([0, 0, 1])
    np.testing.assert_allclose(dg.intra_class_variance(feats, y, 2), [(1.0 + 4.0) / 2, 0.0])


def test_weight_norms_and_rank_correlation():
    np.testing.assert_allclose(dg.weight_norms(torch.tensor([[3.0, 4.0], [0.0, 1.0]])), [5.0, 1.0])
    assert dg.rank_correlation([1, 2, 3, 4], [10, 20, 25, 90]) == pytest.approx(1.0)
    assert dg.rank_correlation([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert dg.rank_correlation([1, 2, 3], [1, 3, 2]) == pytest.approx(0.5)  # 1 - 6*2/(3*8)
    assert math.isnan(dg.rank_correlation([1, 2, 3], [5, 5, 5]))


def test_entropy_uniform_and_one_hot():
    probs = np.array([[0.25] * 4, [1.0, 0, 0, 0], [0.5, 0.5, 0, 0]])
    np.testing.assert_allclose(dg.prediction_entropy(probs), [math.log(4), 0.0, math.log(2)])
    np.testing.assert_allclose(dg.entropy_per_class(probs, np.array([0, 0, 1]), 2), [math.log(4) / 2, math.log(2)])


def test_rho_relative_worst_gain_plus_relative_average_change():
    assert dg.rho(avg=50.0, worst=30.0, base_avg=40.0, base_worst=20.0) == pytest.approx(0.5 + 0.25)
    assert dg.rho(avg=38.0, worst=20.0, base_avg=40.0, base_worst=20.0) == pytest.approx(-0.05)
    assert math.isnan(dg.rho(avg=38.0, worst=20.0, base_avg=40.0, base_worst=0.0))


def test_tsne_keeps_separated_clusters_apart():
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.normal(0, 0.1, (15, 8)), rng.normal(10, 0.1, (15, 8))])
    clean, adv = dg.tsne(a, a + 0.01, seed=0)
    assert clean.shape == adv.shape == (30, 2)
    within = np.linalg.norm(clean[:15] - clean[:15].mean(0), axis=1).max()
    between = np.linalg.norm(clean[:15].mean(0) - clean[15:].mean(0))
    assert between > 3 * within
