"""``<key>.md`` and ``<key>.png``: the paper's numbers beside ours, with verdicts. Every file a target writes is
named by its key, so targets sharing an ``--out`` (and its runs) keep each other's reports."""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from fastfair import config  # noqa: E402
from fastfair.evaluation import measures  # noqa: E402
from fastfair.reports import figures  # noqa: E402
from fastfair.reports.report import write_report  # noqa: E402
from fastfair.reproduce.paper import PAPERS, SPREAD, PaperRow, protocol_title  # noqa: E402
from fastfair.reproduce.tables import Table  # noqa: E402
from fastfair.reproduce.verdict import (AGREES, CANNOT_TELL, DIFFERENCE, EQUIVALENCE, HIGHER, LOWER,  # noqa: E402
                                        NO_SPREAD, NOT_COMPARABLE, ONE_SEED, UNCOUNTED, UNDECIDED, Comparison,
                                        rho_rows)
from fastfair.rundir import write_text_atomic  # noqa: E402

# colour and marker per verdict: the shape alone tells higher from lower in grey print
STYLE = {AGREES: ("tab:green", "o"), HIGHER: ("tab:orange", "^"), LOWER: ("tab:red", "v"),
         UNDECIDED: ("tab:blue", "D"), NOT_COMPARABLE: ("tab:grey", "o"),
         **dict.fromkeys((CANNOT_TELL, ONE_SEED, NO_SPREAD, UNCOUNTED), ("tab:purple", "s"))}
RULE = (f"A number **agrees** when the {EQUIVALENCE:.0%} interval of ours − paper lies within ± the margin (two "
        f"one-sided tests at 5 %); it is **higher** or **lower** when the {DIFFERENCE:.0%} interval excludes 0, and "
        f"**{UNDECIDED}** otherwise. The interval comes from the spreads the two sides measured (ours over two seeds "
        "or more; the paper's printed std): Student's t with the stds pooled and, where both measured one, Welch's "
        "too, the wider of the two; the binomial error of the test images is added only where ours scored other "
        f"images than the paper's. Where no spread was measured there is no test: **{CANNOT_TELL}**, and the verdict "
        "says why (fastfair's docs/reproduce.md, section Verdicts, derives the rule and states what it guarantees).")


def _cell(value: float | None, signed: bool = False) -> str:
    return "-" if value is None else (f"{value:+.2f}" if signed else f"{value:.2f}")


