"""How numbers reach a reader: eps as the fraction a paper writes, a worst class named once, and
per-class tables rendered for a terminal (files keep Markdown, :func:`fastfair.evaluation.measures.markdown_table`).

Imports only rich, so the CLI's listings stay fast.
"""
from __future__ import annotations

from numbers import Real

from rich.console import Console
from rich.table import Table

# Papers write eps over 255 (8/255, 2/255) or, the ME paper, over 256 (8/256). Configs hold decimals, often
# rounded to five places (0.03137): a value within EPS_TOLERANCE of k/255 or k/256 is shown as that
# fraction. Five-place rounding moves a value by at most 5e-6; k/255 and j/256 differ by at least
# 1/65280 = 1.5e-5, so no value matches both.
EPS_DENOMINATORS = (255, 256)
EPS_TOLERANCE = 5e-6


def eps_text(eps) -> str:
    """``8/255`` for 0.03137 (or 8/255 exactly), ``8/256`` for 0.03125, else the decimal (``0.1``);
    a per-class list as ``[8/255, 4/255]``."""
    if not isinstance(eps, Real):
        return "[" + ", ".join(eps_text(e) for e in eps) + "]"
    for d in EPS_DENOMINATORS:
        k = round(eps * d)
        if 0 < k < d and abs(eps - k / d) <= EPS_TOLERANCE:
            return f"{k}/{d}"
    return f"{eps:g}"


def worst_class_text(name: str, acc: float) -> str:
    """``worst class: cat 21.3 %``; a class known only by its index (``class 3`` or ``3``) reads
    ``worst class 3: 21.3 %``, so neither the word "class" nor two numbers run together."""
    index = name.removeprefix("class ")
    if index.isdigit():
        return f"worst class {index}: {acc:.1f} %"
    return f"worst class: {name} {acc:.1f} %"


def table(header: list[str], rows: list[tuple[list[str], bool]], text_columns: int = 1) -> Table:
    """A rich table of text cells; the first ``text_columns`` left-aligned, the others (numbers) right-aligned;
    rows marked True in bold (plain where the output is not a terminal)."""
    t = Table(header[0], show_edge=False, pad_edge=False)
    for i, h in enumerate(header[1:], 1):
        t.add_column(h, justify="left" if i < text_columns else "right")
    for i, (cells, bold) in enumerate(rows):
        # a rule between the classes and the summary below them
        summary_next = i + 1 < len(rows) and rows[i + 1][1] and not bold
        t.add_row(*cells, style="bold" if bold else None, end_section=summary_next)
    return t


def print_table(header: list[str], rows: list[tuple[list[str], bool]], text_columns: int = 1) -> None:
    console = Console(highlight=False)
    if not console.is_terminal:  # a log file has no width to fit: rich's default 80 columns would wrap cells
        console.width = 200
    console.print(table(header, rows, text_columns))
