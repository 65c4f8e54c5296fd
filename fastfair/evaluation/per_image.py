"""Per-image correctness in an evaluation record, and the intervals every number of the record gets from it.

An attack's entry holds ``per_image``: a bit per evaluated image (1: classified correctly after the attack), the
images grouped by true class (class 0's first), each class's in the order of the evaluated data (the record's
``fingerprint.data`` fixes it), packed by ``numpy.packbits`` and written as base64: 10,000 images take 1,668
characters. The class sizes are the confusion matrix's row sums, so the bits need no labels beside them. Two records
of the same data fingerprint whose entries have the same class sizes scored the same images in the same order: their
bits pair image by image (:func:`pair`).

The entry also holds its intervals (:func:`intervals_of`, at :data:`intervals.LEVEL`): ``per_class_interval``,
Wilson's from each class's counts, and ``summary_interval``, a stratified bootstrap over the images of the mean,
worst class, CV, MCD and share correct (:func:`fastfair.evaluation.intervals.bootstrap_measures`). A record from before
the bits gets what its confusion matrices allow (:func:`with_intervals`): each class's Wilson interval and the share
correct's; the mean's too where every class has as many images (then it is the share correct); the worst class, CV
and MCD none, which :func:`missing_note` says.
"""
from __future__ import annotations

import base64

import numpy as np

from fastfair.errors import UserError
from fastfair.evaluation import intervals
from fastfair.evaluation.measures import masked_notes, present

FIELD = "per_image"
SUMMARY_KEYS = ("avg", "overall", "worst", "cv", "mcd")
# what a record says of its intervals (its ``intervals`` key), and a report under its tables
METHOD = {"level": intervals.LEVEL,
          "per_class": "Wilson score interval of each class's counts",
          "summary": f"stratified bootstrap over the images (each class resampled within itself), "
                     f"{intervals.RESAMPLES} resamples, seed 0, percentile interval",
          "worst": intervals.BIASED_LOW,
          "per_image": "a bit per image (1: correct), grouped by true class in data order; numpy.packbits, base64"}


def pack(correct, labels) -> str:
    """``correct`` (bool per image) grouped by ``labels`` (stable: each class's images keep their order), a bit each,
    as base64 text."""
    order = np.argsort(np.asarray(labels), kind="stable")
    return base64.b64encode(np.packbits(np.asarray(correct, dtype=bool)[order])).decode("ascii")


def class_sizes(entry: dict) -> np.ndarray:
    """(C,) images of each class in an entry: its confusion matrix's row sums."""
    return np.asarray(entry["confusion"], dtype=np.int64).sum(axis=1)


