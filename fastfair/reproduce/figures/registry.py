"""Paper figures (and tables that need more than per-row accuracies) as ``fastfair reproduce`` targets.

A figure is a target like a table: its rows are the presets whose ``[paper]`` section names it
(``figure = "3(b)"``: Fig. 3, key ``me-f3``) plus the presets its registration reuses (``rows``: a table's
runs, e.g. Tian et al.'s Madry row for the class-wise curves over training). ``reproduce`` plans, runs and
resumes them as a table's, compares each row's own ``[paper]`` numbers as a table does, then calls the
figure's drawer. The drawer reads the finished runs through :class:`FigureRuns`, draws the paper's plot (same
axes, same classes, same kind of plot) into ``runs.png(...)``, and returns every other number the paper's
text or plot states beside ours (:meth:`FigureRuns.number`), which get the tables' verdicts.

Each paper's module (``me.py``, ``cfa.py``, ...) registers its figures with :func:`figure`, what cannot run
here with :func:`pending` (the reason and the exact route to run it), and its whole list of tables and
figures with numbers or plots of measured results with :func:`inventory`, from which ``coverage`` writes
docs/reproduce.md's coverage table.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from fastfair.config import Config, load_run
from fastfair.evaluation.per_class import evaluate_checkpoint
from fastfair.reproduce.verdict import Comparison, binomial_sd, default_margin
from fastfair.rundir import RunDir

ITEM = re.compile(r"(Table|Fig\.) (\d+)")  # how an inventory names a paper's table or figure


def item_key(source: str, item: str) -> str:
    """``("me", "Fig. 3")`` -> ``me-f3``; ``("tian-kdd", "Table 4")`` -> ``tian-kdd-t4``."""
    m = ITEM.fullmatch(item)
    if not m:
        raise ValueError(f"{source}: an item is 'Table N' or 'Fig. N'; got {item!r}")
    return f"{source}-{'t' if m[1] == 'Table' else 'f'}{m[2]}"


def figure_number(figure: str) -> str:
    """A preset's ``figure = "3(b)"`` -> ``"3"``: a panel belongs to its figure's target."""
    m = re.match(r"\d+", figure)
    if not m:
        raise ValueError(f"a figure is numbered as the paper numbers it ('3', '3(b)'); got {figure!r}")
    return m[0]


@dataclass
class FigureRuns:
    """What a drawer reads and where it writes: the finished runs of the figure's rows, by preset, in seed order."""

    key: str
    out: Path  # the target's folder (reproduce's --out)
    scale: str
    comparable: bool  # False at a scale that is not the paper's or with --set: verdicts say "not comparable"
    classes: list[str]
    runs: dict[str, list[Path]]  # preset -> the run folders that finished, seed order
    records: dict[str, list[dict]]  # preset -> their evaluation records (eval/<checkpoint>-test.json)
    gpus: str = "auto"  # for a drawer that runs more work (an attack, a diagnosis) on the finished runs
    echo: Callable[[str], None] = print
    pngs: list[Path] = field(default_factory=list)  # what png() handed out, for the report

    @property
    def device(self) -> str:
        """Where a drawer's own work (an attack, a diagnosis) runs: the CPU under ``--gpus cpu``, as the runs did."""
        return "cpu" if self.gpus == "cpu" else "auto"

    def png(self, panel: str = "") -> Path:
        """The path of the figure's PNG (``<key>.png``, or ``<key>-<panel>.png``), recorded for the report."""
        path = self.out / f"{self.key}{'-' + panel if panel else ''}.png"
        self.pngs.append(path)
        return path

    def config(self, preset: str, seed: int = 0) -> Config:
        """The saved config of ``preset``'s finished run ``seed`` (its place in :attr:`runs`, as in :attr:`records`):
        how every drawer reads a run's settings; its results are :attr:`records` and :meth:`results`."""
        return load_run(self.runs[preset][seed])

    def history(self, preset: str) -> list[list[dict]]:
        """Each finished seed's ``metrics.jsonl``: one dict per epoch (lr, loss, per-class val accuracies, ...)."""
        return [RunDir(run).read_metrics() for run in self.runs.get(preset, [])]  # each line's checksum checked

    def results(self, preset: str, attack: str) -> list[dict]:
        """Each finished seed's result under ``attack`` (per_class, confusion, ...): its evaluation record's, else
        ``fastfair eval``'s of the checkpoint that record is of, which adds it to the run's record for the next
        drawing (``reproduce`` runs only the attacks a row's own numbers need; a figure may plot another)."""
        records = self.records[preset]
        for k, (run, rec) in enumerate(zip(self.runs[preset], records)):
            if attack in rec["results"]:
                continue
            # by name in the run folder: the record's path is as the run was started, maybe relative to elsewhere
            ckpt = run / "checkpoints" / Path(rec["checkpoint"]).name
            if not ckpt.is_file():  # a released model's row: reproduce evaluates it under the row's attacks only
                raise ValueError(f"{self.key}: {preset} has no {attack} result and no checkpoint of its own to "
                                 f"evaluate ({rec['checkpoint']}); name {attack} in the row's attacks")
            # long work (AutoAttack: minutes a model on a CPU) says what it is before it starts
            self.echo(f"{self.key}: evaluate {run.name}'s {ckpt.name} under {attack} (the figure plots it; its row's "
                      "record lacks it)")
            records[k] = evaluate_checkpoint(ckpt, attacks=[attack], split=rec["split"], quiet=True,
                                             device=self.device)
        return [rec["results"][attack] for rec in records]

    def per_class(self, preset: str, attack: str) -> np.ndarray:
        """(seeds, classes): each finished seed's per-class accuracy under ``attack``, % (:meth:`results`)."""
        return np.asarray([r["per_class"] for r in self.results(preset, attack)], dtype=float)

    def images(self) -> np.ndarray | None:
        """The test images of each class behind the records' accuracies (the rows of the first confusion matrix
        found); None where no record holds one (nothing to count: no floor)."""
        return next((np.asarray(result["confusion"], dtype=float).sum(axis=1) for records in self.records.values()
                     for record in records for result in record["results"].values() if "confusion" in result), None)

    @property
    def whole_test_set(self) -> bool:
        """Whether the runs were evaluated on the paper's test images: the full scale's whole test split (the subset
        scale's is a part of it)."""
        return self.scale == "full"

    def number(self, what: str, stat: str, paper: float, ours: list[float], kind: str = "class",
               margin: float | None = None, accuracy: bool = True, other_split: int = 0) -> Comparison:
        """One number the paper states (``what``: where, e.g. "Sec. 2.2, cat under PGD-10"; ``stat``: its label)
        beside ours, one value per seed; the tables' margin for ``kind`` (avg, worst, class, mcd) unless the drawer
        gives one and says why in its docstring. ``other_split``: ours are over that many images a class of another
        split than the paper's test set (CFA's validation split). The binomial error of the sides' different images
        (:func:`~fastfair.reproduce.verdict.binomial_sd`, at the mean of the paper's value and ours; an ``mcd``'s two
        classes, unnamed, at the largest error, q = 1/2): none where ours scored the paper's test images, ours alone
        where they scored a part of them (the subset scale), ours and the paper's where they scored another split;
        none where the number is not an ``accuracy`` over images (a std); NaN where no confusion matrix counts
        them."""
        image_sd = 0.0
        if accuracy and ours and (other_split or not self.whole_test_set):
            test = self.images()  # the test images a class behind the records (the paper's, at the full scale)
            image_sd = float("nan") if test is None else float(np.sqrt(sum(
                self._binomial(kind, paper, ours, n, len(test)) ** 2
                for n in ((other_split, test.mean()) if other_split else (test.mean(),)))))
        return Comparison(self.key, what, "", stat, paper, list(ours),
                          default_margin(kind, paper) if margin is None else margin,
                          "default" if margin is None else "figure", self.comparable, image_sd=image_sd)

    @staticmethod
    def _binomial(kind: str, paper: float, ours: list[float], per_class: float, classes: int) -> float:
        """The binomial error of one side's number of ``kind`` over ``per_class`` images a class (:meth:`number`)."""
        if kind == "mcd":
            return float(np.sqrt(2) * binomial_sd(50.0, per_class))
        return float(binomial_sd((paper + float(np.mean(ours))) / 2, per_class * (classes if kind == "avg" else 1)))


