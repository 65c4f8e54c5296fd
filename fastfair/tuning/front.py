"""The comparison a study writes: each contender's front of average vs worst-class robust accuracy, the rule
that picks one point of a front, the slice of the fronts at a common average, the tables (Markdown and terminal), the
figure and the papers' own points.

Pure functions over plain trial records (no Optuna here: the study turns its trials into these)::

    {"contender": "trades", "number": 3, "params": {"method.kl_weight": 6.0}, "state": "complete",
     "val": {"avg": 48.1, "worst": 22.0, "clean": 80.2, "attack": "pgd10", "images": 1000, "per_class": [100, 100],
             "ci": {"avg": [45.2, 51.0], "worst": [13.0, 31.0]}},
     "test": None, "run": "STUDY/trials/trades/0003"}

Accuracies are in percent; ``state`` is one of :data:`STATES`; ``ci`` holds 95 % intervals (:func:`summarize`;
absent for a trial recorded before intervals); ``per_class`` the fewest and most images of a class. ``test`` is
filled only for the final fronts' points, evaluated once (issue 51: the test set never selects)::

    {"images": 10000, "per_class": [1000, 1000], "classes": 10, "labels": TEXT, "clean": 80.9,
     "attacks": {"pgd10": {"avg": 47.0, "worst": 20.1, "ci": {...}, "correct": TEXT}, "pgd20": {...}}}

one entry per attack (the validation's, the first robust evaluation attack, AutoAttack where asked), ``correct`` each
image's correctness (:func:`encode_bits`; absent where the attack's evaluation keeps none, as AutoAttack's), so two
points scored on the same test images (the same ``labels``, :func:`encode_labels`) are compared pairwise.
"""
from __future__ import annotations

import base64
import functools
import math
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import matplotlib.lines
import matplotlib.pyplot as plt
import numpy as np
from scipy import stats

from fastfair import config
from fastfair.errors import UserError
from fastfair.evaluation import intervals
from fastfair.preset_files import preset_names
from fastfair.reproduce import paper
from fastfair.reports.figures import save_figure
from fastfair.tuning.space import FLAGS, fixed_keys

STATES = ("complete", "pruned", "failed", "running")
# Okabe & Ito 2008, "Color Universal Design": told apart under every common colour-vision deficiency (their
# yellow left out: it vanishes on white)
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#000000")
FLOAT_SLACK = 1e-9  # "within D points" holds for a difference that is D up to float rounding of the percentages
SLICE_BELOW = 1.0  # the common average's default: the smallest of the contenders' best averages less this many points
BOOTSTRAP_SEED = 0  # every interval of a study is seeded, so a comparison written twice reads the same


# ---- the numbers of a record -------------------------------------------------------------------------------

def encode_bits(correct) -> str:
    """Per-image correctness (bool, one per image) as text a JSON record holds: a bit per image, base64."""
    return base64.b64encode(np.packbits(np.asarray(correct, dtype=bool)).tobytes()).decode()


def decode_bits(text: str, images: int) -> np.ndarray:
    """:func:`encode_bits`'s inverse for ``images`` images."""
    return np.unpackbits(np.frombuffer(base64.b64decode(text), dtype=np.uint8), count=images).astype(bool)


def encode_labels(labels) -> str:
    """The class of each image as text (uint16, deflated, base64): two evaluations with the same text scored the
    same images in the same order."""
    return base64.b64encode(zlib.compress(np.asarray(labels, dtype="<u2").tobytes())).decode()


def decode_labels(text: str) -> np.ndarray:
    """:func:`encode_labels`'s inverse."""
    return np.frombuffer(zlib.decompress(base64.b64decode(text)), dtype="<u2").astype(np.int64)


def summarize(correct, labels, classes: int) -> dict:
    """``{"avg", "worst", "ci": {"avg": [lo, hi], "worst": [lo, hi]}}`` from per-image correctness: 95 % intervals
    of a stratified bootstrap over the images, seeded (:func:`fastfair.evaluation.intervals.bootstrap_measures`; the
    worst class's is the bootstrapped minimum, biased low)."""
    m = intervals.bootstrap_measures(correct, labels, classes, seed=BOOTSTRAP_SEED)
    return {"avg": m["avg"][0], "worst": m["worst"][0], "ci": {k: [m[k][1], m[k][2]] for k in ("avg", "worst")}}


