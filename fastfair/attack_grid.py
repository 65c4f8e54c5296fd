"""Attack names that stand for a grid: ``tpgdK@grid`` is Temperature-PGD-K over Tian et al.'s 1/T grid.

Tian et al. (KDD 2021, Sec. 5, 'Overall results') search 1/T in {2, 5, 10, 50} and report the
best attack, i.e. the temperature giving the lowest robust accuracy. ``tpgd20@grid`` expands
into ``tpgd20@t0.5``, ``@t0.2``, ``@t0.1`` and ``@t0.02`` (the parser takes T, not 1/T), and
:func:`add_best` adds a ``tpgd20@grid`` entry equal to the one with the lowest average.
"""
from __future__ import annotations

import re

INVERSE_TEMPERATURES = (2, 5, 10, 50)  # Tian et al. KDD 2021, Sec. 5: grid search over 1/T
_GRID = re.compile(r"^tpgd(?P<steps>\d*)@grid$")


def members(name: str) -> list[str]:
    """The attack names a (grid) name stands for; a plain name stands for itself."""
    m = _GRID.match(name)
    if not m:
        return [name]
    return [f"tpgd{m['steps']}@t{1 / it:g}" for it in INVERSE_TEMPERATURES]


def expand(names: list[str]) -> list[str]:
    """All names to run, grids expanded, each once, in order."""
    return list(dict.fromkeys(n for name in names for n in members(name)))


def add_best(results: dict[str, dict], names: list[str]) -> None:
    """For each grid name, add the member entry with the lowest average accuracy, naming it in ``chosen``."""
    for name in names:
        group = members(name)
        if group == [name]:
            continue
        best = min(group, key=lambda n: results[n]["summary"]["avg"])
        results[name] = {**results[best], "chosen": best, "inverse_temperature": round(1 / float(best.split("@t")[1]), 6)}