def numbers_table(comparisons: list[Comparison]) -> str:
    lines = ["| row | preset | attack | number | paper (runs, std) | ours (mean ± std, seeds) | ours, "
             f"{DIFFERENCE:.0%} t interval | ours − paper | its {DIFFERENCE:.0%} interval | margin | verdict |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for c in comparisons:
        paper = f"{c.paper:.2f} ({c.paper_n}" + (f", ± {c.paper_std:.{c.paper_decimals}f})"
                                                 if c.paper_std is not None else ")")
        ours = _cell(c.mean) + (f" ± {c.std:.2f}" if c.std is not None else "") + f" ({len(c.ours)})"
        lines.append(f"| {c.row} | `{c.preset}` | {c.attack} | {c.stat} | {paper} | {ours} | "
                     f"{_interval(c.ours_interval)} | {_cell(c.diff, True)} | {_interval(c.interval, True)} | "
                     f"±{c.margin:g} ({c.margin_from}) | {c.verdict} |")
    return "\n".join(lines)


def _interval(bounds: tuple[float, float] | None, signed: bool = False) -> str:
    """``[low, high]`` to two decimals ('-' where there is none: one seed, or no test)."""
    return "-" if bounds is None else f"[{_cell(bounds[0], signed)}, {_cell(bounds[1], signed)}]"


def rho_table(table: Table, comparisons: list[Comparison]) -> str:
    """The rows that name a baseline: rho against it, the paper's (from its printed numbers) and ours; '' if none."""
    rhos = rho_rows(list(table.rows), comparisons)
    if not rhos:
        return ""
    lines = ["| row | preset | attack | against | paper rho | ours rho |", "|---|---|---|---|---:|---:|"]
    lines += [f"| {r.row} | `{r.preset}` | {r.attack} | {r.baseline} | {_rho(r.paper)} | {_rho(r.ours)} |"
              for r in rhos]
    return "\n".join(lines)


def _rho(value: float | None) -> str:
    if value is None:
        return "-"
    return "undefined (the baseline's worst class is 0)" if math.isnan(value) else f"{value:+.3f}"


def figure(table: Table, comparisons: list[Comparison], path: Path, scale: str) -> Path:
    """One line per number: the paper's value (hollow) in its margin band, ours (filled, coloured by verdict) with
    the 95 % interval of the difference around it; a
    table of per-class numbers gets one panel per row and attack instead (:func:`per_class_figure`), a table of
    class-wise spreads a panel per measure (:func:`spread_figure`)."""
    if all(c.stat in SPREAD for c in comparisons):
        return spread_figure(table, comparisons, path, scale)
    if any(c.stat not in ("avg", "worst") for c in comparisons):
        return per_class_figure(table, comparisons, path, scale)
    n = len(comparisons)
    fig, ax = plt.subplots(figsize=(8, 1.2 + 0.28 * n))
    for i, c in enumerate(comparisons):
        y = n - 1 - i
        if i and c.preset != comparisons[i - 1].preset:  # a rule between the table's rows
            ax.axhline(y + 0.5, color="0.6", lw=0.6)
        _draw(ax, c, y)
    # a row the table holds twice (the paper's and the authors' code's settings) is named by its preset
    presets_of = {}
    for c in comparisons:
        presets_of.setdefault(c.row, set()).add(c.preset)
    names = [f"{c.row} ({c.preset})" if len(presets_of[c.row]) > 1 else c.row for c in reversed(comparisons)]
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"{name} · {c.attack} {c.stat}" for name, c in zip(names, reversed(comparisons))],
                       fontsize=7)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel("accuracy (%)")
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", mfc="white", mec="black", label="paper"),
               plt.Rectangle((0, 0), 1, 1, color="0.88", label="paper ± margin")]
    handles += _verdict_handles(comparisons)
    ax.legend(handles=handles, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=min(len(handles), 3),
              frameon=False)
    note = "" if scale == "full" else f"\n{scale} scale: not comparable to the paper"
    ax.set_title(f"{table.title}: paper vs fastfair{note}", fontsize=9, pad=14 + 10 * math.ceil(len(handles) / 3))
    fig.tight_layout()
    return figures.save_figure(fig, path)


def _draw(ax, c: Comparison, y: float) -> None:
    """One number on a horizontal axis: the margin band, the paper's value (hollow), ours (by verdict) with the
    95 % interval of the difference drawn around it (mean ± its half-width: where it meets the band's edges is
    what the verdict reads)."""
    ax.fill_betweenx([y - 0.3, y + 0.3], c.paper - c.margin, c.paper + c.margin, color="0.88", lw=0)
    ax.plot(c.paper, y, "o", mfc="none", mec="black", ms=7, zorder=4)
    if c.mean is not None:
        colour, marker = STYLE[c.verdict]
        ax.errorbar(c.mean, y, xerr=_half(c), fmt=marker, color=colour, ms=5, capsize=2)


def _half(c: Comparison) -> float:
    """The half-width of the 95 % interval of ours − paper (0 without a result or without a test)."""
    return 0.0 if c.interval is None else (c.interval[1] - c.interval[0]) / 2


def _verdict_handles(comparisons: list[Comparison]) -> list:
    """A legend entry per verdict shown, and one saying what the bar on ours is."""
    shown = dict.fromkeys(v.partition(":")[0] if v.startswith(CANNOT_TELL) else v  # one entry, its reasons in the table
                          for v in (c.verdict for c in comparisons if c.mean is not None))
    return [plt.Line2D([], [], marker=STYLE[v][1], ls="", color=STYLE[v][0], label=f"ours: {v}") for v in shown] + \
        [plt.Line2D([], [], marker="|", ms=8, color="0.3", label="bar: 95 % interval of ours − paper")]