def images_of_counts(correct: list[int], total: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(correctness, labels) of images with ``correct[c]`` of ``total[c]`` right in class c: what a stratified
    bootstrap sees of per-class counts (it resamples within each class, so their order is immaterial)."""
    labels = np.repeat(np.arange(len(total)), total)
    right = np.concatenate([np.arange(n) < k for k, n in zip(correct, total)]) if total else np.zeros(0, bool)
    return right, labels


def _measured(record: dict, key: str = "val", attack: str = "") -> dict:
    """The numbers of a record on split ``key``: ``val``, or ``test`` under ``attack`` (default: the validation's
    attack); {} where absent."""
    if key == "val":
        return record.get("val") or {}
    return ((record.get("test") or {}).get("attacks") or {}).get(attack or (record.get("val") or {}).get("attack"),
                                                                  {})


def _point(record: dict, key: str = "val", attack: str = "") -> tuple[float, float] | None:
    """(avg, worst) of a complete record on split ``key`` (under ``attack`` for test); None where either is absent or
    NaN."""
    if record.get("state") != "complete":
        return None
    split = _measured(record, key, attack)
    avg, worst = split.get("avg"), split.get("worst")
    if avg is None or worst is None or math.isnan(avg) or math.isnan(worst):
        return None
    return float(avg), float(worst)


def _bounds(record: dict, stat: str, key: str = "val", attack: str = "") -> tuple[float, float] | None:
    """The interval of ``stat`` (avg, worst, or sum: avg + worst) on split ``key``; None where it has none. The sum's
    adds the two ends, which covers it whenever both intervals cover theirs (at least 90 % for two 95 % intervals,
    Bonferroni)."""
    ci = _measured(record, key, attack).get("ci") or {}
    if stat == "sum":
        parts = [ci.get("avg"), ci.get("worst")]
        return None if None in parts else (parts[0][0] + parts[1][0], parts[0][1] + parts[1][1])
    return tuple(ci[stat]) if ci.get(stat) else None


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


# ---- the rule --------------------------------------------------------------------------------------------------

FORMS = ('"worst@avg-D" (highest worst-class accuracy among points whose average is within D points of the best '
         'average; e.g. worst@avg-1)', '"avg@worst-D" (the same with the two swapped)', '"avg" (highest average)',
         '"worst" (highest worst-class accuracy)', '"sum" (highest average + worst-class, CFA\'s selection)')
DEFAULT_RULE = "worst@avg-1"
_WITHIN = re.compile(r"(avg|worst)@(avg|worst)-(\d+(?:\.\d*)?|\.\d+)")
NAMES = {"avg": "average", "worst": "worst-class", "sum": "average + worst-class"}
# the number that may decide between points tied on the rule's number; for the sum, the average, which the validation
# split measures on all its images (the worst class on one class's)
TIE_BREAK = {"avg": "worst", "worst": "avg", "sum": "avg"}


@dataclass(frozen=True)
class Rule:
    """One point per front, the user's trade-off:

    - ``worst@avg-D``: the highest worst-class accuracy among the points whose average is at most D points below the
      front's best average: "the fairest model that gives up at most D points on average"; the issue's example rule
      (issue 51 item 3), the default with D = 1.
    - ``avg@worst-D``: the highest average among the points whose worst class is at most D points below the best
      worst class.
    - ``avg`` / ``worst``: the highest average / the highest worst class: the front's two ends.
    - ``sum``: the highest average + worst-class accuracy, the checkpoint selection of CFA (Wei et al. 2023, Sec.
      5.1).

    Validation noise: the points whose rule's number differs from the best point's by less than chance gives
    (:func:`same`) are tied with it, since the validation split cannot tell them apart on that number. A tied point
    is picked instead where its gain on the other number (:data:`TIE_BREAK`: the average where the rule's number is
    the worst class or the sum) outweighs its loss on the rule's number, each counted in standard errors of the
    difference (:func:`evidence`): the rule goes by whichever of the two differences the split measures more surely.
    Points without intervals tie with none. ``floor`` (the common-average slice) replaces "within D of the best"
    with "at least ``floor``".
    """

    text: str
    best: str  # the objective maximised: avg | worst | sum
    within: str = ""  # the objective kept within ``slack`` points of its best, or at least ``floor`` ('' for none)
    slack: float = 0.0
    floor: float | None = None

    def candidates(self, front: Iterable[dict], key: str = "val") -> list[dict]:
        """The records of ``front`` the rule chooses among: those with both numbers on split ``key``, within its
        bound."""
        points = [r for r in front if _point(r, key)]
        if self.within:
            at = dict(zip(("avg", "worst"), (0, 1)))[self.within]
            top = max((_point(r, key)[at] for r in points), default=0.0)
            bound = top - self.slack if self.floor is None else self.floor
            points = [r for r in points if _point(r, key)[at] >= bound - FLOAT_SLACK]
        return points

    def _value(self, r: dict, stat: str, key: str) -> float:
        avg, worst = _point(r, key)
        return {"avg": avg, "worst": worst, "sum": avg + worst}[stat]

    def leader(self, front: Iterable[dict], key: str = "val") -> dict | None:
        """The point the rule's number alone picks (ties to the other number, then the lowest trial): the rule
        without noise, as it was before intervals."""
        other = "worst" if self.best == "avg" else "avg" if self.best == "worst" else "worst"
        return max(self.candidates(front, key), key=lambda r: (self._value(r, self.best, key),
                                                               self._value(r, other, key), -r["number"]),
                   default=None)

    def tied(self, front: Iterable[dict], key: str = "val") -> list[dict]:
        """The candidates the validation split cannot tell from :meth:`leader` on the rule's number: :func:`same`."""
        lead = self.leader(front, key)
        if lead is None:
            return []
        return [r for r in self.candidates(front, key) if r is lead or
                same(_bounds(lead, self.best, key), _bounds(r, self.best, key),
                     self._value(lead, self.best, key) - self._value(r, self.best, key))]

    def pick(self, front: Iterable[dict], key: str = "val") -> dict | None:
        """The chosen record of ``front`` (records without both numbers on split ``key`` are skipped); None if none:
        :meth:`leader`, unless a point tied with it (:meth:`tied`) gains more on the other number than it loses on
        the rule's, both in standard errors (:func:`evidence`); of several, the one of the largest net gain."""
        lead, second = self.leader(front, key), TIE_BREAK[self.best]

        def net(r: dict) -> float:
            gain = evidence(_bounds(r, second, key), _bounds(lead, second, key),
                            self._value(r, second, key) - self._value(lead, second, key))
            loss = evidence(_bounds(r, self.best, key), _bounds(lead, self.best, key),
                            self._value(lead, self.best, key) - self._value(r, self.best, key))
            return gain - loss

        return max(self.tied(front, key), key=lambda r: (0.0 if r is lead else net(r), r is lead, -r["number"]),
                   default=None)

    def explain(self) -> str:
        """Two sentences for a reader of the comparison: what the rule picks, and how it weighs noise."""
        name = NAMES
        if self.within and self.floor is not None:
            what = (f"the highest {name[self.best]} accuracy among the front's points whose {name[self.within]} "
                    f"accuracy is at least {self.floor:.1f}")
        elif self.within:
            what = (f"the highest {name[self.best]} accuracy among the front's points whose {name[self.within]} "
                    f"accuracy is at most {self.slack:g} point(s) below the front's best {name[self.within]} "
                    f"accuracy")
        else:
            what = f"the front's point of highest {name[self.best]} accuracy" + (
                " (CFA's checkpoint selection, Wei et al. 2023 Sec. 5.1)" if self.best == "sum" else "")
        return (f"rule {self.text}: {what}. Points whose validation {name[self.best]} accuracy differs from the "
                f"best point's by less than chance gives (1.96 standard errors of the difference, from their 95 % "
                f"intervals) are tied with it, and a tied point is picked instead where its gain in "
                f"{name[TIE_BREAK[self.best]]} accuracy outweighs its loss, both in standard errors.")


Z95 = float(stats.norm.ppf(0.975))  # the two-sided 95 % quantile of the standard normal


def standard_error(a: tuple[float, float] | None, b: tuple[float, float] | None) -> float | None:
    """The standard error of the difference of two estimates with 95 % intervals ``a`` and ``b``: each estimate's
    taken from its interval as (hi - lo) / (2 x 1.96), the two combined as independent (Altman & Bland 2003, BMJ
    326:219, "Interaction revisited: the difference between two estimates"). Two models scored on the same images
    err together, so this overstates the noise of their difference. None without both intervals."""
    if a is None or b is None:
        return None
    return math.hypot(a[1] - a[0], b[1] - b[0]) / (2 * Z95)


def same(a: tuple[float, float] | None, b: tuple[float, float] | None, difference: float) -> bool:
    """Whether a difference of two estimates with 95 % intervals ``a`` and ``b`` is within what chance gives: at most
    1.96 :func:`standard_error` (which errs towards a tie). No tie without both intervals."""
    se = standard_error(a, b)
    return se is not None and abs(difference) <= Z95 * se + FLOAT_SLACK


def evidence(a: tuple[float, float] | None, b: tuple[float, float] | None, difference: float) -> float:
    """A difference in standard errors (:func:`standard_error`); 0 where it has none or it is 0 (an interval of width
    0, as a bootstrap gives a class all right or all wrong, measures no noise, so it weighs nothing)."""
    se = standard_error(a, b)
    return difference / se if se else 0.0


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


# ---- worst class at a common average ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Slice:
    """Each contender's best worst class among its front's points whose validation average is at least
    ``threshold`` (shared by all), and each contender's paired test difference from the first one with a point."""

    threshold: float | None
    why: str  # how the threshold was set
    picks: dict[str, dict | None]
    base: str  # the contender the others are compared with ('' for none)
    # contender -> attack -> {"avg": (d, lo, hi), "worst": (d, lo, hi)}, or a sentence saying why there is none
    differences: dict[str, dict[str, dict | str]] = field(default_factory=dict)


def common_slice(records_by_contender: dict[str, list[dict]], at: float | None = None) -> Slice:
    """The comparison at a common average ``at`` (default: the smallest of the contenders' best validation averages,
    less :data:`SLICE_BELOW` points): each contender's point by the rule "worst@avg>=A" (noise weighed as
    :class:`Rule` does), chosen on validation numbers; the test numbers of two contenders' points are paired
    image by image (:func:`fastfair.evaluation.intervals.paired_difference`)."""
    fronts = {c: pareto(rs) for c, rs in records_by_contender.items()}
    bests = {c: max(_point(r)[0] for r in f) for c, f in fronts.items() if f}
    if not bests:
        return Slice(None, "no contender has a front yet", {c: None for c in fronts}, "")
    if at is None:
        low = min(bests, key=bests.get)
        at = bests[low] - SLICE_BELOW
        why = (f"the smallest of the contenders' best validation averages ({low}: {bests[low]:.1f}) less "
               f"{SLICE_BELOW:g} point")
    else:
        why = "--at-avg"
    rule = Rule(f"worst@avg>={at:.1f}", "worst", "avg", floor=at)
    picks = {c: rule.pick(f) for c, f in fronts.items()}
    base = next((c for c, p in picks.items() if p is not None), "")
    differences = {c: {a: _paired(p, picks[base], a) for a in _test_attacks([p, picks[base]])}
                   for c, p in picks.items() if p is not None and c != base}
    return Slice(at, why, picks, base, differences)


def _paired(a: dict, b: dict, attack: str) -> dict | str:
    """A's test numbers under ``attack`` minus B's, paired image by image, or why they cannot be."""
    ta, tb = a.get("test") or {}, b.get("test") or {}
    ma, mb = _measured(a, "test", attack), _measured(b, "test", attack)
    if not ma or not mb:
        return "not evaluated on the test set"
    if "correct" not in ma or "correct" not in mb:
        return "no per-image record under this attack, so not paired"
    if ta.get("labels") != tb.get("labels"):
        return "not on the same test images, so not paired"
    n = ta["images"]
    d = intervals.paired_difference(decode_bits(ma["correct"], n), decode_bits(mb["correct"], n),
                                    decode_labels(ta["labels"]), ta["classes"], seed=BOOTSTRAP_SEED)
    return {k: d[k] for k in ("avg", "worst")}


def _verdict(d: tuple[float, float, float]) -> str:
    """``higher`` or ``lower`` where the interval excludes 0, else ``cannot tell``: a point difference alone is not
    called."""
    return "higher" if d[1] > 0 else "lower" if d[2] < 0 else "cannot tell (the interval holds 0)"


# ---- tables ------------------------------------------------------------------------------------------------

def _num(split: dict | None, stat: str) -> str:
    """``48.1 [45.2, 51.0]``: the number and its interval; the number alone where it has none; '-' where absent."""
    value = (split or {}).get(stat)
    if value is None or math.isnan(value):
        return "-"
    ci = ((split or {}).get("ci") or {}).get(stat)
    return f"{value:.1f} [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else f"{value:.1f}"


def _signed(d: tuple[float, float, float]) -> str:
    return f"{d[0]:+.1f} [{d[1]:+.1f}, {d[2]:+.1f}]"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items())) \
        or "-"


