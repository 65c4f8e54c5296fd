"""Each number the paper reports beside ours: the difference, our seed mean and std, and a verdict.

A number agrees when |our seed mean - the paper's| <= the tolerance: the paper's std for that
number where it gives one, else :data:`DEFAULT_TOLERANCE` (percentage points). Worst-class and
single-class accuracies get a wider default than averages because they move by several points
between neighbouring checkpoints and seeds (CFA Sec. 3.3 measures it), while an average over
10,000 test images moves by well under one. The class-wise spread (Tian et al.'s CV, a variance in % squared,
and MCD, best minus worst class) gets :data:`CV_TOLERANCE` of the paper's CV and :data:`DEFAULT_TOLERANCE`
``mcd`` points: with every class's accuracy a few points off between seeds, a CV moves by about
2 sqrt(CV / C) x that (CIFAR-10's 284: about 20, 7 %), an MCD by the sum of two classes' moves.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fastfair.evaluation.measures import cv, mcd, rho
from fastfair.reproduce.paper import SPREAD, Number, PaperRow

DEFAULT_TOLERANCE = {"avg": 1.0, "worst": 3.0, "class": 3.0, "mcd": 5.0}
CV_TOLERANCE = 0.25  # of the paper's CV, and at least 1 (% squared): near 0 the seeds' own noise dominates
NOT_COMPARABLE = "not comparable to the paper"


@dataclass(frozen=True)
class Comparison:
    preset: str
    row: str
    attack: str
    stat: str  # avg | worst | a class name
    paper: float
    ours: list[float]  # one value per seed that finished
    tolerance: float
    tolerance_from: str  # "paper std" | "default"
    comparable: bool

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
    def verdict(self) -> str:
        if not self.ours:
            return "no result"
        if not self.comparable:
            return NOT_COMPARABLE
        if abs(self.diff) <= self.tolerance:
            return "agrees"
        return "higher" if self.diff > 0 else "lower"


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


def tolerance(kind: str, paper: float) -> float:
    """The default tolerance of a number of ``kind`` (avg, worst, class, cv, mcd) whose paper value is ``paper``."""
    return max(CV_TOLERANCE * paper, 1.0) if kind == "cv" else DEFAULT_TOLERANCE[kind]


def compare_row(row: PaperRow, records: list[dict], comparable: bool, classes: list[str],
                runs_for: dict[str, str] | None = None) -> list[Comparison]:
    """Every number of ``row`` beside ours from ``records`` (one evaluation record per finished seed); ``runs_for``
    names the attack run for each of the paper's (the scale's; itself by default)."""
    out = []
    for attack, number in row.numbers.items():
        ran = (runs_for or {}).get(attack, attack)
        for label, paper, k, kind in _stats(number, classes):
            std = number.std.get(kind) if kind in ("avg", "worst") else None
            ours = [v for rec in records if ran in rec["results"] if (v := _ours(rec, ran, label, k)) is not None]
            out.append(Comparison(row.preset, row.row, attack, label, paper, ours,
                                  std if std is not None else tolerance(kind, paper),
                                  "paper std" if std is not None else "default", comparable))
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