@dataclass(frozen=True)
class FigureSpec:
    source: str  # a key of fastfair.reproduce.paper.PAPERS
    item: str  # "Fig. 3" (or "Table 4" for a table whose numbers are not per-row accuracies)
    caption: str  # what the paper's figure shows, in a line
    draw: Callable[[FigureRuns], list[Comparison]] | None = None
    rows: tuple[str, ...] = ()  # presets reused from other targets (their runs; their own numbers stay there)
    partial: str = ""  # what of the paper's item this target does not reproduce, and why ("" when nothing)
    pending: str = ""  # the item cannot run here: why, and the exact route to run it

    @property
    def key(self) -> str:
        return item_key(self.source, self.item)


FIGURES: dict[str, FigureSpec] = {}
INVENTORY: dict[str, tuple[str, ...]] = {}  # paper -> every table and figure with numbers or a plot of results


def _add(spec: FigureSpec) -> FigureSpec:
    if spec.key in FIGURES:
        raise ValueError(f"{spec.key} is registered twice")
    FIGURES[spec.key] = spec
    return spec


def figure(source: str, item: str, caption: str, *, rows: tuple[str, ...] = (), partial: str = ""):
    """Register the decorated ``draw(runs: FigureRuns) -> list[Comparison]`` as ``item``'s drawer."""
    def register(draw: Callable[[FigureRuns], list[Comparison]]):
        _add(FigureSpec(source, item, caption, draw, tuple(rows), partial))
        return draw
    return register


def pending(source: str, item: str, caption: str, why: str) -> None:
    """``item`` cannot run here: ``why`` says what is missing and the exact route to run it."""
    if not why:
        raise ValueError(f"{source} {item}: a pending item says why and how to run it")
    _add(FigureSpec(source, item, caption, pending=why))


def inventory(source: str, items: list[str]) -> None:
    """Every table and figure of ``source`` with numbers or a plot of measured results, in the paper's order."""
    for item in items:
        item_key(source, item)
    INVENTORY[source] = tuple(items)


__all__ = ["FIGURES", "INVENTORY", "FigureRuns", "FigureSpec", "figure", "figure_number",
           "inventory", "item_key", "pending"]
