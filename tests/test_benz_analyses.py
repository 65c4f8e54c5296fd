"""Benz et al. 2021's analyses: mean-logit cosine similarity, CIFAR-100 by super-class, the worst class over
training, and the report of a standard and an adversarially trained run made through the CLI."""
import json
import math
import re

import numpy as np
import pytest
from PIL import Image

from evalreport_helpers import cifar_npz
from helpers import CIFAR10
from shared_runs import figures_unrendered
from fastfair.cli import main
from fastfair.data.superclasses import CIFAR100_SUPERCLASSES, superclass_order
from fastfair.evaluation import diagnose, measures
from fastfair.reports import figures
from fastfair.reports.report import class_order, lowest_classes, worst_class_text

# The coarse label of each fine label 0..99 as CIFAR-100's train/test files store them (Krizhevsky 2009), fine
# labels in torchvision's (alphabetical) class order: an independent record of the mapping the module holds.
COARSE_OF_FINE = [4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11, 6, 11, 5, 10, 7, 6, 13, 15, 3, 15,
                  0, 11, 1, 10, 12, 14, 16, 9, 11, 5, 5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4,
                  18, 17, 10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13, 16, 19, 2, 4, 6, 19,
                  5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13]
FINE = sorted(f for fine in CIFAR100_SUPERCLASSES.values() for f in fine)  # torchvision's CIFAR100.classes


def test_logit_similarity_matches_hand_computed_cosines_and_rank_correlations():
    # class 0's logits average to (2, 0, 0), class 1's to (1, 1, 0), class 2's to (0, 0, 3)
    logits = np.array([[3.0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 0, 3]])
    y = np.array([0, 0, 1, 2])
    out = diagnose.logit_similarity(logits, y, 3, accuracy=[40.0, 70.0, 90.0])
    r = 1 / math.sqrt(2)
    np.testing.assert_allclose(out["matrix"], [[1, r, 0], [r, 1, 0], [0, 0, 1]], atol=1e-6)
    np.testing.assert_allclose(out["max"], [r, r, 0])
    assert out["nearest"] == [1, 0, 0]  # class 2 is orthogonal to both: the first of the tie
    np.testing.assert_allclose(out["mean"], [r / 2, r / 2, 0])
    # accuracy ranks 1, 2, 3; max and mean similarity ranks 2.5, 2.5, 1: Pearson of the ranks, -1.5 / sqrt(2 * 1.5)
    rho = -math.sqrt(3) / 2
    assert out["rank_correlation"] == {"max": pytest.approx(rho), "mean": pytest.approx(rho)}
    # the features' nearest-class measure is the same cosine matrix's off-diagonal maximum
    sim, nearest = measures.inter_class_similarity(logits, y, 3)
    np.testing.assert_allclose(sim, out["max"])
    assert nearest.tolist() == out["nearest"]


def test_similarity_to_others_ignores_the_diagonal():
    cos = np.array([[1.0, -0.2, 0.4], [-0.2, 1.0, -0.6], [0.4, -0.6, 1.0]])
    got = measures.similarity_to_others(cos)
    np.testing.assert_allclose(got["max"], [0.4, -0.2, 0.4])
    np.testing.assert_allclose(got["mean"], [0.1, -0.4, -0.1])
    assert got["nearest"].tolist() == [2, 0, 0]


def test_the_super_class_mapping_is_cifar100s_coarse_labels():
    coarse = list(CIFAR100_SUPERCLASSES)
    assert len(coarse) == 20 and all(len(f) == 5 for f in CIFAR100_SUPERCLASSES.values()) and len(FINE) == 100
    assert [coarse.index(next(c for c, f in CIFAR100_SUPERCLASSES.items() if name in f)) for name in FINE] \
        == COARSE_OF_FINE


