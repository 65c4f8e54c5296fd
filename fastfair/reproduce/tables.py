"""Paper tables: the presets whose ``[paper]`` section names a table (or lists it in ``also_in``).

A table's key is ``<source>-t<table>`` (``me-t2``, ``cfa-t1``, ``tian-iclr-t5``); its rows are the
presets in natural name order. A study without numbers (Benz et al.'s pre-registration) has protocols in place of
tables, keyed ``<source>-<protocol>`` (``benz-s31-architectures``): run the same way, reported without verdicts.
A row that appears in several of a paper's tables with the same
numbers (CFA prints AT, TRADES and FAT in Tables 1 and 2) belongs to each. Figures are not tables:
their presets record the paper's numbers but ``fastfair reproduce`` does not run them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from fastfair.errors import UserError
from fastfair.reproduce.paper import PAPERS, PaperRow, load, protocol_title
from fastfair.preset_files import preset_names


@dataclass(frozen=True)
class Table:
    key: str
    source: str
    number: str  # the table's number, or the protocol's section slug
    rows: tuple[PaperRow, ...]
    protocol: bool = False  # a study's section: no paper numbers, so no verdicts

    @property
    def title(self) -> str:
        where = protocol_title(self.number) if self.protocol else f"Table {self.number}"
        return f"{PAPERS[self.source].cite}, {where}"

    def ordered(self) -> list[PaperRow]:
        """The rows in run order: a row another row needs (``init_from``, ``substitute``) comes first."""
        first = [r for r in self.rows if not r.depends_on]
        return first + [r for r in self.rows if r.depends_on]

    @property
    def pending(self) -> list[str]:
        """The rows of the paper's table fastfair does not run yet, each with why (its rows' ``pending``)."""
        return list(dict.fromkeys(p for r in self.rows for p in r.pending))


def _natural(name: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def paper_rows() -> list[PaperRow]:
    """Every shipped preset's ``[paper]`` section (the demo has none)."""
    return [row for name in preset_names() if (row := load(name)) is not None]


def tables() -> dict[str, Table]:
    rows = paper_rows()
    members: dict[tuple[str, str], list[PaperRow]] = {}
    for row in rows:
        for number in ([row.table] if row.table else []) + list(row.also_in) + ([row.protocol] if row.protocol else []):
            members.setdefault((row.source, number), []).append(row)
    out = {}
    for (source, number), group in sorted(members.items(), key=lambda kv: _natural(f"{kv[0][0]}-{kv[0][1]}")):
        protocol = group[0].protocol == number
        group.sort(key=lambda r: _natural(r.preset))
        names = {r.preset for r in group}
        for r in group:
            # a row another table reprints (also_in) keeps its baseline in its own table; rho skips it elsewhere
            own = [("init_from", r.init_from), ("substitute", r.substitute)] + \
                ([("baseline", r.baseline)] if number == r.table else [])
            for field, name in own:
                if name and name not in names:
                    raise UserError(f"preset {r.preset}: [paper] {field} = {name!r} is not a row of its table")
        key = f"{source}-{number}" if protocol else f"{source}-t{number}"
        out[key] = Table(key, source, number, tuple(group), protocol)
    return out


def get(key: str) -> Table:
    known = tables()
    if key not in known:
        raise UserError(f"no paper table {key!r}; tables: {', '.join(known)} (fastfair reproduce --list shows them)")
    return known[key]
