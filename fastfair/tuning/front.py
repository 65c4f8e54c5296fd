"""The comparison a study writes: each contender's front of average vs worst-class robust accuracy, the rule
that picks one point of a front, the tables (Markdown and terminal), the figure and the papers' own points.

Pure functions over plain trial records (no Optuna here: the study turns its trials into these)::

    {"contender": "trades", "number": 3, "params": {"method.kl_weight": 6.0}, "state": "complete",
     "val": {"avg": 48.1, "worst": 22.0, "clean": 80.2}, "test": None, "run": "STUDY/trials/trades/0003"}

Accuracies are in percent; ``state`` is one of :data:`STATES`; ``test`` is filled only for the final fronts'
points, evaluated once (issue 51: the test set never selects).
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import matplotlib.lines
import matplotlib.pyplot as plt

from fastfair import config
from fastfair.errors import UserError
from fastfair.preset_files import preset_names
from fastfair.reproduce import paper
from fastfair.reports.figures import save_figure

STATES = ("complete", "pruned", "failed", "running")
# Okabe & Ito 2008, "Color Universal Design": told apart under every common colour-vision deficiency (their
# yellow left out: it vanishes on white)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000")
FLOAT_SLACK = 1e-9  # "within D points" holds for a difference that is D up to float rounding of the percentages


def _point(record: dict, key: str = "val") -> tuple[float, float] | None:
    """(avg, worst) of a complete record on split ``key``; None where either is absent or NaN."""
    if record.get("state") != "complete":
        return None
    split = record.get(key) or {}
    avg, worst = split.get("avg"), split.get("worst")
    if avg is None or worst is None or math.isnan(avg) or math.isnan(worst):
        return None
    return float(avg), float(worst)


def _equal_points(records: Iterable[dict], key: str = "val") -> tuple[list[dict], dict[int, list[int]]]:
    """The complete records with a point, one per distinct (avg, worst): the lowest trial number keeps it; and
    kept number -> the numbers of the records that reached the same point."""
    kept: dict[tuple[float, float], dict] = {}
    same: dict[int, list[int]] = {}
    for r in sorted((r for r in records if _point(r, key)), key=lambda r: r["number"]):
        first = kept.setdefault(_point(r, key), r)
        if first is not r:
            same.setdefault(first["number"], []).append(r["number"])
    return list(kept.values()), same


def pareto(records: Iterable[dict], key: str = "val") -> list[dict]:
    """The complete records no other complete record dominates (at least as high in both average and worst-class
    accuracy on split ``key``, higher in one: Pareto dominance as in NSGA-II, Deb et al. 2002, Sec. III-A), sorted
    by average ascending, so worst-class accuracy strictly descends. A record without both numbers (or with NaN) is
    on no front; records that reached the same point count once, as the one with the lowest trial number."""
    distinct, _ = _equal_points(records, key)
    front, best_worst = [], -math.inf
    # by average descending: a point is on the front iff its worst class beats every point with a higher average
    for r in sorted(distinct, key=lambda r: tuple(-v for v in _point(r, key))):
        if _point(r, key)[1] > best_worst:
            front.append(r)
            best_worst = _point(r, key)[1]
    return front[::-1]


FORMS = ('"worst@avg-D" (highest worst-class accuracy among points whose average is within D points of the best '
         'average; e.g. worst@avg-1)', '"avg@worst-D" (the same with the two swapped)', '"avg" (highest average)',
         '"worst" (highest worst-class accuracy)', '"sum" (highest average + worst-class, CFA\'s selection)')
DEFAULT_RULE = "worst@avg-1"
_WITHIN = re.compile(r"(avg|worst)@(avg|worst)-(\d+(?:\.\d*)?|\.\d+)")


@dataclass(frozen=True)
class Rule:
    """One point per front, the user's trade-off:

    - ``worst@avg-D``: the highest worst-class accuracy among the points whose average is at most D points below the
      front's best average (ties to the higher average): "the fairest model that gives up at most D points on
      average"; the issue's example rule (issue 51 item 3), the default with D = 1.
    - ``avg@worst-D``: the highest average among the points whose worst class is at most D points below the best
      worst class (ties to the higher worst class).
    - ``avg`` / ``worst``: the highest average (ties to the higher worst class) / the highest worst class (ties to the
      higher average): the front's two ends.
    - ``sum``: the highest average + worst-class accuracy (ties to the higher worst class), the checkpoint selection
      of CFA (Wei et al. 2023, Sec. 5.1).

    Remaining ties go to the lowest trial number.
    """

    text: str
    best: str  # the objective maximised: avg | worst | sum
    within: str = ""  # the objective kept within ``slack`` points of its best ('' for none)
    slack: float = 0.0

    def pick(self, front: Iterable[dict], key: str = "val") -> dict | None:
        """The chosen record of ``front`` (records without both numbers on split ``key`` are skipped); None if none."""
        points = [(r, dict(zip(("avg", "worst"), _point(r, key)))) for r in front if _point(r, key)]
        if self.within:
            top = max((p[self.within] for _, p in points), default=0.0)
            points = [(r, p) for r, p in points if p[self.within] >= top - self.slack - FLOAT_SLACK]
        other = {"avg": "worst", "worst": "avg", "sum": "worst"}[self.best]

        def score(item):
            r, p = item
            return (p["avg"] + p["worst"] if self.best == "sum" else p[self.best], p[other], -r["number"])
        return max(points, key=score, default=(None, None))[0]

    def explain(self) -> str:
        """One sentence for a reader of the comparison."""
        if self.within:
            name = {"avg": "average", "worst": "worst-class"}
            return (f"rule {self.text}: the highest {name[self.best]} accuracy among the front's points whose "
                    f"{name[self.within]} accuracy is at most {self.slack:g} point(s) below the front's best "
                    f"{name[self.within]} accuracy.")
        return {"avg": f"rule {self.text}: the front's point of highest average accuracy.",
                "worst": f"rule {self.text}: the front's point of highest worst-class accuracy.",
                "sum": f"rule {self.text}: the front's point of highest average + worst-class accuracy (CFA's "
                       f"checkpoint selection, Wei et al. 2023 Sec. 5.1)."}[self.best]


def parse_rule(text: str = DEFAULT_RULE) -> Rule:
    """``worst@avg-1``, ``avg@worst-2``, ``avg``, ``worst`` or ``sum`` as a :class:`Rule`; anything else is a
    UserError listing the forms."""
    t = text.strip().replace(" ", "")
    if t in ("avg", "worst", "sum"):
        return Rule(t, t)
    m = _WITHIN.fullmatch(t)
    if m and m[1] != m[2]:
        return Rule(t, m[1], m[2], float(m[3]))
    raise UserError(f"rule {text!r} is not one of the forms: {'; '.join(FORMS)}")


# ---- tables ------------------------------------------------------------------------------------------------

def _num(split: dict | None, stat: str) -> str:
    value = (split or {}).get(stat)
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items())) \
        or "-"


def budget_line(records: list[dict]) -> str:
    """``budget: N trials (C complete, P stopped early, F failed)``, and the running ones where there are any."""
    n = {s: sum(r.get("state") == s for r in records) for s in STATES}
    running = f", {n['running']} running" if n["running"] else ""
    return (f"budget: {len(records)} trials ({n['complete']} complete, {n['pruned']} stopped early, "
            f"{n['failed']} failed{running})")


HEADER = ("trial", "params", "val avg", "val worst", "test avg", "test worst")


def _row(r: dict, picked: bool) -> list[str]:
    return [f"{r['number']}{' (pick)' if picked else ''}", _params(r.get("params", {})), _num(r.get("val"), "avg"),
            _num(r.get("val"), "worst"), _num(r.get("test"), "avg"), _num(r.get("test"), "worst")]


@dataclass(frozen=True)
class _Section:
    """One contender's part of the comparison, as both renderings show it."""

    contender: str
    rows: list[list[str]]
    pick: dict | None
    budget: str
    same: list[str]  # "trials 5, 7 reached trial 3's point"
    papers: list[str]