def budget_line(records: list[dict]) -> str:
    """``budget: N trials (C complete, P stopped early, F failed)``, and the running ones where there are any."""
    n = {s: sum(r.get("state") == s for r in records) for s in STATES}
    running = f", {n['running']} running" if n["running"] else ""
    return (f"budget: {len(records)} trials ({n['complete']} complete, {n['pruned']} stopped early, "
            f"{n['failed']} failed{running})")


def attack_name(attack: str) -> str:
    """An attack as the comparison names it: ``aa`` is AutoAttack."""
    return "AutoAttack" if attack == "aa" else attack


def _val_attack(records: Iterable[dict]) -> str:
    return next((r["val"]["attack"] for r in records if (r.get("val") or {}).get("attack")), "")


def _test_attacks(records: Iterable[dict]) -> list[str]:
    """The attacks the records were tested under, in the order of their first appearance."""
    return list(dict.fromkeys(a for r in records for a in ((r.get("test") or {}).get("attacks") or {})))


def _header(val_attack: str, attacks: list[str]) -> list[str]:
    under = f" ({attack_name(val_attack)})" if val_attack else ""
    return ["trial", "params", f"val avg{under}", f"val worst{under}",
            *(f"test {s} ({attack_name(a)})" for a in attacks for s in ("avg", "worst"))]