def unpack(entry: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(correct, labels) of an entry's images, grouped by class; None for an entry without bits (a record of an older
    fastfair, or a mean over corruptions). Bits that disagree with the confusion matrix are a UserError."""
    if FIELD not in entry:
        return None
    sizes = class_sizes(entry)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    raw = np.frombuffer(base64.b64decode(entry[FIELD]), dtype=np.uint8)
    correct = np.unpackbits(raw, count=len(labels)).astype(bool) if len(raw) * 8 >= len(labels) else None
    diagonal = np.diag(np.asarray(entry["confusion"]))
    if correct is None or not np.array_equal(np.bincount(labels, weights=correct, minlength=len(sizes)), diagonal):
        raise UserError("an evaluation's per-image results disagree with its confusion matrix (a record edited by "
                        "hand?); delete it and evaluate again")
    return correct, labels


def intervals_of(entry: dict, level: float = intervals.LEVEL) -> dict:
    """{"per_class_interval": [[lo, hi] or None per class], "summary_interval": {key: [lo, hi] or None}} of an entry:
    Wilson's per class; the summary's by bootstrap from the bits, else from the confusion matrix what it allows (the
    share correct's Wilson interval, the mean's where the classes are balanced). A mean over corruptions (its
    ``members``) counts each image once per corruption, so no interval treats those counts as independent images."""
    if "members" in entry:
        return {"per_class_interval": [None] * len(entry["per_class"]),
                "summary_interval": dict.fromkeys(SUMMARY_KEYS)}
    conf = np.asarray(entry["confusion"])
    per_class = [None if np.isnan(lo) else _ends(lo, hi) for lo, hi in intervals.confusion_intervals(conf, level)]
    bits = unpack(entry)
    if bits is not None:
        boot = intervals.bootstrap_measures(*bits, len(conf), level=level)
        summary = {k: _ends(*boot[k][1:]) for k in SUMMARY_KEYS}
    else:
        sizes = class_sizes(entry)[present(conf)]
        total = _ends(*intervals.class_interval(int(np.trace(conf)), int(conf.sum()), level))
        summary = {**dict.fromkeys(SUMMARY_KEYS), "overall": total,
                   "avg": total if len(set(sizes.tolist())) == 1 else None}
    return {"per_class_interval": per_class, "summary_interval": summary}


def _ends(lo: float, hi: float) -> list[float]:
    """An interval as a record holds it: four decimals of a percent."""
    return [round(float(lo), 4), round(float(hi), 4)]


def with_intervals(results: dict[str, dict]) -> dict[str, dict]:
    """The entries of a record's ``results``, each with its intervals (its own where it holds them, else
    :func:`intervals_of`)."""
    return {name: entry if "summary_interval" in entry else {**entry, **intervals_of(entry)}
            for name, entry in results.items()}


PERCENT = f"{100 * intervals.LEVEL:.0f} %"
INTERVAL_NOTE = (f"[lo, hi]: {PERCENT} interval; a class's is Wilson's from its counts, the summary rows' a "
                 "stratified bootstrap over the images (the worst class's is biased low: a resample's weakest class is "
                 "weaker than the class weakest on average)")
SEEDS_NOTE = (f"mean ± sd over seeds [lo, hi]: Student's t {PERCENT} interval of the mean over the seeds; one seed: "
              "its own evaluation's interval (Wilson's per class, a stratified bootstrap over the images for the "
              "summary rows)")


def table_notes(results: dict[str, dict]) -> list[str]:
    """The lines under a per-class table of a record's entries (with their intervals): what the intervals are, which
    entries lack some and why, which have bootstrap intervals narrower than their images support, and which attacks
    stalled on masked gradients (:func:`fastfair.evaluation.measures.masked_notes`)."""
    return [INTERVAL_NOTE, *filter(None, (missing_note(results), flat_note(results))), *masked_notes(results)]


FLAT_WIDTH = 5.0  # points: a class at 0 % or 100 % whose Wilson interval is wider holds too few images to be sure


def flat_note(results: dict[str, dict]) -> str:
    """Where a class sits at 0 % or 100 % on few images ('' where none does): such a class is the same in every
    bootstrap resample, so it adds no width to the summary rows' intervals, though its own (Wilson's) is wide."""
    flat = [n for n, e in results.items() if FIELD in e and any(
        ci is not None and v in (0, 100) and ci[1] - ci[0] > FLAT_WIDTH
        for v, ci in zip(e["per_class"], e["per_class_interval"]))]
    if not flat:
        return ""
    return (f"{', '.join(flat)}: a class at 0 % or 100 % of few images is the same in every resample, so the summary "
            "rows' intervals leave out its uncertainty and are too narrow; its own (Wilson's) interval shows it")


def missing_note(results: dict[str, dict]) -> str:
    """The line under a table whose entries lack per-image results ('' when none does)."""
    older = [n for n, e in results.items() if FIELD not in e and "members" not in e]
    pooled = [n for n, e in results.items() if "members" in e]
    said = []
    if older:
        said.append(f"{', '.join(older)}: evaluated by a fastfair without per-image results, so the worst class, CV "
                    "and MCD have no interval (shown without one) and the mean has one only on a balanced split; "
                    "evaluate again for all of them")
    if pooled:
        said.append(f"{', '.join(pooled)}: a mean over corruptions, each image counted once per corruption; see each "
                    "corruption's own intervals")
    return "; ".join(said)


def pair(entry_a: dict, entry_b: dict, attack: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | str:
    """(correct under A, correct under B, labels) of two entries of ``attack`` that scored the same images, image by
    image; else why they do not pair (one line). Each entry names its evaluation's ``data_fingerprint``."""
    fa, fb = entry_a.get("data_fingerprint"), entry_b.get("data_fingerprint")
    if fa is None or fb is None or fa != fb or not np.array_equal(class_sizes(entry_a), class_sizes(entry_b)):
        return (f"not paired under {attack}: the two evaluations scored different test images (their data "
                "fingerprints or image counts differ); evaluate both on the same split and images for a paired "
                "comparison")
    a, b = unpack(entry_a), unpack(entry_b)
    if a is None or b is None:
        return (f"not paired under {attack}: an evaluation by a fastfair without per-image results; evaluate it "
                "again for a paired comparison")
    return a[0], b[0], a[1]
