"""The grid's comparison table: one row per grid point, seeds folded into mean +- std.

Reads only the run directories (``config.toml`` and the final evaluation's
``eval/<checkpoint>-<split>.json``). Stand-in until ``fastfair.report.compare`` lands: the grid
should then call that, so a grid and ``fastfair report`` print the same table.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .config import load_saved_text

COLUMNS = (("avg", "avg"), ("worst", "worst"), ("cv", "CV"), ("mcd", "MCD"))


def final_eval(run_dir: Path) -> dict | None:
    """The evaluation ``fastfair train`` wrote at its end (checkpoint by train.select, split by eval.split)."""
    cfg = load_saved_text((Path(run_dir) / "config.toml").read_text())
    name = "last" if cfg.train.select == "last" else f"best_{cfg.train.select}"
    path = Path(run_dir) / "eval" / f"{name}-{cfg.eval.split}.json"
    return json.loads(path.read_text())["results"] if path.is_file() else None


def mean_std(values: list[float]) -> str:
    """``mean +- std`` (sample std, ddof 1) over seeds; the bare value for one seed."""
    a = np.asarray(values, dtype=np.float64)
    return f"{a.mean():.2f}" if len(a) == 1 else f"{a.mean():.2f} ± {a.std(ddof=1):.2f}"


def comparison_table(groups: dict[str, list[Path]]) -> str:
    """Markdown: rows are grid points (label -> its seeds' run dirs); per attack avg, worst class, CV, MCD
    of per-class accuracy (%; CV in %^2)."""
    evals = {label: [r for r in map(final_eval, runs) if r is not None] for label, runs in groups.items()}
    attacks = next((list(rs[0]) for rs in evals.values() if rs), [])
    head = [f"{a} {title}" for a in attacks for _, title in COLUMNS]
    lines = ["| run | seeds | " + " | ".join(head) + " |", "|---|---:|" + "---:|" * len(head)]
    for label, results in evals.items():
        cells = [mean_std([r[a]["summary"][key] for r in results]) if results else "–"
                 for a in attacks for key, _ in COLUMNS]
        lines.append(f"| {label} | {len(results)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