def _row(r: dict, picked: bool, attacks: list[str]) -> list[str]:
    return [f"{r['number']}{' (pick)' if picked else ''}", _params(r.get("params", {})), _num(r.get("val"), "avg"),
            _num(r.get("val"), "worst"),
            *(_num(_measured(r, "test", a), s) for a in attacks for s in ("avg", "worst"))]


def _spread(low: int, high: int) -> str:
    return f"{low:,}" if low == high else f"{low:,}-{high:,}"


def sizes_line(records: Iterable[dict]) -> str:
    """The splits' sizes and what the intervals are, as the comparison states them."""
    records = list(records)
    val = next((r["val"] for r in records if (r.get("val") or {}).get("images")), None)
    test = next((r["test"] for r in records if (r.get("test") or {}).get("images")), None)
    parts = [f"validation split: {val['images']:,} images ({_spread(*val['per_class'])} a class)" if val else
             "validation split: its size was not recorded (trials of an older fastfair)"]
    if test:
        parts.append(f"test split: {test['images']:,} images ({_spread(*test['per_class'])} a class)")
    return ("; ".join(parts) + ". [lo, hi]: 95 % intervals of a stratified bootstrap over the images (seeded); the "
            "worst class's bootstraps the minimum, which is biased low.")


@dataclass(frozen=True)
class _Section:
    """One contender's part of the comparison, as both renderings show it."""

    contender: str
    rows: list[list[str]]
    pick: dict | None
    budget: str
    same: list[str]  # "trials 5, 7 reached trial 3's point"
    papers: list[str]
    others: list[str]  # papers' rows of a variant the trials are not (label smoothing, ...)
    unmeasured: bool  # a front point without a validation interval (a trial recorded before intervals)