def spread_figure(table: Table, comparisons: list[Comparison], path: Path, scale: str) -> Path:
    """A panel per spread measure (CV on a symmetric-log axis: the papers' values span four decades and a model
    with every class at one accuracy has CV 0; MCD in points), a line per row and attack, the paper's value beside
    ours."""
    lines = list(dict.fromkeys((c.preset, c.row, c.attack) for c in comparisons))
    stats = [s for s in SPREAD if any(c.stat == s for c in comparisons)]
    fig, axes = plt.subplots(1, len(stats), figsize=(4.2 * len(stats) + 1.5, 1.3 + 0.32 * len(lines)), sharey=True,
                             squeeze=False)
    for ax, stat in zip(axes[0], stats):
        for c in comparisons:
            if c.stat == stat:
                _draw(ax, c, len(lines) - 1 - lines.index((c.preset, c.row, c.attack)))
        if stat == "cv":
            ax.set_xscale("symlog", linthresh=0.1)
            ax.set_xlim(left=0)
        ax.set_xlabel("CV: variance of the class accuracies (% squared, log above 0.1)" if stat == "cv"
                      else "MCD: best minus worst class (points)", fontsize=8)
        ax.grid(axis="x", alpha=0.3, which="both")
        ax.tick_params(labelsize=7)
    ax = axes[0][0]
    ax.set_yticks(range(len(lines)))
    ax.set_yticklabels([f"{row} · {attack}" for _, row, attack in reversed(lines)], fontsize=7)
    ax.set_ylim(-0.7, len(lines) - 0.3)
    handles = [plt.Line2D([], [], marker="o", ls="", mfc="white", mec="black", label="paper"),
               plt.Rectangle((0, 0), 1, 1, color="0.88", label="paper ± margin")]
    handles += _verdict_handles(comparisons)
    note = "" if scale == "full" else f"; {scale} scale: not comparable to the paper"
    fig.suptitle(f"{table.title}: class-wise spread, paper vs fastfair{note}", fontsize=9)
    fig.tight_layout(rect=(0, 0.35 / fig.get_figheight(), 1, 1))
    fig.legend(handles=handles, fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 0), ncol=min(len(handles), 4),
               frameon=False)
    return figures.save_figure(fig, path)


def per_class_figure(table: Table, comparisons: list[Comparison], path: Path, scale: str) -> Path:
    """A grid of panels, a column per table row: a line of panels per attack with per-class numbers (the average,
    then every class on the x axis) and, for the attacks the paper gives an average only, one line with those
    attacks on the x axis. In each, the paper's numbers (hollow, joined, the margin as a grey bar) and ours
    (coloured by verdict). A class-wise spread beside them (KDD Table 1's CV, in % squared) is on no accuracy axis:
    the report's table holds it."""
    comparisons = [c for c in comparisons if c.stat not in SPREAD]
    rows = list(dict.fromkeys((c.preset, c.row) for c in comparisons))
    classed = list(dict.fromkeys(c.attack for c in comparisons if c.stat not in ("avg", "worst")))
    averaged = [a for a in dict.fromkeys(c.attack for c in comparisons) if a not in classed]
    stats = list(dict.fromkeys(c.stat for c in comparisons if c.stat != "worst" and c.attack in classed))
    # (title, x labels, the comparisons of a row the panel draws, x of a comparison)
    lines = [(attack, stats, lambda c, a=attack: c.attack == a and c.stat in stats, lambda c: stats.index(c.stat))
             for attack in classed]
    if averaged:
        lines.append(("average", averaged, lambda c: c.attack in averaged and c.stat == "avg",
                      lambda c: averaged.index(c.attack)))
    fig, axes = plt.subplots(len(lines), len(rows), figsize=(2.9 * len(rows) + 0.6, 1.55 * len(lines) + 1.4),
                             sharey=True, squeeze=False)
    for (preset, row), column in zip(rows, axes.T):
        for (title, labels, keep, x_of), ax in zip(lines, column):
            mine = [c for c in comparisons if c.preset == preset and keep(c)]
            ax.grid(axis="y", alpha=0.3)
            ax.set_xticks(range(len(labels)))
            labelled = title == classed[-1] or (averaged and title == "average")  # each x axis's last line
            ax.set_xticklabels(labels if labelled else [], rotation=70, fontsize=6)
            ax.set_xlim(-0.5, len(labels) - 0.5)
            ax.set_title(f"{row} · {title}", fontsize=7, pad=2)
            if not mine:
                ax.text(0.5, 0.5, "not in the paper", ha="center", va="center", fontsize=7, color="0.5",
                        transform=ax.transAxes)
                continue
            xs = [x_of(c) for c in mine]
            ax.errorbar(xs, [c.paper for c in mine], yerr=[c.margin for c in mine], fmt="none", ecolor="0.8",
                        elinewidth=4, zorder=1)
            ax.plot(xs, [c.paper for c in mine], "-o", color="black", mfc="white", lw=0.6, ms=4, zorder=3)
            # ours, one errorbar a verdict: a call a number made a panel's artists many times over, and a table of
            # a dozen rows and attacks took most of its report's time to lay out and save
            ours = [(x, c) for x, c in zip(xs, mine) if c.mean is not None]
            for verdict in dict.fromkeys(c.verdict for _, c in ours):
                colour, marker = STYLE[verdict]
                alike = [(x, c) for x, c in ours if c.verdict == verdict]
                ax.errorbar([x for x, _ in alike], [c.mean for _, c in alike], yerr=[_half(c) for _, c in alike],
                            fmt=marker, color=colour, ms=4, capsize=1.5, zorder=4)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (%)", fontsize=7)
    for ax in axes.flat:
        ax.tick_params(axis="y", labelsize=6)
    handles = [plt.Line2D([], [], marker="o", color="black", mfc="white", lw=0.6, label="paper"),
               plt.Line2D([], [], color="0.8", lw=4, label="paper ± margin")]
    handles += _verdict_handles(comparisons)
    note = "" if scale == "full" else f"; {scale} scale: not comparable to the paper"
    top = 1 - 0.75 / fig.get_figheight()  # room for the title and, under it, the legend
    fig.tight_layout(rect=(0, 0, 1, top))
    fig.suptitle(f"{table.title}: paper vs fastfair, average and per class{note}", fontsize=9, y=0.999)
    fig.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.3 / fig.get_figheight()),
               ncol=min(len(handles), 4), frameon=False)
    return figures.save_figure(fig, path)