def _sections(records_by_contender: dict[str, list[dict]], rule: Rule,
              paper_points: dict[str, list[dict]] | None) -> list[_Section]:
    out = []
    for contender, records in records_by_contender.items():
        front = pareto(records)
        pick = rule.pick(front)
        _, same = _equal_points(records)
        on_front = {r["number"] for r in front}
        notes = [f"trial{'s' * (len(v) > 1)} {', '.join(map(str, v))} reached trial {k}'s validation point and "
                 f"{'are' if len(v) > 1 else 'is'} not listed (equal points keep the lowest trial number)"
                 for k, v in sorted(same.items()) if k in on_front]
        papers = [f"{p['label']}: avg {p['avg']:.1f}, worst {p['worst']:.1f} (test, "
                  f"{_attack_name(p.get('attack', ''))})"
                  for p in (paper_points or {}).get(contender, [])]
        out.append(_Section(contender, [_row(r, r is pick) for r in front], pick, budget_line(records), notes,
                            papers))
    return out


TEST_NOTE = ("val numbers (validation split) chose the fronts and the picks; test numbers were measured once, "
             "on the final fronts' points only, and chose nothing.")


def _summary(sections: list[_Section]) -> tuple[list[str], list[list[str]]]:
    header = ["contender", *HEADER]
    rows = [[s.contender, *(_row(s.pick, False) if s.pick else ["-"] * len(HEADER))] for s in sections]
    return header, rows


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [f"| {' | '.join(header)} |", f"|{'|'.join('---' for _ in header)}|",
            *(f"| {' | '.join(row)} |" for row in rows)]