def _star_label(p: dict) -> str:
    return f"{p['label']}, test, {attack_name(p.get('attack', ''))}, {p.get('model', '?')}"


def _sections(records_by_contender: dict[str, list[dict]], rule: Rule, paper_points: dict[str, list[dict]] | None,
              attacks: list[str]) -> list[_Section]:
    out = []
    for contender, records in records_by_contender.items():
        front = pareto(records)
        pick = rule.pick(front)
        _, same = _equal_points(records)
        on_front = {r["number"] for r in front}
        notes = [f"trial{'s' * (len(v) > 1)} {', '.join(map(str, v))} reached trial {k}'s validation point and "
                 f"{'are' if len(v) > 1 else 'is'} not listed (equal points keep the lowest trial number)"
                 for k, v in sorted(same.items()) if k in on_front]
        tied = rule.tied(front)
        if len(tied) > 1:
            numbers = ", ".join(str(n) for n in sorted(r["number"] for r in tied))
            notes.append(f"the validation split cannot tell trials {numbers} apart on {NAMES[rule.best]} "
                         f"accuracy: the pick weighs their {NAMES[TIE_BREAK[rule.best]]} accuracy too (the rule "
                         f"below)")
        points = (paper_points or {}).get(contender, [])
        papers = [f"{p['label']}: avg {p['avg']:.1f}, worst {p['worst']:.1f} (test, "
                  f"{attack_name(p.get('attack', ''))}, {p.get('model', '?')})" for p in points if not p.get("differs")]
        others = [f"{p['label']} is not shown: that run set "
                  + ", ".join(f"{k} = {v[0]!r}" for k, v in p["differs"].items())
                  + ", which this study's trials keep at "
                  + ", ".join(f"{v[1]!r}" for v in p["differs"].values()) for p in points if p.get("differs")]
        out.append(_Section(contender, [_row(r, r is pick, attacks) for r in front], pick, budget_line(records),
                            notes, papers, others, any(_bounds(r, "avg") is None for r in front)))
    return out


