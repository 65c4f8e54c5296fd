"""How much of each seed paper ``fastfair reproduce`` covers: every table and figure with numbers or a plot of measured
results (each paper module's inventory), as covered, partial or pending, and missing where nothing holds it.

``python -m fastfair.reproduce.coverage --write`` rewrites the table between docs/reproduce.md's markers; a test
fails while the page differs from what this module generates, so the page never tells an old story.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fastfair.reproduce import tables
from fastfair.reproduce.figures import registry
from fastfair.reproduce.paper import PAPERS

STATUSES = ("covered", "partial", "pending", "missing")
BEGIN = "<!-- coverage: written by python -m fastfair.reproduce.coverage --write; edit the paper modules, not this -->"
END = "<!-- /coverage -->"
DOC = Path(__file__).resolve().parents[2] / "docs" / "reproduce.md"


@dataclass(frozen=True)
class Entry:
    item: str  # "Table 2", "Fig. 3"
    key: str  # the target holding it ('' when none)
    status: str
    note: str = ""  # what is partial or pending, and why


def _entry(source: str, item: str, targets: dict[str, tables.Table]) -> Entry:
    key = registry.item_key(source, item)
    spec = registry.FIGURES.get(key)
    if spec and spec.pending:
        return Entry(item, key, "pending", spec.pending)
    target = targets.get(key)
    if target is None:
        return Entry(item, "", "missing")
    if target.figure and spec is None:
        return Entry(item, key, "partial", "the rows' numbers only: no drawer makes the plot yet")
    gaps = ([spec.partial] if spec and spec.partial else []) + target.pending
    if gaps:
        return Entry(item, key, "partial", "; ".join(gaps))
    return Entry(item, key, "covered")


def coverage() -> dict[str, list[Entry]]:
    """Each paper with an inventory (in :data:`PAPERS`' order): its items in the paper's order."""
    targets = tables.tables()
    return {source: [_entry(source, item, targets) for item in registry.INVENTORY[source]] for source in PAPERS
            if source in registry.INVENTORY}


def unlisted() -> list[str]:
    """Targets of an inventoried paper that its inventory does not list (an inventory must be the whole paper)."""
    listed = {registry.item_key(s, i) for s, items in registry.INVENTORY.items() for i in items}
    keys = [*tables.tables(), *tables.pending()]
    return sorted(k for k in keys if k not in listed and any(k.startswith(f"{s}-t") or k.startswith(f"{s}-f")
                                                               for s in registry.INVENTORY))


def markdown() -> str:
    """The coverage section's body: a line of counts per paper, then one table of every item."""
    cover = coverage()
    lines = ["| paper | " + " | ".join(STATUSES) + " |", "|---|" + "---:|" * len(STATUSES)]
    for source, entries in cover.items():
        counts = [sum(e.status == s for e in entries) for s in STATUSES]
        lines.append(f"| {PAPERS[source].cite} | " + " | ".join(str(c) for c in counts) + " |")
    lines += ["", "| paper | item | target | status | what is partial or pending, and why |", "|---|---|---|---|---|"]
    for source, entries in cover.items():
        for e in entries:
            key = f"`{e.key}`" if e.key else "-"
            lines.append(f"| {source} | {e.item} | {key} | {e.status} | {e.note.replace('|', '/')} |")
    return "\n".join(lines)


def rewrite(text: str) -> str:
    """``text`` (docs/reproduce.md) with the part between the markers replaced by :func:`markdown`."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOC} lacks the coverage markers {BEGIN!r} ... {END!r}")
    head, rest = text.split(BEGIN, 1)
    return f"{head}{BEGIN}\n{markdown()}\n{END}{rest.split(END, 1)[1]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite {DOC.name}'s coverage table")
    args = parser.parse_args(argv)
    if args.write:
        DOC.write_text(rewrite(DOC.read_text()))
        print(f"written: {DOC}")
    else:
        print(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