def comparison_markdown(records_by_contender: dict[str, list[dict]], rule: Rule,
                        paper_points: dict[str, list[dict]] | None = None) -> str:
    """The comparison as Markdown: per contender its front's points (the rule's pick marked), its budget and the
    papers' reported points (``paper_points``: contender -> :func:`paper_points`); then each contender's pick in
    one table, and what the rule and the two splits mean."""
    sections = _sections(records_by_contender, rule, paper_points)
    lines = ["# Fronts: average vs worst-class robust accuracy", ""]
    for s in sections:
        lines += [f"## {s.contender}", "", s.budget, ""]
        lines += _markdown_table(list(HEADER), s.rows) if s.rows else ["no complete trial yet, so no front"]
        lines += [""] + [f"- {n}" for n in s.same] + [f"- paper: {p}" for p in s.papers]
        lines += [""] if s.same or s.papers else []
    header, rows = _summary(sections)
    lines += ["## Picks", "", *_markdown_table(header, rows), "", f"The pick: {rule.explain()}", "", TEST_NOTE, ""]
    return "\n".join(lines)


def _aligned(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *rows)]


def comparison_text(records_by_contender: dict[str, list[dict]], rule: Rule,
                    paper_points: dict[str, list[dict]] | None = None) -> str:
    """The same comparison as plain aligned text, for the terminal (``fastfair tune STUDY --show``)."""
    sections = _sections(records_by_contender, rule, paper_points)
    lines = []
    for s in sections:
        lines += [f"{s.contender}: {s.budget}"]
        lines += _aligned(list(HEADER), s.rows) if s.rows else ["  no complete trial yet, so no front"]
        lines += [f"  {n}" for n in s.same] + [f"  paper: {p}" for p in s.papers] + [""]
    header, rows = _summary(sections)
    lines += ["picks:", *_aligned(header, rows), f"{rule.explain()}", TEST_NOTE]
    return "\n".join(lines)


# ---- the figure ---------------------------------------------------------------------------------------------

def _attack_name(attack: str) -> str:
    return "AutoAttack" if attack == "aa" else attack


STAR_APART = 0.04  # stars closer than this (a fraction of the axes) share one label, "2,3,4", that none overlaps