def write(out: Path, table: Table, comparisons: list[Comparison], *, scale: str, scale_doc: str, seeds: str,
          runs: list[tuple[str, str, str]], user_sets: list[str], notes: list[str], banner: str = "",
          drawn: list[Path] | None = None) -> Path:
    """``out/<key>.md`` and, for a table, ``out/<key>.png`` (every number, paper vs ours); ``runs`` holds
    (run folder, status, evaluated checkpoint); ``banner``: a paragraph under the heading (where the checkpoints
    were chosen, when the test set chose them); ``drawn``: the PNGs a figure's drawer made, shown in place of
    the numbers' plot (its numbers are not all accuracies on one axis)."""
    if drawn is None:
        figure(table, comparisons, numbers_png(out, table), scale)
    paper = PAPERS[table.source]
    counts = Counter(c.verdict for c in comparisons)
    comparable = scale == "full" and not user_sets
    md = [f"# Reproduce: {table.title}\n",
          f"Paper: {paper.cite}, *{paper.title}*, {table.where}"
          f"{': ' + table.spec.caption if table.spec else ''}. Scale: **{scale}** ({scale_doc}). "
          f"Seeds: {seeds}.\n"] + ([banner] if banner else [])
    if not comparable:
        why = f"the {scale} scale" if scale != "full" else "--set " + " ".join(user_sets)
        md.append(f"**These numbers are not comparable to the paper** ({why} changes the runs); the verdicts say so. "
                  f"They show the {'figure' if table.figure else 'table'} runs end to end.\n")
    if drawn:
        md += ["## The figure\n"] + [f"![{table.where}, {p.stem}]({p.name})\n" for p in drawn]
        if table.spec and table.spec.partial:
            md.append(f"Not reproduced here: {table.spec.partial}\n")
    if not comparisons:
        md += ["## Protocol and differences from the paper\n"]
        return _finish(md, notes, runs, out, table)
    md += ["## Numbers\n", numbers_table(comparisons) + "\n",
           "Verdicts: " + ", ".join(f"{k}: {v}" for k, v in counts.items()) + ".\n",
           "ours: share of test images correct (the papers' accuracy) for averages; worst class and per class from "
           "the per-class accuracies; mean ± std over the seeds that finished; paper: its value, its runs and std "
           "where it prints one. Margin: ±1 point for averages, ±3 for worst-class and single-class numbers, ±5 for "
           "MCD, ±25 % of the paper's CV (at least 1), plus a figure's reading half-width. " + RULE + "\n",
           *([] if drawn is not None else [f"![paper vs fastfair, every number]({numbers_png(out, table).name})\n"])]
    rhos = rho_table(table, comparisons)
    if rhos:
        md += ["## rho against the baseline row\n", rhos + "\n",
               "rho = (worst − worst_base) / worst_base + (avg − avg_base) / avg_base, as DAFA and WAT report it: the "
               "relative worst-class gain plus the relative change of the average. The paper's rho is computed from "
               "the numbers above (its printed rho may differ in the last digit); ours from our seed means.\n"]
    md += ["## Protocol and differences from the paper\n"]
    return _finish(md, notes, runs, out, table)


