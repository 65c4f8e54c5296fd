"""Checkpoint selection policies: which epoch's weights a run keeps, and which one ``train.select`` evaluates.

A policy scores the validation split's robust summary (:func:`fastfair.evaluation.measures.summary`:
avg, worst, cv, mcd, ...; accuracies in percent). The trainer keeps ``checkpoints/best_<name>.pt``
(and ``best_<name>_avg.pt`` for the EMA/FAWA model) at the highest score of every policy that has
one; a policy without a score selects ``last.pt`` (``last``) or the weights after one fixed epoch, ``epoch.pt``
(``epoch``, at ``train.select_epoch``).
"""
from __future__ import annotations

from typing import Callable, Optional

from fastfair.registry import Registry

Score = Callable[[dict], float]
SELECTION: Registry[Optional[Score]] = Registry("selection policy")


@SELECTION.register("pgd", "best average robust accuracy on the validation split (ME paper's choice)")
def best_average(summary: dict) -> float:
    return summary["avg"]


@SELECTION.register("fair", "best average + worst-class robust accuracy on the validation split (CFA's choice)")
def best_average_and_worst(summary: dict) -> float:
    return summary["avg"] + summary["worst"]


@SELECTION.register("worst", "best worst-class robust accuracy on the validation split, ties to the better average "
                             "(TRIX rebuttal Table 1's choice; FAAL's code keeps its worst_best checkpoint by it)")
def best_worst_class(summary: dict) -> float:
    # A worst class moves in steps of 100 / (its validation images) points, so epochs tie often; the average
    # decides a tie and never more (it adds at most 0.01, below one step for up to 5,000 images per class).
    return summary["worst"] + 1e-4 * summary["avg"]


SELECTION.register("last", "the last epoch")(None)
SELECTION.register("epoch", "the model after epoch train.select_epoch, kept as checkpoints/epoch.pt (Tian et al. ICLR "
                            "Sec. 3: the 75th epoch's)")(None)


def scored_policies() -> list[str]:
    """The policies that keep a ``best_<name>.pt`` (every one but ``last`` and ``epoch``)."""
    return [name for name in SELECTION if SELECTION.get(name) is not None]


def policy_scores(summary: dict) -> dict[str, float]:
    """The score of one validation summary under every policy that has a score."""
    return {name: SELECTION.get(name)(summary) for name in scored_policies()}