def test_super_class_order_is_a_permutation_grouping_each_coarse_label():
    shuffled = list(np.random.default_rng(0).permutation(FINE))  # any class order, e.g. an npz's own
    order, blocks = superclass_order(shuffled)
    assert sorted(order) == list(range(100))
    coarse = [COARSE_OF_FINE[FINE.index(shuffled[k])] for k in order]
    assert coarse == [c for c in range(20) for _ in range(5)]  # five of each, in coarse-label order
    assert [(b.start, b.size) for b in blocks] == [(5 * i, 5) for i in range(20)]
    assert blocks[14].name == "people" and {shuffled[k] for k in order[70:75]} == {"baby", "boy", "girl", "man",
                                                                                    "woman"}
    # CIFAR-10, a part of CIFAR-100 and a misspelt class keep their own order, without blocks
    assert superclass_order(CIFAR10) is None and superclass_order(FINE[:50]) is None
    assert superclass_order(FINE[:-1] + ["worms"]) is None
    assert class_order(CIFAR10) == (list(range(10)), None)


def test_cifar100_confusion_is_drawn_by_super_class(tmp_path, monkeypatch):
    # synthetic confusion: every class confused only with the other classes of its super-class
    coarse = np.array(COARSE_OF_FINE)
    conf = np.where(coarse[:, None] == coarse[None, :], 4.0, 0.0) + 76 * np.eye(100)
    order, blocks = class_order(FINE)
    reordered = conf[np.ix_(order, order)]
    block_diag = np.kron(np.eye(20), np.ones((5, 5))).astype(bool)
    assert (reordered[~block_diag] == 0).all() and (reordered[block_diag] > 0).all()  # 20 blocks of 5 on the diagonal
    named = []
    real_blocks = figures._blocks

    def record(ax, blks):  # the super-class names the figure writes beside the matrix
        real_blocks(ax, blks)
        named.extend(t.get_text() for t in ax.child_axes[-1].get_yticklabels())
    monkeypatch.setattr(figures, "_blocks", record)
    png = figures.heatmap(reordered, [FINE[k] for k in order], "CIFAR-100 confusion", tmp_path / "c.png",
                          blocks=blocks)
    assert len(named) == 20 and named[0] == "aquatic mammals" and named[-1] == "vehicles 2"
    assert Image.open(png).size[0] > 1000  # a page wide: 100 class names stay legible
    # Figs. 1-2's four panels stand one under the other past 20 classes, each the page's width
    acc = (np.full(100, 80.0), np.full(100, 30.0))
    w, h = Image.open(figures.discrepancy_grid(FINE, {"at": acc}, "pgd20", "t", tmp_path / "d.png")).size
    assert h > 1100 and w > 1000  # four rows: the 2 x 2 layout is some 750 px high


def test_worst_class_over_epochs_in_spans_with_ties():
    classes = ["bird", "cat", "dog", "frog", "ship"]
    acc = np.array([[10, 20, 30, 40, 50], [10, 20, 30, 40, 50]] + [[30, 5, 40, 40, 50]] * 3 + [[30, 5, 5, 40, 50]])
    assert worst_class_text([1, 2, 3, 4, 5, 6], acc, classes) == ("cat in epochs 3-5, bird in epochs 1-2, "
                                                                   "cat = dog in epoch 6")
    assert worst_class_text([1, 2], acc[2:4], classes) == "cat in every epoch (1-2)"
    assert lowest_classes([0, 0, 0, 0, 50], classes) == "4 classes at 0.0 %"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """A standard and a PGD-AT run of a width-8 tiny CNN on 20 real CIFAR-10 images a class, 2 epochs, trained,
    evaluated and diagnosed through the CLI as a user types it."""
    tmp = tmp_path_factory.mktemp("benz")
    npz = cifar_npz(tmp, train=20, test=6)
    sets = ["model.width=8", "data.val_per_class=5", "data.batch_size=50", "attack.steps=2", "train.val_attack=pgd2",
            "train.lr_milestones=[]", 'eval.attacks=["clean", "pgd2"]']
    runs = {}
    for method in ("standard", "pgd-at"):
        runs[method] = tmp / method
        assert main(["train", "--method", method, "--dataset", "npz", "--data-dir", str(npz), "--model", "tiny-cnn",
                     "--epochs", "2", "--device", "cpu", "--out", str(runs[method]), "--quiet",
                     *(a for s in sets for a in ("--set", s))]) == 0
    assert main(["diagnose", str(runs["pgd-at"]), "--attack", "pgd2", "--tsne", "0", "--device", "cpu"]) == 0
    return tmp, runs