def report_path(out: Path, table: Table) -> Path:
    """``out/<key>.md``: the target's own report, beside any other target's sharing the folder."""
    return out / f"{table.key}.md"


def numbers_png(out: Path, table: Table) -> Path:
    """``out/<key>.png``: a table's every number, paper vs ours (a figure's drawer names its own PNGs by key)."""
    return out / f"{table.key}.png"


def _finish(md: list[str], notes: list[str], runs: list[tuple[str, str, str]], out: Path, table: Table) -> Path:
    """The notes and the runs table after ``md``, written as the target's report (:func:`report_path`)."""
    md += [f"- {n}" for n in notes]
    md += ["", "## Runs\n", "| run folder | status | checkpoint evaluated |", "|---|---|---|"]
    md += [f"| `{folder}` | {status} | {ckpt} |" for folder, status, ckpt in runs]
    path = report_path(out, table)
    write_text_atomic("\n".join(md) + "\n", path)
    return path


def _seed_mean(records: list[dict], attack: str) -> np.ndarray:
    """The per-class accuracies under ``attack``, averaged over the seeds' records that have it."""
    return np.mean([rec["results"][attack]["per_class"] for rec in records if attack in rec["results"]], axis=0,
                   dtype=float)  # an absent class's null as NaN, which measures.summary leaves out


def protocol_table(rows: list[tuple[str, str, list[dict]]], attack: str, classes: list[str]) -> str:
    """One line per row (label, preset, its seeds' records): average, worst class, CV and MCD of the seed-mean
    per-class accuracies, and the classes themselves where they fit a page (up to 10)."""
    per_class = len(classes) <= 10
    head = "| row | preset | seeds | avg | worst (class) | CV (%²) | MCD |" + \
        ("".join(f" {c} |" for c in classes) if per_class else "")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|" + ("---:|" * len(classes) if per_class else "")]
    absent: set[str] = set()
    for label, preset, recs in rows:
        acc = _seed_mean(recs, attack)
        absent.update(measures.absent_classes(acc, classes))
        s = measures.summary(acc)
        seeds = sum(attack in rec["results"] for rec in recs)
        line = (f"| {label} | `{preset}` | {seeds} | {s['avg']:.2f} | {s['worst']:.2f} ({classes[s['worst_class']]}) | "
                f"{s['cv']:.2f} | {s['mcd']:.2f} |")
        lines.append(line + ("".join(f" {measures.accuracy_cell(a, 1)} |" for a in acc) if per_class else ""))
    note = measures.absent_note([c for c in classes if c in absent])
    return "\n".join(lines + ([f"\n{note}"] if note else []))