TEST_NOTE = ("val numbers (validation split) chose the fronts, the picks and the slice's points; test numbers were "
             "measured once, on the final fronts' points only, and chose nothing.")
UNMEASURED = ("a point without an interval is a trial recorded by an older fastfair (no per-class counts): the rule "
              "ties nothing with it")


def _summary(sections: list[_Section], attacks: list[str], val_attack: str) -> tuple[list[str], list[list[str]]]:
    header = ["contender", *_header(val_attack, attacks)]
    rows = [[s.contender, *(_row(s.pick, False, attacks) if s.pick else ["-"] * (len(header) - 1))]
            for s in sections]
    return header, rows


def _slice_tables(sl: Slice, attacks: list[str], val_attack: str) -> tuple[list[str], list[list[str]], list[str]]:
    """The slice as (header, rows, sentences): each contender's point and, under each test attack, its difference
    from the base contender."""
    header = ["contender", *_header(val_attack, attacks)[:1], *_header(val_attack, attacks)[2:],
              *(f"{s} - {sl.base} ({attack_name(a)})" for a in attacks for s in ("avg", "worst"))]
    rows, said = [], []
    for c, p in sl.picks.items():
        if p is None:
            rows.append([c, "-", *["-"] * (len(header) - 2)])
            continue
        diffs = sl.differences.get(c, {})
        cells = []
        for a in attacks:
            d = diffs.get(a)
            cells += [_signed(d[s]) if isinstance(d, dict) else "-" for s in ("avg", "worst")]
            if isinstance(d, dict):
                said.append(f"under {attack_name(a)}, {c} minus {sl.base}: worst class {_signed(d['worst'])} points, "
                            f"{_verdict(d['worst'])}; average {_signed(d['avg'])} points, {_verdict(d['avg'])}")
            elif isinstance(d, str):
                said.append(f"under {attack_name(a)}, {c} vs {sl.base}: {d}")
        row = _row(p, False, attacks)
        rows.append([c, row[0], *row[2:], *(cells if c != sl.base else ["(base)"] * len(cells))])
    return header, rows, said


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [f"| {' | '.join(header)} |", f"|{'|'.join('---' for _ in header)}|",
            *(f"| {' | '.join(row)} |" for row in rows)]


def _slice_intro(sl: Slice) -> str:
    if sl.threshold is None:
        return f"No slice: {sl.why}."
    return (f"The highest validation worst-class accuracy of each contender among its front's points whose "
            f"validation average is at least A = {sl.threshold:.1f} ({sl.why}); ties weighed as the rule weighs "
            f"them. Each contender's test numbers minus {sl.base}'s, paired image by image (the same test images): "
            f"a difference is called higher or lower only when its 95 % interval excludes 0.")


def comparison_markdown(records_by_contender: dict[str, list[dict]], rule: Rule,
                        paper_points: dict[str, list[dict]] | None = None, at: float | None = None) -> str:
    """The comparison as Markdown: the splits' sizes; per contender its front's points with their intervals (the
    rule's pick marked), its budget and the papers' reported points (``paper_points``: contender ->
    :func:`paper_points`); each contender's pick in one table; the worst class at a common average (``at``,
    :func:`common_slice`); and what the rule and the two splits mean."""
    every = [r for rs in records_by_contender.values() for r in rs]
    attacks, val_attack = _test_attacks(every), _val_attack(every)
    sections = _sections(records_by_contender, rule, paper_points, attacks)
    lines = ["# Fronts: average vs worst-class robust accuracy", "", sizes_line(every), ""]
    for s in sections:
        lines += [f"## {s.contender}", "", s.budget, ""]
        lines += _markdown_table(_header(val_attack, attacks), s.rows) if s.rows else \
            ["no complete trial yet, so no front"]
        notes = s.same + ([UNMEASURED] if s.unmeasured else []) + [f"paper: {p}" for p in s.papers] + s.others
        lines += [""] + [f"- {n}" for n in notes] + ([""] if notes else [])
    header, rows = _summary(sections, attacks, val_attack)
    lines += ["## Picks", "", *_markdown_table(header, rows), "", f"The pick: {rule.explain()}", ""]
    sl = common_slice(records_by_contender, at)
    lines += ["## Worst class at a common average", "", _slice_intro(sl), ""]
    if sl.threshold is not None:
        header, rows, said = _slice_tables(sl, attacks, val_attack)
        lines += [*_markdown_table(header, rows), "", *(f"- {s}" for s in said), *([""] if said else [])]
    lines += [TEST_NOTE, ""]
    return "\n".join(lines)