def _png_ok(path) -> bool:
    return path.is_file() and min(Image.open(path).size) > 200


@pytest.mark.slow
def test_diagnose_writes_the_mean_logit_similarity(two_runs, capsys):
    _, runs = two_runs
    d = json.loads((runs["pgd-at"] / "diagnostics" / "best_pgd-test-pgd2.json").read_text())
    for tag in ("clean", "adv"):
        sim = d["logit_similarity"][tag]
        m = np.asarray(sim["matrix"])
        assert m.shape == (10, 10) and np.allclose(m, m.T) and np.allclose(np.diag(m), 1, atol=1e-5)
        off = np.where(np.eye(10, dtype=bool), -np.inf, m)
        np.testing.assert_allclose(sim["max"], off.max(1), atol=1e-5)
        rho = measures.rank_correlation(sim["max"], d["accuracy"][tag])
        assert sim["rank_correlation"]["max"] == pytest.approx(rho, nan_ok=True)


@pytest.mark.slow
def test_report_of_a_standard_and_an_adversarial_run(two_runs, capsys, monkeypatch):
    tmp, runs = two_runs
    out = tmp / "report"
    checked = ("discrepancy", "g0-class-curves", "g1-class-curves", "g1-logit-similarity",
               "g1-logit-similarity-vs-accuracy", "g0-confusion")
    figures_unrendered(monkeypatch, render=[f"{name}.png" for name in checked])  # the report's others: unchecked
    assert main(["report", str(runs["standard"]), str(runs["pgd-at"]), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    for name in checked:
        assert f"figures/{name}.png" in md and _png_ok(out / "figures" / f"{name}.png"), name
    assert "(Benz et al. 2021, Figs. 1-2)" in md
    assert re.search(r"Spread over classes, max − min in points \(MCD; over seeds their mean ± sd\) with its 95 % "
                     r"interval, and the worst class of the mean over seeds: standard: clean [\d.]+ \[[\d.]+, [\d.]+\] "
                     r"\(worst .+\), pgd2 [\d.]+ \[[\d.]+, [\d.]+\] \(worst .+\); pgd-at: clean", md)
    # the worst class at each of the two epochs, under both validations, for each run
    assert len(re.findall(r"Worst class on the validation split at each epoch: clean: .+ in (every epoch \(1-2\)|"
                          r"epochs? [12]).*; pgd2: .+ in (every epoch \(1-2\)|epochs? [12])", md)) == 2
    assert "#### Cross-class similarity of mean logit vectors" in md and "| cat |" in md
    assert "Spearman rank correlation of a class's similarity to the other classes with its accuracy" in md
    assert "classes grouped by CIFAR-100 super-class" not in md  # CIFAR-10 keeps its order


def test_a_report_without_a_clean_evaluation_says_why_it_lacks_the_discrepancy_figure(tmp_path):
    from test_report import _fake_run

    run = _fake_run(tmp_path / "at", 0, "pgd-at", [80, 60], [50, 30])
    rec = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    del rec["results"]["clean"]
    (run / "eval" / "best_pgd-test.json").write_text(json.dumps(rec))
    assert main(["report", str(run), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert ("No inter-class discrepancy figure (Benz et al. Figs. 1-2): at lacks a clean evaluation; run: fastfair "
            "eval RUN_DIR --attacks clean.") in md
