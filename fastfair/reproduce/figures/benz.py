"""Benz et al. 2021 figures as ``fastfair reproduce`` targets: the pre-registration's two figures, each a grid of
four panels from one ResNet-18 on CIFAR-10 (Sec. 1), drawn from the run of the Sec. 3.1 data-set protocol's
preset that trains that model. The study prints no numbers, so nothing is compared: the figures are the result.
"""
from __future__ import annotations

import numpy as np

from fastfair.reports import figures
from fastfair.reproduce.figures.registry import FigureRuns, figure, inventory
from fastfair.reproduce.verdict import Comparison

inventory("benz", ["Fig. 1", "Fig. 2"])

ROBUST = "pgd20"  # the attack the protocol presets evaluate (the study names none)
PANELS = ("accuracy w/o (top left) and w/ (top right) the mean over classes subtracted; robustness w/o (bottom "
          "left) and w/ (bottom right)")


def _discrepancy(runs: FigureRuns, preset: str, name: str, title: str) -> list[Comparison]:
    """Per-class clean accuracy and robustness of ``preset``'s runs (mean over seeds), in the paper's 2 x 2 grid."""
    recs = runs.records[preset]
    clean, robust = (np.mean([r["results"][a]["per_class"] for r in recs], axis=0, dtype=float).tolist()
                     for a in ("clean", ROBUST))  # dtype: an absent class's null as NaN
    figures.discrepancy_grid(runs.classes, {name: (clean, robust)}, ROBUST, title, runs.png())
    return []


@figure("benz", "Fig. 1", f"inter-class discrepancy of a standard ResNet-18 on CIFAR-10: {PANELS}",
        rows=("benz-s31-datasets-cifar10-standard",))
def fig1(runs: FigureRuns) -> list[Comparison]:
    """All four panels from benz-s31-datasets-cifar10-standard (standard training, the last epoch's model)."""
    return _discrepancy(runs, "benz-s31-datasets-cifar10-standard", "standard training",
                        "Benz et al. Fig. 1: inter-class discrepancy, standard training on CIFAR-10")


@figure("benz", "Fig. 2", f"inter-class discrepancy of an adversarially trained ResNet-18 on CIFAR-10: "
                          f"{PANELS}", rows=("benz-s31-datasets-cifar10-at",))
def fig2(runs: FigureRuns) -> list[Comparison]:
    """All four panels from benz-s31-datasets-cifar10-at (PGD-AT, the last epoch's model)."""
    return _discrepancy(runs, "benz-s31-datasets-cifar10-at", "adversarial training (PGD-AT)",
                        "Benz et al. Fig. 2: inter-class discrepancy, adversarial training on CIFAR-10")