def _aligned(header: list[str], rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(c) for c in col) for col in zip(header, *rows)]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (header, *rows)]


def comparison_text(records_by_contender: dict[str, list[dict]], rule: Rule,
                    paper_points: dict[str, list[dict]] | None = None, at: float | None = None) -> str:
    """The same comparison as plain aligned text, for the terminal (``fastfair tune STUDY --show``)."""
    every = [r for rs in records_by_contender.values() for r in rs]
    attacks, val_attack = _test_attacks(every), _val_attack(every)
    sections = _sections(records_by_contender, rule, paper_points, attacks)
    lines = [sizes_line(every), ""]
    for s in sections:
        lines += [f"{s.contender}: {s.budget}"]
        lines += _aligned(_header(val_attack, attacks), s.rows) if s.rows else ["  no complete trial yet, so no front"]
        notes = s.same + ([UNMEASURED] if s.unmeasured else []) + [f"paper: {p}" for p in s.papers] + s.others
        lines += [f"  {n}" for n in notes] + [""]
    header, rows = _summary(sections, attacks, val_attack)
    lines += ["picks:", *_aligned(header, rows), f"{rule.explain()}", ""]
    sl = common_slice(records_by_contender, at)
    lines += ["worst class at a common average:", f"  {_slice_intro(sl)}"]
    if sl.threshold is not None:
        header, rows, said = _slice_tables(sl, attacks, val_attack)
        lines += [*_aligned(header, rows), *(f"  {s}" for s in said)]
    lines += ["", TEST_NOTE]
    return "\n".join(lines)


# ---- the figure ---------------------------------------------------------------------------------------------

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


def _error_bars(ax, records: list[dict], key: str, attack: str, color: str, **style) -> None:
    """Each record's 95 % intervals on split ``key`` as thin cross bars (avg across, worst up and down)."""
    for r in records:
        x, y = _point(r, key, attack)
        for stat, draw in (("avg", ax.hlines), ("worst", ax.vlines)):
            b = _bounds(r, stat, key, attack)
            if b:
                draw(y if stat == "avg" else x, *b, color=color, lw=0.7, **style)


