"""Paper targets: the tables and figures ``fastfair reproduce`` runs, each a set of presets (its rows).

A table's key is ``<source>-t<table>`` (``me-t2``, ``cfa-t1``, ``tian-iclr-t5``); its rows are the
presets in natural name order. A study without numbers (Benz et al.'s pre-registration) has protocols in place of
tables, keyed ``<source>-<protocol>`` (``benz-s31-architectures``): run the same way, reported without verdicts.
A row that appears in several of a paper's tables with the same
numbers (CFA prints AT, TRADES and FAT in Tables 1 and 2) belongs to each. A figure is keyed ``<source>-f<N>``: its
rows are the presets naming one of its panels (``figure = "3(b)"``) and the presets its registration reuses
(:mod:`fastfair.reproduce.figures`), whose drawer makes the plot once the runs are done. A figure that cannot run
here is registered pending: it is listed with its route, never planned.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fastfair.errors import UserError
from fastfair.reproduce.figures import registry
from fastfair.reproduce.figures.registry import FigureSpec, figure_number
from fastfair.reproduce.paper import PAPERS, PaperRow, load, protocol_title
from fastfair.preset_files import preset_names
from fastfair.suggest import hint


@dataclass(frozen=True)
class Table:
    key: str
    source: str
    number: str  # the table's number, or the protocol's section slug
    rows: tuple[PaperRow, ...]
    protocol: bool = False  # a study's section: no paper numbers, so no verdicts
    figure: bool = False  # a paper's figure: drawn by its registered drawer

    @property
    def spec(self) -> FigureSpec | None:
        """The registration drawing this target (every figure; a table whose numbers are not per-row accuracies)."""
        return registry.FIGURES.get(self.key)

    @property
    def where(self) -> str:
        if self.protocol:
            return protocol_title(self.number)
        return f"Fig. {self.number}" if self.figure else f"Table {self.number}"

    @property
    def title(self) -> str:
        return f"{PAPERS[self.source].cite}, {self.where}"

    def own(self, row: PaperRow) -> bool:
        """Whether ``row``'s ``[paper]`` numbers are this target's (a row a figure reuses keeps its numbers in its
        own table)."""
        if self.figure:
            return bool(row.figure) and figure_number(row.figure) == self.number
        return row.table == self.number or self.number in row.also_in

    def ordered(self) -> list[PaperRow]:
        """The rows in run order: a row another row needs (``init_from``, ``substitute``) comes first."""
        first = [r for r in self.rows if not r.depends_on]
        return first + [r for r in self.rows if r.depends_on]

    @property
    def pending(self) -> list[str]:
        """The rows of the paper's table fastfair does not run yet, each with why (its rows' ``pending``; a row a
        figure reuses keeps its own table's: Benz Fig. 1 lacks nothing that Sec. 3.1's ImageNet rows lack)."""
        return list(dict.fromkeys(p for r in self.rows if not self.figure or self.own(r) for p in r.pending))


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def paper_rows() -> list[PaperRow]:
    """Every shipped preset's ``[paper]`` section (the demo has none)."""
    return [row for name in preset_names() if (row := load(name)) is not None]


def _group(rows: list[PaperRow]) -> dict[tuple[str, str, str], list[PaperRow]]:
    """(source, kind, number) -> its rows; kind is "t" (a table), "f" (a figure) or "s" (a study's section)."""
    members: dict[tuple[str, str, str], list[PaperRow]] = {}
    for row in rows:
        places = [("t", n) for n in ([row.table] if row.table else []) + list(row.also_in)]
        places += [("s", row.protocol)] if row.protocol else []
        places += [("f", figure_number(row.figure))] if row.figure else []
        for kind, number in places:
            members.setdefault((row.source, kind, number), []).append(row)
    for spec in registry.FIGURES.values():  # a registered target's reused rows (and a figure with no own preset)
        if spec.pending:
            continue
        kind, number = ("f" if spec.item.startswith("Fig.") else "t"), spec.item.split()[-1]
        group = members.setdefault((spec.source, kind, number), [])
        for name in spec.rows:
            row = load(name)
            if row is None:
                raise UserError(f"{spec.key} reuses preset {name}, which has no [paper] section")
            if row.preset not in {r.preset for r in group}:
                group.append(row)
        if not group:
            raise UserError(f"{spec.key} is registered with a drawer but has no rows: no preset names it and it "
                            "reuses none")
    return members


def tables() -> dict[str, Table]:
    """Every runnable target, a paper's tables before its figures, each in the paper's order."""
    out = {}
    order = {"t": 0, "s": 0, "f": 1}
    for (source, kind, number), group in sorted(_group(paper_rows()).items(),
                                                key=lambda kv: (kv[0][0], order[kv[0][1]], _natural(kv[0][2]))):
        group.sort(key=lambda r: _natural(r.preset))
        names = {r.preset for r in group}
        for r in group:
            # a row another table reprints (also_in) keeps its baseline in its own table; rho skips it elsewhere
            own = [("init_from", r.init_from), ("substitute", r.substitute)] + \
                ([("baseline", r.baseline)] if kind == "t" and number == r.table else [])
            for field, name in own:
                if name and name not in names:
                    raise UserError(f"preset {r.preset}: [paper] {field} = {name!r} is not a row of its table")
        key = f"{source}-{number}" if kind == "s" else f"{source}-{kind}{number}"
        out[key] = Table(key, source, number, tuple(group), protocol=kind == "s", figure=kind == "f")
    return out


def pending() -> dict[str, FigureSpec]:
    """The targets registered pending: why each cannot run here, and the route to run it."""
    return {key: spec for key, spec in registry.FIGURES.items() if spec.pending}


def get(key: str) -> Table:
    known = tables()
    if key in known:
        return known[key]
    if (spec := pending().get(key)) is not None:
        raise UserError(f"{key} ({PAPERS[spec.source].cite}, {spec.item}: {spec.caption}) is pending: {spec.pending}")
    said = _by_prefix(key, known) or hint(key, known)
    if said:
        raise UserError(f"no paper table or figure {key!r}.{said} (fastfair reproduce --list shows every target)")
    raise UserError(f"no paper table or figure {key!r}; targets: {', '.join(known)} (fastfair reproduce --list "
                    "shows them)")


def few(items: list[str], shown: int = 3) -> str:
    """The first ``shown`` of ``items`` and how many more."""
    more = len(items) - shown
    return ", ".join(items[:shown]) + (f" and {more} more" if more > 0 else "")


def _by_prefix(key: str, known: dict[str, Table]) -> str:
    """`` Did you mean T? ...`` where ``key`` begins the names of presets (``me-table2`` of ``me-table2-*``): the
    targets they are rows of, the one most made of them first; '' where it begins none."""
    presets = sorted({r.preset for t in known.values() for r in t.rows if r.preset.startswith(key)}, key=_natural)
    if not presets:
        return ""
    share = {k: sum(r.preset in presets for r in t.rows) for k, t in known.items()}
    targets = sorted((k for k, n in share.items() if n), key=lambda k: (-share[k] / len(known[k].rows), -share[k]))
    rows = [f"{k} ({share[k]} of its {len(known[k].rows)} rows)" for k in targets]
    alone = f"; train it alone with: fastfair train --config {key}" if presets == [key] else ""
    many = len(presets) != 1
    return (f" Did you mean {targets[0]}? The {len(presets)} preset{'s' * many} named {key}* ({few(presets)}) "
            f"{'are rows' if many else 'is a row'} of {few(rows)}{alone}")