def _near(ax, stars: list[dict]) -> dict[tuple[float, float], list[int]]:
    """The stars' numbers (from 1) grouped by the first star each lies near, in axes fractions."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    groups: dict[tuple[float, float], list[int]] = {}
    for k, p in enumerate(stars, 1):
        at = next((g for g in groups if abs(g[0] - p["avg"]) / (x1 - x0) < STAR_APART
                   and abs(g[1] - p["worst"]) / (y1 - y0) < STAR_APART), (p["avg"], p["worst"]))
        groups.setdefault(at, []).append(k)
    return groups


def draw_fronts(records_by_contender: dict[str, list[dict]], paper_points: dict[str, list[dict]] | None,
                path: Path, key: str = "val", *, attack: str = "", rule: Rule | None = None) -> Path:
    """One PNG: average (x) vs worst-class (y) robust accuracy, one colour a contender; every complete trial a faint
    dot, its front (on split ``key``, under ``attack``) a step line, the front's test points filled, the ``rule``'s
    pick ringed, the papers' reported points (``paper_points``: contender -> :func:`paper_points`) labelled stars."""
    rule = rule or parse_rule(DEFAULT_RULE)
    split = {"val": "validation", "test": "test"}.get(key, key)
    fig, ax = plt.subplots(figsize=(7.5, 5.6))
    handles, stars = [], []
    for i, (contender, records) in enumerate(records_by_contender.items()):
        color = PALETTE[i % len(PALETTE)]
        every = [p for p in map(lambda r: _point(r, key), records) if p]
        if every:
            ax.scatter(*zip(*every), s=14, color=color, alpha=0.25, lw=0, zorder=2)
        front = pareto(records, key)
        if front:
            xs, ys = zip(*(_point(r, key) for r in front))
            # steps-pre: the boundary of what the front dominates (a point beyond a step would beat a front point)
            ax.plot(xs, ys, drawstyle="steps-pre", color=color, lw=1.6, zorder=3)
            ax.plot(xs, ys, ls="none", marker="o", ms=5, mfc="white", mec=color, mew=1.4, zorder=4)
        handles.append(matplotlib.lines.Line2D([], [], color=color, lw=1.6, marker="o", ms=5, mfc="white", mec=color,
                                               label=f"{contender}: front ({split})"))
        tested = [r for r in front if _point(r, "test") if key != "test"]
        for r in tested:  # a thin line from the point that chose it to what the test set measured
            ax.plot(*zip(_point(r, key), _point(r, "test")), color=color, lw=0.6, ls=":", alpha=0.6, zorder=2)
        if tested:
            ax.plot(*zip(*(_point(r, "test") for r in tested)), ls="none", marker="o", ms=6, color=color, zorder=5)
        pick = rule.pick(front, key)
        if pick:
            ax.plot(*_point(pick, key), ls="none", marker="o", ms=13, mfc="none", mec=color, mew=1.5, zorder=6)
        for p in (paper_points or {}).get(contender, []):
            ax.plot(p["avg"], p["worst"], ls="none", marker="*", ms=14, color=color, mec="black", mew=0.6, zorder=7)
            stars.append(p)
            handles.append(matplotlib.lines.Line2D(
                [], [], ls="none", marker="*", ms=11, color=color, mec="black", mew=0.6,
                label=f"{len(stars)}: {contender}, {p['label']} (paper, test, {_attack_name(p.get('attack', ''))})"))
    grey = "0.45"
    test_attacks = sorted({_attack_name(r["test"].get("attack", "")) for rs in records_by_contender.values()
                           for r in rs if r.get("test") and r["test"].get("attack")})
    under = f" under {', '.join(test_attacks)}" if test_attacks else ""
    handles += [matplotlib.lines.Line2D([], [], ls="none", marker="o", ms=4, color=grey, alpha=0.35,
                                        label=f"a trial ({split})"),
                matplotlib.lines.Line2D([], [], ls="none", marker="o", ms=6, color=grey,
                                        label=f"front point, test{under} (evaluated once)"),
                matplotlib.lines.Line2D([], [], ls="none", marker="o", ms=11, mfc="none", mec=grey, mew=1.5,
                                        label=f"pick: {rule.text}")]
    ax.margins(0.08)
    x0, x1 = ax.get_xlim()
    for (x, y), numbers in _near(ax, stars).items():  # a number by the star, its words in the legend: papers crowd
        right = (x - x0) / (x1 - x0) < 0.9  # right of the star, left where it would leave the axes
        ax.annotate(",".join(map(str, numbers)), (x, y), xytext=(6 if right else -6, 3), textcoords="offset points",
                    ha="left" if right else "right", va="bottom", fontsize=8, fontweight="bold", color="0.1",
                    zorder=8, bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.75})
    ax.set_xlabel("average robust accuracy (%)")
    ax.set_ylabel("worst-class robust accuracy (%)")
    ax.grid(alpha=0.3, lw=0.5)
    ax.set_title(f"Fronts on the {split} split{f' under {_attack_name(attack)}' if attack else ''}", fontsize=11)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=2, frameon=False)
    fig.tight_layout()
    return save_figure(fig, path)