def draw_fronts(records_by_contender: dict[str, list[dict]], paper_points: dict[str, list[dict]] | None,
                path: Path, *, attack: str = "", rule: Rule | None = None) -> Path:
    """One PNG: average (x) vs worst-class (y) robust accuracy under ``attack`` (the validation's), one colour a
    contender; every complete trial a faint dot, its validation front a step line with each point's 95 % intervals,
    the front's test points under the same attack filled with theirs, the ``rule``'s pick ringed, the
    papers' reported points (``paper_points``: contender -> :func:`paper_points`; other attacks and models) numbered
    stars."""
    rule = rule or parse_rule(DEFAULT_RULE)
    fig, ax = plt.subplots(figsize=(7.5, 5.8))
    handles, stars = [], []
    for i, (contender, records) in enumerate(records_by_contender.items()):
        color = PALETTE[i % len(PALETTE)]
        every = [p for p in map(_point, records) if p]
        if every:
            ax.scatter(*zip(*every), s=14, color=color, alpha=0.25, lw=0, zorder=2)
        front = pareto(records)
        if front:
            xs, ys = zip(*map(_point, front))
            # steps-pre: the boundary of what the front dominates (a point beyond a step would beat a front point)
            ax.plot(xs, ys, drawstyle="steps-pre", color=color, lw=1.6, zorder=3)
            _error_bars(ax, front, "val", "", color, alpha=0.3, zorder=3)
            ax.plot(xs, ys, ls="none", marker="o", ms=5, mfc="white", mec=color, mew=1.4, zorder=4)
        handles.append(matplotlib.lines.Line2D([], [], color=color, lw=1.6, marker="o", ms=5, mfc="white", mec=color,
                                               label=f"{contender}: front (validation)"))
        tested = [r for r in front if _point(r, "test", attack)]
        for r in tested:  # a thin line from the point that chose it to what the test set measured
            ax.plot(*zip(_point(r), _point(r, "test", attack)), color=color, lw=0.6, ls=":", alpha=0.6, zorder=2)
        _error_bars(ax, tested, "test", attack, color, alpha=0.55, zorder=4)
        if tested:
            ax.plot(*zip(*(_point(r, "test", attack) for r in tested)), ls="none", marker="o", ms=6, color=color,
                    zorder=5)
        pick = rule.pick(front)
        if pick:
            ax.plot(*_point(pick), ls="none", marker="o", ms=13, mfc="none", mec=color, mew=1.5, zorder=6)
        for p in (paper_points or {}).get(contender, []):
            if p.get("differs"):
                continue
            ax.plot(p["avg"], p["worst"], ls="none", marker="*", ms=14, color=color, mec="black", mew=0.6, zorder=7)
            stars.append(p)
            handles.append(matplotlib.lines.Line2D([], [], ls="none", marker="*", ms=11, color=color, mec="black",
                                                   mew=0.6, label=f"{len(stars)}: {contender}, {_star_label(p)}"))
    grey = "0.45"
    under = f" under {attack_name(attack)}" if attack else ""
    handles += [matplotlib.lines.Line2D([], [], ls="none", marker="o", ms=4, color=grey, alpha=0.35,
                                        label="a trial (validation)"),
                matplotlib.lines.Line2D([], [], ls="none", marker="o", ms=6, color=grey,
                                        label=f"front point, test{under} (evaluated once)"),
                matplotlib.lines.Line2D([], [], ls="none", marker="o", ms=11, mfc="none", mec=grey, mew=1.5,
                                        label=f"pick: {rule.text}"),
                matplotlib.lines.Line2D([], [], color=grey, lw=0.8, label="95 % intervals (bootstrap)")]
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
    ax.set_title(f"Fronts (validation) and their test points{under}" + ("; stars: the papers' own attacks"
                                                                           if stars else ""), fontsize=11)
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
    robust accuracy; its flags are the options it switches on and its weight averaging (``ema``, ``fawa``); the
    point holds the model and the preset's values of the keys no range searches (``keys``)."""

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
        keys = {k: config.value_of(cfg, k) for k in fixed_keys(cfg.method.name, sorted(flags))}
        out.append((cfg.method.name, frozenset(flags), cfg.data.dataset,
                    {"label": f"{short} {row.where}", "avg": robust[attack].avg, "worst": robust[attack].worst,
                     "source": f"{p.cite}, {row.where}, row {row.row!r} (preset {preset})", "attack": attack,
                     "model": cfg.model.name, "keys": keys}))
    return tuple(out)


def paper_points(contender: str, dataset: str, trials: config.Config | None = None) -> list[dict]:
    """The average and worst-class robust accuracy (test split, % under ``attack``: AutoAttack where reported) that
    papers report for ``contender`` on ``dataset``, as recorded in the presets' ``[paper]`` sections: ``{"label":
    "CFA Table 1", "avg", "worst", "source", "attack", "model", "differs"}``, one per paper row (presets that differ
    only in following the paper or the authors' code share their row's point). ``differs``: the keys no range searches
    (:func:`fastfair.tuning.space.fixed_keys`) that the paper's run set otherwise than the study's ``trials`` (their
    config; default: the contender's defaults), as {key: (paper's, trials')}: a row with label smoothing is not a
    plain TRADES point. [] where no paper reports one."""
    method, flags = contender_parts(contender)
    if trials is None:
        trials = config.resolve(None, None, {"method.name": method, **{k: v for f in flags for k, v in
                                                                         FLAGS.get(f, {}).items()}})
    ours = {k: config.value_of(trials, k) for k in fixed_keys(method, sorted(flags))}
    out: list[dict] = []
    for m, f, d, point in _reported():
        if (m, f, d) != (method, flags, dataset):
            continue
        differs = {k: (v, ours[k]) for k, v in point["keys"].items() if k in ours and ours[k] != v}
        mine = {**{k: v for k, v in point.items() if k != "keys"}, "differs": differs}
        same = [i for i, p in enumerate(out) if (p["label"], p["avg"], p["worst"], p["attack"]) ==
                (mine["label"], mine["avg"], mine["worst"], mine["attack"])]
        if not same:
            out.append(mine)
        elif out[same[0]]["differs"] and not differs:  # the paper's and the code's preset: the one the trials match
            out[same[0]] = mine
    return out