def members_table(rows: list[tuple[str, str, list[dict]]], members: list[str], classes: list[str]) -> str:
    """A line per member of a group entry (a corruption of ``corrupt:all@S``), a column per row: its average and
    worst class."""
    lines = ["| member | " + " | ".join(label for label, _, _ in rows) + " |", "|---|" + "---:|" * len(rows)]
    for member in members:
        cells = []
        for _, _, recs in rows:
            if not any(member in rec["results"] for rec in recs):
                cells.append("-")
                continue
            s = measures.summary(_seed_mean(recs, member))
            cells.append(f"{s['avg']:.1f} (worst {classes[s['worst_class']]} {s['worst']:.1f})")
        lines.append(f"| {member} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_protocol(out: Path, table: Table, records: dict[str, list[dict]], planned: list, *, scale: str,
                   scale_doc: str, seeds: str, runs: list[tuple[str, str, str]], notes: list[str]) -> Path:
    """``out/<key>.md`` of a study's section (no paper numbers, so no verdicts): per attack and data set, every
    row's per-class accuracies as a table and a heatmap (``<key>-<attack>[-<data set>].png``); and the study's
    figures, ``fastfair report`` of the section's trained runs (``out/<key>-study[-<data set>]/report.md``)."""
    paper = PAPERS[table.source]
    # rows grouped by their classes: a section may span data sets (Benz et al. Sec. 3.1 trains on five)
    groups: dict[tuple[str, ...], list[PaperRow]] = {}
    for row in table.ordered():
        if records.get(row.preset):
            groups.setdefault(tuple(records[row.preset][0]["classes"]), []).append(row)
    md = [f"# Reproduce: {table.title}\n",
          f"Study: {paper.cite}, *{paper.title}*, {protocol_title(table.number)}. Scale: **{scale}** ({scale_doc}). "
          f"Seeds: {seeds}.\n",
          "**No paper numbers: a protocol.** The paper is a pre-registered study: it states what to measure, not what "
          "it found, so there is nothing to agree with. Below is what fastfair measured, per class.\n"]
    done = {Path(folder).resolve() for folder, status, _ in runs if status == "done"}
    for classes, rows in groups.items():
        dataset = config.resolve(rows[0].preset).data.dataset
        suffix = f"-{dataset}" if len(groups) > 1 else ""
        if len(groups) > 1:
            md.append(f"## {dataset}\n")
        results = [rec["results"] for row in rows for rec in records[row.preset]]
        attacks = list(dict.fromkeys(a for res in results for a in res))
        # a group's members (corrupt:all@S: one entry per corruption) go into one compact table beside the group
        grouped = {a: res[a]["members"] for res in results for a in res if res[a].get("members")}
        for attack in [a for a in attacks if not any(a in m for m in grouped.values())]:
            have = [r for r in rows if any(attack in rec["results"] for rec in records[r.preset])]
            lines = [(r.row, r.preset, records[r.preset]) for r in have]
            md += [f"### {attack}\n", protocol_table(lines, attack, list(classes)) + "\n"]
            if attack in grouped:
                md += ["Its members, average and worst class (the mean of the seeds):\n",
                       members_table(lines, grouped[attack], list(classes)) + "\n"]
            matrix = [_seed_mean(recs, attack) for _, _, recs in lines]
            png = figures.models_by_class(matrix, [r.row for r in have], list(classes),
                                          [float(np.mean(m)) for m in matrix],
                                          f"{table.title}: per-class {attack} accuracy" +
                                          ("" if scale == "full" else f" ({scale} scale)"),
                                          out / f"{table.key}-{attack.replace('/', '_').replace(':', '_')}{suffix}.png")
            md.append(f"![per-class {attack} accuracy of every row]({png.name})\n")
        trained = [(p.run_dir(out), p.row.row) for p in planned
                   if not p.row.evaluated and p.row in rows and p.run_dir(out).resolve() in done]
        if trained:
            # the rows name the row their gains are measured against (Sec. 3.3: the remedies against plain PGD-AT)
            base = next((d for d, _ in trained for r in rows if r.baseline and d.name.startswith(f"{r.baseline}-s")),
                        None)
            study = write_report([d for d, _ in trained], out=out / f"{table.key}-study{suffix}",
                                 labels=[lb for _, lb in trained], baseline=base)
            md.append("The study's figures (per-class bars with and without the mean, curves over training, confusion, "
                      f"similarity): [{study.relative_to(out)}]({study.relative_to(out)}).\n")
    md += ["avg: mean of the per-class accuracies (seed means); CV: the variance of the per-class accuracies "
           "(Tian et al.'s CV); MCD: best minus worst class.\n", "## Protocol\n"]
    return _finish(md, notes, runs, out, table)
