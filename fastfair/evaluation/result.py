"""A per-class evaluation result as Python sees it: the record ``fastfair eval`` writes, with its measures.

``print(result)`` shows the per-class table with every number's 95 % interval; the methods ``result.avg("pgd20")``,
``worst``, ``cv``, ``mcd`` and ``overall`` (each takes an attack's name) read the summary each attack's entry already
holds (:func:`measures.summary_of_confusion`), so a result read back from a JSON gives the same numbers as the run
that wrote it; ``result.interval("pgd20", "worst")`` its interval.
"""
from __future__ import annotations

from pathlib import Path

from fastfair.errors import UserError
from fastfair.evaluation import measures, per_image
from fastfair.rundir import read_json, write_json_atomic


class Result:
    """Per-class accuracies (percent) under each attack, and the fingerprints of the weights, data and settings."""

    def __init__(self, record: dict):
        self.record = record

    @classmethod
    def load(cls, path: str | Path) -> Result:
        """Read a JSON written by ``fastfair eval``, ``fastfair.evaluate`` or :meth:`save`."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"no result file at {path}")
        record = read_json(path, "delete it and evaluate again")
        if not isinstance(record, dict) or "results" not in record or "classes" not in record:
            raise UserError(f"{path} is not a per-class result (no 'results' and 'classes'); pass a JSON written by "
                            "fastfair eval or fastfair.evaluate")
        return cls(record)

    def save(self, path: str | Path) -> Path:
        """Write the record as JSON (atomically); :meth:`load` and ``fastfair report`` read it back."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic({k: v for k, v in self.record.items() if k != "path"}, path)
        return path

    @property
    def classes(self) -> list[str]:
        return list(self.record["classes"])

    @property
    def attacks(self) -> list[str]:
        return list(self.record["results"])

    def _entry(self, attack: str) -> dict:
        try:
            return self.record["results"][attack]
        except KeyError:
            raise UserError(f"no {attack!r} in this result; it holds {', '.join(self.attacks)}") from None

    @property
    def absent_classes(self) -> list[str]:
        """The classes without images in the evaluated data: None in :meth:`per_class`, left out of every summary."""
        return list(self.record.get("absent_classes", []))  # a record before the key: none was absent, or it says 0

    def per_class(self, attack: str) -> dict[str, float | None]:
        """{class name: accuracy in percent} under ``attack`` (``clean`` for clean accuracy); None for an absent
        class."""
        return dict(zip(self.classes, self._entry(attack)["per_class"]))

    def avg(self, attack: str) -> float:
        """Mean of the per-class accuracies (percent) of the classes present."""
        return self._entry(attack)["summary"]["avg"]

    def overall(self, attack: str) -> float:
        """Share of all images correct (percent); equals :meth:`avg` on a balanced test set."""
        return self._entry(attack)["summary"]["overall"]

    def worst(self, attack: str) -> tuple[str, float]:
        """(name, accuracy in percent) of the worst class."""
        summary = self._entry(attack)["summary"]
        return self.classes[summary["worst_class"]], summary["worst"]

    def cv(self, attack: str) -> float:
        """Variance of the per-class accuracies, %² (Tian et al.'s "CV"; see measures.CV_NOTE)."""
        return self._entry(attack)["summary"]["cv"]

    def mcd(self, attack: str) -> float:
        """Best minus worst class accuracy, percent (Tian et al.'s MCD)."""
        return self._entry(attack)["summary"]["mcd"]

    def gradient_masked(self, attack: str) -> int | None:
        """How many images had an input gradient holding a NaN or inf at some step of ``attack`` (AutoAttack: at the
        clean image, before it ran), which stalls it there, so that its accuracy may overstate the robustness; None
        where the attack takes no gradient (clean, nattack, corruptions) or the record predates the count."""
        return self._entry(attack).get(measures.MASKED)

    def interval(self, attack: str, measure: str) -> tuple[float, float] | None:
        """(lo, hi) in percent (CV: %²) of ``measure`` under ``attack``: ``avg``, ``overall``, ``worst``, ``cv``,
        ``mcd`` (a stratified bootstrap over the images), or a class's name (Wilson's interval of its counts), at
        95 %; None where the record cannot give one (an older fastfair's record lacks the per-image results that the
        worst class, CV and MCD need; see :mod:`fastfair.evaluation.per_image`)."""
        entry = per_image.with_intervals({attack: self._entry(attack)})[attack]
        if measure in self.classes:
            ci = entry["per_class_interval"][self.classes.index(measure)]
        elif measure in per_image.SUMMARY_KEYS:
            ci = entry["summary_interval"][measure]
        else:
            raise UserError(f"no measure {measure!r}; name one of {', '.join(per_image.SUMMARY_KEYS)} or a class")
        return None if ci is None else (ci[0], ci[1])

    def confusion(self, attack: str):
        """(C, C) counts as a numpy array, rows true class, columns prediction after ``attack``."""
        import numpy as np
        return np.asarray(self._entry(attack)["confusion"])

    def to_pandas(self):
        """A DataFrame: one row per class, one column per attack (accuracy in percent); needs pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise UserError("Result.to_pandas needs pandas: pip install 'fastfair[pandas]' (or pip install "
                            "pandas)") from None
        return pd.DataFrame({a: self._entry(a)["per_class"] for a in self.attacks},
                            index=pd.Index(self.classes, name="class"))

    def __str__(self) -> str:
        results = per_image.with_intervals(self.record["results"])
        return "\n\n".join([measures.markdown_table(results, self.classes), *per_image.table_notes(results)])

    def __repr__(self) -> str:
        parts = ", ".join(f"{a} {self.avg(a):.2f} (worst {self.worst(a)[1]:.2f}"
                          + (f", gradient masked on {self.gradient_masked(a)} images)" if self.gradient_masked(a)
                             else ")") for a in self.attacks)
        return f"<fastfair Result: {self.record.get('images', '?')} images, {len(self.classes)} classes; {parts}>"
