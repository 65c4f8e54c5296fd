import numpy as np
import pytest

from fastfair.evaluation import measures

CONF = np.array([[8, 2, 0], [1, 4, 5], [0, 0, 10]])  # rows: true class


def test_per_class_accuracy_from_confusion():
    assert measures.per_class_accuracy(CONF).tolist() == pytest.approx([80.0, 40.0, 100.0])


def test_summary_by_hand():
    s = measures.summary([80.0, 40.0, 100.0])
    mean = 220 / 3
    assert s["avg"] == pytest.approx(mean)
    assert s["worst"] == 40.0 and s["worst_class"] == 1
    assert s["cv"] == pytest.approx(((80 - mean) ** 2 + (40 - mean) ** 2 + (100 - mean) ** 2) / 3)
    assert s["mcd"] == 60.0
    assert s["worst20"] == 40.0


def test_worst_k_mean_rounds_up():
    acc = list(range(10, 110, 10))  # 10 classes
    assert measures.worst_k_mean(acc, 0.2) == 15.0
    assert measures.worst_k_mean(acc, 0.05) == 10.0


def test_markdown_table_lists_every_class_and_summary():
    res = {"clean": {"per_class": [80.0, 40.0, 100.0], "summary": measures.summary([80.0, 40.0, 100.0])}}
    table = measures.markdown_table(res, ["cat", "dog", "ship"])
    assert "| dog | 40.00 |" in table and "| **worst class** | 40.00 |" in table and "MCD" in table


def test_both_averages_differ_on_an_unbalanced_split_and_are_labelled():
    s = measures.summary_of_confusion(CONF)  # 10, 10 and 10 images: balanced, the two averages agree
    assert s["overall"] == pytest.approx(s["avg"]) == pytest.approx(220 / 3)
    unbalanced = np.array([[90, 10], [5, 5]])  # 90% of 100 and 50% of 10
    s = measures.summary_of_confusion(unbalanced)
    assert s["avg"] == pytest.approx(70.0) and s["overall"] == pytest.approx(100 * 95 / 110)
    table = measures.markdown_table({"pgd20": {"per_class": [90.0, 50.0], "summary": s}}, ["cat", "dog"])
    assert "| **mean of per-class accuracies** | 70.00 |" in table
    assert f"| **share of images correct** | {100 * 95 / 110:.2f} |" in table