# ---- the papers' own points -----------------------------------------------------------------------------------

def contender_parts(contender: str) -> tuple[str, frozenset[str]]:
    """``trades+ccm+ccr+fawa`` -> ("trades", {"ccm", "ccr", "fawa"}): the method and fastfair train's fairness
    flags the contender adds."""
    method, *flags = contender.split("+")
    return method, frozenset(flags)


@functools.cache
def _reported() -> tuple[tuple[str, frozenset[str], str, dict], ...]:
    """(method, flags, data set, point) for every preset whose ``[paper]`` section records average and worst-class
    robust accuracy; its flags are the options it switches on and its weight averaging (``ema``, ``fawa``)."""

    out = []
    for preset in preset_names():
        row = paper.load(preset)
        if row is None or row.evaluated:  # a released model (RST's extra data, ...): not the method as trained here
            continue
        # AutoAttack or PGD, the attacks the fair-AT papers rank by (a weaker one would sit far above every front)
        robust = {a: n for a, n in row.numbers.items()
                  if (a == paper.autoattack.NAME or a.startswith("pgd")) and n.avg is not None and n.worst is not None}
        if not robust:
            continue
        attack = paper.autoattack.NAME if paper.autoattack.NAME in robust else next(iter(robust))  # the strongest
        cfg = config.resolve(preset)
        flags = {*cfg.enabled_options(), *([cfg.train.averaging] if cfg.train.averaging != "none" else [])}
        p = paper.PAPERS[row.source]
        acronym = re.match(r"[A-Z]{2,}\b", p.title)  # "CFA: Class-wise ..." -> CFA; else the authors and year
        short = (acronym[0] if acronym else p.cite.split(" (")[0].split(",")[0]) + \
            (" rebuttal" if "rebuttal" in p.cite else "")
        out.append((cfg.method.name, frozenset(flags), cfg.data.dataset,
                    {"label": f"{short} {row.where}", "avg": robust[attack].avg, "worst": robust[attack].worst,
                     "source": f"{p.cite}, {row.where}, row {row.row!r} (preset {preset})", "attack": attack}))
    return tuple(out)


def paper_points(contender: str, dataset: str) -> list[dict]:
    """The average and worst-class robust accuracy (test split, % under ``attack``: AutoAttack where reported) that
    papers report for ``contender`` on ``dataset``, as recorded in the presets' ``[paper]`` sections: ``{"label":
    "CFA Table 1", "avg", "worst", "source", "attack"}``, one per paper row (presets that differ only in following
    the paper or the authors' code share their row's point); [] where no paper reports one."""
    method, flags = contender_parts(contender)
    out = []
    for m, f, d, point in _reported():
        same = (point["label"], point["avg"], point["worst"], point["attack"])
        if (m, f, d) == (method, flags, dataset) and same not in {(p["label"], p["avg"], p["worst"], p["attack"])
                                                                    for p in out}:
            out.append(point)
    return out
