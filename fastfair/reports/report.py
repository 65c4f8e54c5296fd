"""``fastfair report RUN_DIR [RUN_DIR ...]``: a Markdown report with PNG figures and LaTeX tables.

Reads run directories only (the contract between train, eval, report and grid): ``config.toml``,
``metrics.jsonl``, ``eval/*.json`` and ``diagnostics/*.json``. Runs whose configs differ only in
``train.seed`` (and where they ran) form one group, reported as mean +- std over its seeds. A group is
named by its runs' ``--label`` or folder names; what sets the groups apart is a table of config keys.
:func:`compare` is the comparison table on its own (``fastfair grid`` prints it).
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastfair.config import flatten, tomllib
from fastfair.errors import UserError
from fastfair import data, display
from fastfair.data.subsets import dropped_note
from fastfair.data.superclasses import superclass_order
from fastfair.evaluation import intervals, measures, per_image
from fastfair.methods import METHODS
from fastfair.reports import figures
from fastfair.rundir import RunDir, check_writable, notice, one_based_epoch, read_json, write_text_atomic

# Keys that differ between seeds of one experiment, or between machines, without changing it.
NOT_THE_EXPERIMENT = ("train.seed", "train.device", "train.progress", "preset")
ATTACK_PREFERENCE = ("aa",)  # the robust column defaults to AutoAttack when every run has it


@dataclass
class Run:
    path: Path
    config: dict
    epochs: list[dict]
    evals: dict[str, dict]  # eval file stem (<checkpoint>-<split>) -> record
    diagnostics: list[dict]
    label: str  # what the report calls it: its --label, else its folder's name
    labelled: bool = False  # the label was given (--label), not taken from the folder

    def evaluations(self, split: str) -> list[tuple[str, dict]]:
        """(file stem, record) of every evaluation on ``split`` of the checkpoint the run selects (``train.select``;
        else of the first checkpoint evaluated on it): its whole test set's first, then its subsets (``eval
        --per-class N``, AutoAttack's first look), the most images first."""
        run = RunDir(self.path)
        chosen = run.eval_file(run.selected_checkpoint(self.config.get("train.select", "pgd")), split).stem
        on_split = {stem: r for stem, r in self.evals.items() if r.get("split") == split}
        if not any(_checkpoint_of(stem) == _checkpoint_of(chosen) for stem in on_split):
            chosen = next(iter(on_split), chosen)
        mine = [(stem, r) for stem, r in on_split.items() if _checkpoint_of(stem) == _checkpoint_of(chosen)]
        return sorted(mine, key=lambda sr: (sr[0] != chosen, -sr[1].get("images", 0)))

    def eval_record(self, split: str) -> dict | None:
        """The run's evaluations on ``split`` (:meth:`evaluations`) as one record: the first's, with each attack
        that only a subset evaluated taken from the largest such subset, its entry marked ``subset`` (what it scored);
        every entry names its evaluation's data fingerprint (``data_fingerprint``), so two runs pair only on the same
        images (:func:`fastfair.evaluation.per_image.pair`)."""
        found = self.evaluations(split)
        if not found:
            return None
        (_, first), results = found[0], {}
        for stem, rec in found:
            for name, entry in rec["results"].items():
                if name not in results:
                    subset = _subset_of(rec) if rec is not first else ""
                    results[name] = {**entry, "data_fingerprint": rec.get("fingerprint", {}).get("data"),
                                     **({"subset": subset} if subset else {})}
        return {**first, "results": results, "evaluations": [stem for stem, _ in found]}


def _checkpoint_of(stem: str) -> str:
    """The checkpoint of an eval file's stem, ``<checkpoint>-<split>[-first<N>]``."""
    return stem.split("-")[0]


def _subset_of(record: dict) -> str:
    """What a subset evaluation scored: ``the first 20 test images of each class (200)``."""
    cap = record.get("test_per_class", 0)
    return f"the first {cap} {record['split']} images of each class ({record['images']})" if cap else \
        f"{record['images']} {record['split']} images"


def load_run(path, label: str | None = None) -> Run:
    run = RunDir(path)
    config = flatten(tomllib.loads(run.read_config()))  # raw TOML: a run's config outlives renamed keys
    run.read_history()  # not shown, but checked: a changed line, or one of another run, is refused
    evals = {}
    for p in run.eval_files():
        record = read_json(p, run.again(p))
        stale = run.stale_eval(p, record)
        if stale:  # its numbers are not the checkpoint's any more: said, and not reported as the checkpoint's
            notice(f"warning: {stale}; left out of the report")
        else:
            evals[p.stem] = record
    diags = [read_json(p, run.again(p)) for p in run.diagnostics_files()]
    return Run(run.path, config, run.read_metrics(), evals, diags, label or run.path.name, label is not None)


@dataclass
class Group:
    label: str
    runs: list[Run]
    apart: str = ""  # why these runs are not in the group of another with the same config (:func:`group_runs`)

    @property
    def seeds(self) -> list[int]:
        return [_seed(r) for r in self.runs]

    @property
    def config(self) -> dict:
        """The experiment's config: what its runs share (every key but the seed and where they ran)."""
        return {k: v for k, v in self.runs[0].config.items() if k not in NOT_THE_EXPERIMENT}


def _experiment(run: Run) -> tuple:
    return tuple(sorted((k, json.dumps(v)) for k, v in run.config.items() if k not in NOT_THE_EXPERIMENT))


# a seed in a folder name: "at-s1", "trades_seed2", a grid's "method=trades,seed=0"
_SEED_TAG = re.compile(r"(^|[-_,.])(?:seed|s)[=_-]?\d+(?=$|[-_,.])")


def _group_label(runs: list[Run]) -> str:
    """The one label its runs share; else their labels without a seed tag when that makes them one
    ("at-s0", "at-s1" -> "at"); else all of them."""
    labels = list(dict.fromkeys(r.label for r in runs))
    if len(labels) == 1:
        return labels[0]
    bare = {_SEED_TAG.sub("", label).strip("-_,.") for label in labels}
    return bare.pop() if len(bare) == 1 and "" not in bare else " / ".join(labels)


def _unique_labels(groups: list[Group]) -> None:
    """Two groups named alike: a label given twice is an error (those runs differ in more than the seed);
    folder names get their parent folder ("a/run", "b/run"), then a number."""
    for label in {g.label for g in groups}:
        same = [g for g in groups if g.label == label]
        if len(same) < 2:
            continue
        if any(r.labelled for g in same for r in g.runs) and not any(g.apart for g in same):
            shown, implied = differences(same)
            keys = ", ".join((shown + implied)[:4])
            raise UserError(f"--label {label!r} names runs whose configs differ in more than the seed ({keys}); "
                            "give them different labels")
        for g in same:
            g.label = f"{g.runs[0].path.parent.name}/{g.label}"
        if len({g.label for g in same}) < len(same):
            for i, g in enumerate(same, 1):
                g.label = f"{label} ({i})"


def _seed(run: Run) -> int:
    return run.config.get("train.seed", 0)


def _images(run: Run, split: str) -> str | None:
    """The data fingerprint of the images the run's evaluation on ``split`` scored (None: not evaluated)."""
    found = run.evaluations(split)
    return found[0][1].get("fingerprint", {}).get("data") if found else None


def _run_id(run: Run) -> str | None:
    return RunDir(run.path).saved_config().run_id


def _scored(run: Run, split: str) -> str:
    """What a run's evaluation on ``split`` scored, for the line that says why it stands apart."""
    found = run.evaluations(split)
    if not found:
        return f"no {split} evaluation"
    rec = found[0][1]
    absent = rec.get("absent_classes") or []
    return (f"{rec.get('images', '?')} {split} images" + (f" without classes {', '.join(map(str, absent))}"
                                                           if absent else "")
            + f" (data {str(rec.get('fingerprint', {}).get('data', '?'))[:8]})")


def group_runs(runs: list[Run], split: str = "test") -> list[Group]:
    """Runs whose configs differ only in seed form one group, named by its runs' labels (unique), when they were
    scored on the same ``split`` images (their evaluation's data fingerprint) and each seed is in it once. A run of
    the same config scored on other images, or repeating a seed (a copy of a run, or the same seed trained again,
    which measures no spread between seeds), forms a group of its own whose ``apart`` says why."""
    images = {id(run): _images(run, split) for run in runs}
    keyed: dict[tuple, list[list[Run]]] = {}
    for run in runs:
        parts = keyed.setdefault(_experiment(run), [])
        home = next((p for p in parts if images[id(p[0])] == images[id(run)] and _seed(run) not in map(_seed, p)), None)
        if home is None:
            parts.append([run])
        else:
            home.append(run)
    groups = []
    for parts in keyed.values():
        first = None
        for members in parts:
            group = Group(_group_label(members), members)
            if first is not None:
                group.apart = _apart(first, group, split)
            first = first or group
            groups.append(group)
    _unique_labels(groups)
    return groups


def _apart(first: Group, group: Group, split: str) -> str:
    """Why ``group`` (the same config as ``first``) is not in ``first``'s group."""
    run, other = group.runs[0], first.runs[0]
    if _images(run, split) != _images(other, split):
        return (f"the same config as {first.label}, scored on other {split} images: {_scored(run, split)} where "
                f"{first.label} has {_scored(other, split)}; kept apart, and their numbers do not compare row by row")
    seed = _seed(run)
    twin = next(r for r in first.runs if _seed(r) == seed)
    same_id = _run_id(run) is not None and _run_id(run) == _run_id(twin)
    what = f"a copy of {twin.path} (the same run id)" if same_id else f"the same seed as {twin.path}"
    return (f"{what}: seed {seed} again is not another seed (it would count one model twice in the mean ± sd); "
            "kept apart")


def differences(groups: list[Group]) -> tuple[list[str], list[str]]:
    """(keys whose values differ between the groups, those of them that merely follow from each group's
    method defaults, e.g. TRADES' own attack settings)."""
    configs = [g.config for g in groups]
    differing = sorted({k for c in configs for k in c if len({json.dumps(d.get(k)) for d in configs}) > 1})

    def implied(k: str) -> bool:
        names = [c.get("method.name") for c in configs]
        return k != "method.name" and all(n in METHODS and METHODS.get(n).defaults.get(k, object()) == c.get(k)
                                           for n, c in zip(names, configs))

    return [k for k in differing if not implied(k)], [k for k in differing if implied(k)]


def _value(value) -> str:
    """A config value as its TOML text (strings bare), "-" where a config lacks the key."""
    text = "-" if value is None else value if isinstance(value, str) else json.dumps(value)
    return text.replace("|", "\\|")


def differences_table(groups: list[Group], latex: bool = False) -> str:
    """Markdown (or a LaTeX tabular): rows the config keys that set the groups apart, columns the groups; a line
    (a LaTeX comment) names the keys left out because each method's defaults set them."""
    shown, implied = differences(groups)
    if not shown and not implied:
        same = "The groups' configs are the same (they differ in where they ran only)."
        return f"% {same}" if latex else same + "\n"
    rows = [[k, *(_value(g.config.get(k)) for g in groups)] for k in shown]
    also = f"Also different, as each method's defaults set them: {', '.join(implied)}." if implied else ""
    if latex:
        esc = measures.latex_label
        lines = [r"\begin{tabular}{l " + "l " * len(groups) + "}", r"\toprule",
                 "config key & " + " & ".join(esc(g.label) for g in groups) + r" \\", r"\midrule"]
        lines += [r"\texttt{" + esc(k) + "} & " + " & ".join(esc(v.replace("\\|", "|")) for v in values) + r" \\"
                  for k, *values in rows]
        return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"] + ([f"% {esc(also)}"] if also else []))
    lines = ["| config key | " + " | ".join(g.label for g in groups) + " |", "|---|" + "---|" * len(groups)]
    lines += [f"| `{k}` | " + " | ".join(values) + " |" for k, *values in rows]
    note = ("\nAlso different, as each method's defaults set them: " + ", ".join(f"`{k}`" for k in implied) + ".\n"
            if implied else "\n")
    return "\n".join(lines) + "\n" + note


@dataclass(frozen=True)
class Cell:
    """A number of the comparison: a run's value with its interval, or the mean over a group's seeds with their sd
    and the mean's t interval (:func:`fastfair.evaluation.intervals.seed_interval`); lo/hi None: no interval."""
    mean: float
    sd: float | None = None
    lo: float | None = None
    hi: float | None = None


PERCENT_RANGE = (0.0, 100.0)  # what an accuracy, or MCD, can be
CV_RANGE = (0.0, math.inf)  # a variance


def _seeds(values, bounds: tuple[float, float] | None = PERCENT_RANGE) -> tuple[float, float, float, float]:
    """:func:`fastfair.evaluation.intervals.seed_interval`, its interval cut to the ``bounds`` the value can take (None:
    any): with two or three seeds Student's t reaches past them."""
    mean, sd, lo, hi = intervals.seed_interval(values)
    if bounds is None or math.isnan(lo):
        return mean, sd, lo, hi
    return mean, sd, max(lo, bounds[0]), min(hi, bounds[1])


def _cell(values: list[float], interval=None, bounds: tuple[float, float] | None = PERCENT_RANGE) -> Cell:
    """The :class:`Cell` of one number over a group's seeds (:func:`_seeds`); ``interval``: the one seed's own
    (lo, hi) or None."""
    if len(values) > 1:
        return Cell(*_seeds(values, bounds))
    return Cell(values[0], None, *(interval or (None, None)))


def _fmt(cell: Cell, latex: bool = False, digits: int = 2) -> str:
    """``42.00 ± 2.83 [34.6, 49.4]`` (LaTeX: ``$42.00 \\pm 2.83$ [34.6, 49.4]``); '-' for an undefined value."""
    if cell.mean is None or (isinstance(cell.mean, float) and math.isnan(cell.mean)):
        return "-"
    text = f"{cell.mean:.{digits}f}"
    if cell.sd is not None and not math.isnan(cell.sd):
        text = f"${text} \\pm {cell.sd:.{digits}f}$" if latex else f"{text} ± {cell.sd:.{digits}f}"
    if cell.lo is not None and not math.isnan(cell.lo):
        ends = max(1, digits - 1)
        text += f" [{cell.lo:.{ends}f}, {cell.hi:.{ends}f}]"
    return text


def choose_attack(records: list[dict], attack: str | None) -> str:
    """The robust attack every record has: ``attack`` if given, else AutoAttack, else the first non-clean one."""
    common = [n for n in records[0]["results"] if all(n in r["results"] for r in records)]
    if attack:
        if attack not in common:
            raise UserError(f"not every run was evaluated with {attack!r}; attacks all runs have: {', '.join(common)}. "
                            f"Run: fastfair eval RUN_DIR --attacks {attack}")
        return attack
    for name in (*ATTACK_PREFERENCE, *common):
        if name in common and name != "clean":
            return name
    raise UserError("the runs share no robust evaluation; run: fastfair eval RUN_DIR --attacks clean,pgd20")


def _records(groups: list[Group], split: str) -> dict[int, list[dict]]:
    out = {}
    for i, g in enumerate(groups):
        recs = [r.eval_record(split) for r in g.runs]
        missing = [str(r.path) for r, rec in zip(g.runs, recs) if rec is None]
        if missing:
            raise UserError(f"no {split} evaluation in {', '.join(missing)}; "
                            f"run: fastfair eval RUN_DIR --split {split}")
        out[i] = recs
    return out


# avg: mean of per-class accuracies; share: share of all test images correct (what the papers' tables report)
COLUMNS = ("clean avg", "clean worst", "{a} avg", "{a} share", "{a} worst", measures.CV_LABEL, "MCD", "rho")


def comparison_rows(groups: list[Group], attack: str | None = None, baseline: int | None = None,
                    split: str = "test") -> tuple[str, list[dict]]:
    """(attack, per group: label, seeds, and a :class:`Cell` per column); rho against group ``baseline``."""
    recs = _records(groups, split)
    attack = choose_attack([r for rs in recs.values() for r in rs], attack)
    rows = []
    for i, g in enumerate(groups):
        values, cis = {c: [] for c in COLUMNS[:-1]}, {}
        for rec in recs[i]:
            shown = per_image.with_intervals({n: rec["results"][n] for n in ("clean", attack) if n in rec["results"]})
            clean, rob = shown.get("clean"), shown[attack]
            for column, entry, key in (("clean avg", clean, "avg"), ("clean worst", clean, "worst"),
                                       ("{a} avg", rob, "avg"), ("{a} share", rob, "overall"),
                                       ("{a} worst", rob, "worst"), (measures.CV_LABEL, rob, "cv"),
                                       ("MCD", rob, "mcd")):
                # a record without a clean evaluation, or from before the share correct (issue 13), has none
                values[column].append(entry["summary"].get(key, float("nan")) if entry else float("nan"))
                cis[column] = entry["summary_interval"].get(key) if entry else None
        rows.append({"label": g.label, "seeds": g.seeds, "raw": values,
                     **{c: _cell(v, cis[c], CV_RANGE if c == measures.CV_LABEL else PERCENT_RANGE)
                        for c, v in values.items()}})
    for row in rows:
        if baseline is None:
            row["rho"] = Cell(float("nan"))
            continue
        base = rows[baseline]
        per_seed = [measures.rho(a, w, base["{a} avg"].mean, base["{a} worst"].mean)
                    for a, w in zip(row["raw"]["{a} avg"], row["raw"]["{a} worst"])]
        row["rho"] = _cell(per_seed, bounds=None)
    return attack, rows


def _table(attack: str, rows: list[dict], baseline: int | None, latex: bool) -> str:
    heads = ["run", "seeds"] + [c.format(a=attack) for c in COLUMNS]
    body = []
    for i, row in enumerate(rows):
        label = row["label"] + (" (baseline)" if i == baseline else "")
        cells = [label, str(len(row["seeds"]))]
        for c in COLUMNS:
            undefined = c == "rho" and baseline is not None and math.isnan(row[c].mean)  # rho_note says why
            cells.append("n/a" if undefined else _fmt(row[c], latex, 3 if c == "rho" else 2))
        body.append(cells)
    if not latex:
        lines = ["| " + " | ".join(heads) + " |", "|---|---:|" + "---:|" * len(COLUMNS)]
        return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in body])
    esc = measures.latex_label
    lines = [r"\begin{tabular}{l r " + "r " * len(COLUMNS) + "}", r"\toprule",
             " & ".join(esc(h) for h in heads) + r" \\", r"\midrule"]
    lines += [" & ".join([esc(cells[0])] + cells[1:]) + r" \\" for cells in body]
    return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"])


def interval_lines(groups: list[Group], recs: dict[int, list[dict]], attack: str) -> list[str]:
    """The lines under the comparison: what its intervals are, and per group an evaluation on a subset of the images
    or without per-image results (whose intervals are wider, or some missing)."""
    parts = (["a group of seeds: mean ± sd over its seeds [Student's t interval of the mean]"]
             if any(len(g.runs) > 1 for g in groups) else [])
    parts += (["a single run: [a stratified bootstrap over its test images] (the worst class's is biased low: a "
               "resample's weakest class is weaker than the class weakest on average; rho has none)"]
              if any(len(g.runs) == 1 for g in groups) else [])
    out = [f"Intervals ({per_image.PERCENT}): " + "; ".join(parts) + "."]
    for i, g in enumerate(groups):
        for rec in recs[i]:
            shown = {n: rec["results"][n] for n in ("clean", attack) if n in rec["results"]}
            subset = [f"{n} on {e['subset']}" for n, e in shown.items() if e.get("subset")]
            missing = per_image.missing_note(shown) if len(g.runs) == 1 else ""  # seeds: a t interval needs no bits
            where = g.label if len(g.runs) == 1 else f"{g.label} ({Path(rec['checkpoint']).parents[1].name})"
            if subset:
                out.append(f"{where}: {', '.join(subset)}, a subset evaluation (wider intervals).")
            if missing:
                out.append(f"{where}: {missing}.")
    return out


def rho_note(attack: str, rows: list[dict], baseline: int | None) -> str:
    """Why the rho column holds no number: no baseline, or a baseline whose worst class is at 0 %."""
    if baseline is None:
        return " rho needs a baseline: fastfair report RUN_DIR... --baseline RUN_DIR."
    if rows[baseline]["{a} worst"].mean == 0:
        return (f" rho is n/a: the baseline's worst class has 0 % {attack} accuracy, and rho divides by it (a gain "
                "relative to 0 is undefined).")
    return ""


def critical_lines(groups: list[Group], recs: dict, base: int | None, attack: str, classes: list[str]) -> list[str]:
    """Per group trained with a critical class (cost_sensitive.critical, Benz et al. 2021, Sec. 3.3): that class's
    gain and the other classes' mean and largest loss against the baseline, clean and under ``attack``."""
    out = []
    for i, g in enumerate(groups):
        k = g.config.get("cost_sensitive.critical", -1)
        if base is None or i == base or k < 0:
            continue
        parts = []
        for name in ("clean", attack):
            if all(name in r["results"] for r in recs[i] + recs[base]):
                c = measures.critical_class_change(_per_class_mean(recs[i], name)[0],
                                                   _per_class_mean(recs[base], name)[0], k)
                parts.append(f"{name} {c['gain']:+.2f} points, the other classes {-c['others_mean_loss']:+.2f} on "
                             f"average and {-c['others_worst_loss']:+.2f} at worst ({classes[c['worst_other']]})")
        out.append(f"{g.label}: critical class {classes[k]} against {groups[base].label}: {'; '.join(parts)}.")
    return out


def compare(run_dirs, baseline=None, attack: str | None = None, split: str = "test", latex: bool = False,
            labels: list[str] | None = None) -> str:
    """The comparison table (clean and robust average and worst class, CV, MCD, rho against ``baseline``)
    of the runs in ``run_dirs`` (named by ``labels``, else their folders), each number with its interval, seeds
    aggregated as mean ± sd with a t interval; Markdown, or LaTeX with ``latex``; the lines under it say what the
    intervals are."""
    groups, base = _groups_with_baseline(run_dirs, baseline, labels, split)
    attack, rows = comparison_rows(groups, attack, base, split)
    recs = _records(groups, split)
    classes = recs[0][0]["classes"]
    notes = interval_lines(groups, recs, attack)
    # a grid of re-trainings without a class each (tian-kdd-fig4-homing): their worst class is most likely that one
    notes += [f"{g.label}: {note}." for g in groups for note in (g.apart, _dropped_note(g.runs[0], classes)) if note]
    notes += critical_lines(groups, recs, base, attack, classes)
    notes = [f"% {line}" if latex else line for line in notes]
    return "\n".join([_table(attack, rows, base, latex), *([""] + notes if notes else [])])


def _pairs(groups: list[Group], base: int | None) -> list[tuple[int, int]]:
    """(A, B) of each paired comparison, read A minus B: the first group against each other (``report A B``), or
    each group against the baseline."""
    if base is None:
        return [(0, j) for j in range(1, len(groups))]
    return [(j, base) for j in range(len(groups)) if j != base]


def _signed(cell: tuple[float, float, float]) -> str:
    """``+2.10 [0.8, 3.4]``: a difference in points with its interval."""
    point, lo, hi = cell
    return f"{point:+.2f} [{lo:+.1f}, {hi:+.1f}]"


def _beats(a: str, b: str, name: str, cell: tuple[float, float, float], what: str) -> str:
    """The verdict on a difference A minus B: who beats whom only where its interval excludes 0."""
    point, lo, hi = cell
    if lo > 0 or hi < 0:
        winner, loser = (a, b) if lo > 0 else (b, a)
        return (f"{winner}'s {what} beats {loser}'s under {name}: {a} − {b} = {_signed(cell)} points, its "
                f"{per_image.PERCENT} interval excludes 0.")
    return (f"Under {name}, {a}'s and {b}'s {what} do not differ beyond chance: {a} − {b} = {_signed(cell)} points, "
            "its interval holds 0.")


def paired_section(groups: list[Group], recs: dict[int, list[dict]], attack: str,
                   base: int | None) -> tuple[list[str], list[str]]:
    """(Markdown lines, the lines a terminal hears) comparing runs evaluated on the same images, image by image: the
    difference of the mean and of the worst-class accuracy with a paired stratified bootstrap interval
    (:func:`fastfair.evaluation.intervals.paired_difference`) and, per class, McNemar's exact test with Holm's
    adjustment over the classes; groups of the same seeds pair seed by seed (a t interval of the per-seed
    differences). Runs scored on different images are not paired, in one line."""
    md, said = ["## Paired comparison (the same test images, image by image)\n"], []
    classes = recs[0][0]["classes"]
    for a, b in _pairs(groups, base):
        la, lb = groups[a].label, groups[b].label
        md.append(f"### {la} − {lb}\n")
        names = [n for n in dict.fromkeys(("clean", attack)) if all(n in r["results"] for r in recs[a] + recs[b])]
        if len(recs[a]) != len(recs[b]) or (len(recs[a]) > 1 and groups[a].seeds != groups[b].seeds):
            line = (f"{la} − {lb}: not paired: {la} has seeds {groups[a].seeds} and {lb} {groups[b].seeds}; pairing "
                    "needs one run a side, or the same seeds; compare their intervals in the table above.")
            md.append(line + "\n")
            said.append(line)
            continue
        rows, verdicts, mcnemar = [], [], {}
        for name in names:
            pairs = [per_image.pair(ra["results"][name], rb["results"][name], name)
                     for ra, rb in zip(recs[a], recs[b])]
            refused = next((p for p in pairs if isinstance(p, str)), None)
            if refused:
                verdicts.append(f"{la} − {lb}: {refused}.")
                continue
            if len(pairs) == 1:
                diff = intervals.paired_difference(*pairs[0], len(classes))
                mcnemar[name] = pairs[0]
            else:  # seed by seed on the same images: each seed's difference, a t interval over them
                diff = {}
                for k in ("avg", "worst"):
                    m, _, lo, hi = intervals.seed_interval([ra["results"][name]["summary"][k] -
                                                            rb["results"][name]["summary"][k]
                                                            for ra, rb in zip(recs[a], recs[b])])
                    diff[k] = (m, lo, hi)
            rows.append(f"| {name} | {_signed(diff['avg'])} | {_signed(diff['worst'])} |")
            verdicts.append(_beats(la, lb, name, diff["worst"], "worst class"))
        if rows:
            how = ("a paired stratified bootstrap over the images" if len(recs[a]) == 1
                   else f"Student's t over the {len(recs[a])} seeds' differences, each seed's runs on the same images")
            md.append("\n".join([f"| attack | mean of per-class accuracies, {la} − {lb} | worst class, {la} − {lb} |",
                                 "|---|---:|---:|", *rows]) +
                      f"\n\nPoints, with {per_image.PERCENT} intervals by {how}; each side's worst class is its own "
                      "weakest class in each resample (biased low on both sides).\n")
        md += [line + "\n" for line in verdicts]
        said += verdicts
        for name, (ca, cb, labels) in mcnemar.items():
            md += _mcnemar_table(la, lb, name, ca, cb, labels, classes)
    return md, said


def _mcnemar_table(la: str, lb: str, name: str, ca, cb, labels, classes: list[str]) -> list[str]:
    """Per class under ``name``: both accuracies, the images right under one side only, McNemar's exact p and Holm's
    adjusted p over the classes."""
    p = intervals.class_mcnemar(ca, cb, labels, len(classes))
    adjusted = intervals.holm(p)
    rows = [f"| class | {la} | {lb} | right under {la} only | right under {lb} only | p (McNemar, exact) | "
            "p (Holm) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k, cname in enumerate(classes):
        mine = labels == k
        if not mine.any():
            rows.append(f"| {cname} | - | - | - | - | - | - |")
            continue
        rows.append(f"| {cname} | {100 * ca[mine].mean():.2f} | {100 * cb[mine].mean():.2f} | "
                    f"{int((ca & ~cb)[mine].sum())} | {int((~ca & cb)[mine].sum())} | {p[k]:.3g} | "
                    f"{adjusted[k]:.3g} |")
    return [f"Per class under {name}, paired on each image (McNemar's exact test on the images the two classify "
            f"differently; Holm's adjustment over the {int((~np.isnan(p)).sum())} classes):\n", "\n".join(rows) + "\n"]


def _checked_labels(run_dirs, labels: list[str] | None) -> list[str | None]:
    if not labels:
        return [None] * len(run_dirs)
    if len(labels) != len(run_dirs):
        raise UserError(f"{len(labels)} --label for {len(run_dirs)} runs: give one --label per RUN_DIR, in their "
                        "order (or none: runs are then named by their folders)")
    if not all(label.strip() for label in labels):
        raise UserError("--label is empty; give each run a name, e.g. --label TRADES")
    return [label.strip() for label in labels]


def _groups_with_baseline(run_dirs, baseline, labels: list[str] | None = None,
                          split: str = "test") -> tuple[list[Group], int | None]:
    named = dict(zip((Path(p).resolve() for p in run_dirs), _checked_labels(run_dirs, labels)))
    if baseline is not None and Path(baseline).resolve() not in named:
        named = {Path(baseline).resolve(): None, **named}
    if not named:
        raise UserError("fastfair report needs at least one RUN_DIR")
    groups = group_runs([load_run(p, label) for p, label in named.items()], split)
    if baseline is None:
        return groups, None
    target = Path(baseline).resolve()
    return groups, next(i for i, g in enumerate(groups) if any(r.path.resolve() == target for r in g.runs))


# ---- the full report --------------------------------------------------------------------------

def _per_class_mean(recs: list[dict], attack: str) -> tuple[list[float], list[float] | None]:
    arr = np.asarray([r["results"][attack]["per_class"] for r in recs], dtype=float)
    return arr.mean(0).tolist(), (arr.std(0, ddof=1).tolist() if len(arr) > 1 else None)


def _curves(runs: list[Run]) -> tuple[list[int], dict, str | None]:
    """Validation average / worst-class accuracy over epochs, mean over the seeds that reached each epoch."""
    runs = [r for r in runs if r.epochs]
    if not runs:
        return [], {}, None
    n = min(len(r.epochs) for r in runs)
    epochs = [e["epoch"] for e in runs[0].epochs[:n]]
    val_attack = next((k for k in runs[0].epochs[0]["val"] if k != "clean"), None)
    lines = {}
    for name in ("clean", val_attack):
        if name is None:
            continue
        for stat in ("avg", "worst"):
            vals = np.asarray([[e["val"][name][stat] for e in r.epochs[:n]] for r in runs], dtype=float)
            lines[f"val {name} {'average' if stat == 'avg' else 'worst class'}"] = (
                vals.mean(0).tolist(), vals.std(0, ddof=1).tolist() if len(runs) > 1 else None)
    return epochs, lines, val_attack


def _varying_vectors(run: Run) -> dict[str, np.ndarray]:
    """Per-class vectors (eps_k, alpha_k, beta_k, ...) that change over epochs or classes: (epochs, C) arrays."""
    out = {}
    for name in (run.epochs[0].get("vectors", {}) if run.epochs else {}):
        v = np.asarray([e["vectors"][name] for e in run.epochs], dtype=float)
        if np.ptp(v) > 0:
            out[name] = v
    return out


def _relative(path: Path, out: Path) -> str:
    """``path`` as the report in ``out`` links it: relative, so the report's folder can move or be committed
    beside its runs."""
    return Path(os.path.relpath(Path(path).resolve(), Path(out).resolve())).as_posix()


def _figure_md(path: Path, out: Path, caption: str) -> str:
    return f"![{caption}]({_relative(path, out)})\n"


def _subset_lines(groups: list[Group], classes: list[str]) -> list[str]:
    """A line above the comparison for every group that is a quick run (part of its data set), was trained
    without some classes (its worst class is likely one of them), or stands apart from runs of its config."""
    return [f"**{g.label}: {note}.**\n" for g in groups
            for note in (g.apart, _subset_note(g.runs[0]), _dropped_note(g.runs[0], classes)) if note]


def default_out(groups: list[Group]) -> Path:
    """Where a report goes without --out: RUN/report for one run; for several, beside the first run, in a
    folder named for what it compares (``runs/report-at-vs-trades``), so reports of other runs stay."""
    first = groups[0].runs[0].path
    if len(groups) == 1 and len(groups[0].runs) == 1:
        folder = first / "report"
    else:
        names = [re.sub(r"[^\w.+=-]+", "_", g.label) for g in groups]
        name = "report-" + "-vs-".join(names)
        if len(name) > 80:
            name = f"report-{names[0]}-vs-{len(names) - 1}-more" if len(names) > 1 else name[:80]
        folder = first.parent / name
    return Path(os.path.relpath(folder)) if folder.is_relative_to(Path.cwd()) else folder  # as the user typed it


def write_report(run_dirs, out=None, baseline=None, attack: str | None = None, split: str = "test",
                 labels: list[str] | None = None, echo=None) -> Path:
    """Write ``out/report.md``, ``out/tables.tex`` and ``out/figures/*.png`` (``out``: :func:`default_out`
    when not given); returns the report's path. The report names its files relative to itself, so its
    folder can move. ``echo`` hears the paired comparisons' verdicts (:func:`paired_section`)."""
    groups, base = _groups_with_baseline(run_dirs, baseline, labels, split)
    out = Path(out) if out else default_out(groups)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; a report is a folder (report.md, tables.tex, figures/): give a "
                        f"folder's path, e.g. --out {out.with_suffix('')}-report")
    fig_dir = check_writable(out / "figures", "write the report elsewhere: --out DIR")
    attack, rows = comparison_rows(groups, attack, base, split)
    recs = _records(groups, split)
    classes = recs[0][0]["classes"]
    md = ["# fastfair report\n", f"Split: **{split}**; robust columns: **{attack}**; "
          f"{sum(len(g.runs) for g in groups)} run(s) in {len(groups)} group(s) (runs differing only in the seed "
          f"are one group, shown as mean ± sd over the seeds with a t interval).\n", *_subset_lines(groups, classes),
          "## Comparison\n",
          _table(attack, rows, base, False) + "\n",
          "avg = mean of the per-class accuracies; share = share of all test images correct (the two differ on an "
          "unbalanced split). "
          f"{measures.CV_NOTE}; MCD = max a − min a; both of the robust per-class accuracy; rho = relative "
          f"worst-class gain + relative average change against the baseline (WAT/DAFA).{rho_note(attack, rows, base)}"
          "\n", *(line + "\n" for line in interval_lines(groups, recs, attack)),
          *(line + "\n" for line in critical_lines(groups, recs, base, attack, classes))]
    tex = ["% fastfair report tables (booktabs)",
           *(f"% {line.strip().strip('*')}" for line in _subset_lines(groups, classes)),
           f"% comparison, split {split}, robust attack {attack}",
           _table(attack, rows, base, True),
           *(f"% {measures.latex_label(line)}" for line in interval_lines(groups, recs, attack))]
    if len(groups) > 1:
        notes = [_subset_note(g.runs[0]) for g in groups]
        shared = notes[0] if len(set(notes)) == 1 else ""  # every group the same quick run: the title says it
        series = {g.label + (" (quick run)" if n and not shared else ""): _bars(group_entry(recs[i], attack))
                  for i, (g, n) in enumerate(zip(groups, notes))}
        several = [len(g.runs) > 1 for g in groups]
        errors = (f"{per_image.PERCENT} t interval over each group's seeds" if all(several) else
                  _errors_legend(1) if not any(several) else
                  f"{per_image.PERCENT} interval (Wilson for a single run, t over a group's seeds)")
        p = figures.per_class_bars(classes, series, f"per-class {attack} accuracy" + (f" ({shared})" if shared else ""),
                                   fig_dir / "compare-per-class.png", errors=errors)
        md.append(_figure_md(p, out, f"per-class {attack} accuracy of every group, with {errors}"))
        paired, said = paired_section(groups, recs, attack, base)
        md += paired
        for line in said if echo is not None else []:
            echo(line)
        md += ["What sets the groups apart (config keys):\n", differences_table(groups)]
        tex += ["% what sets the groups apart (config keys)", differences_table(groups, latex=True)]
    md += _discrepancy(groups, recs, attack, classes, out, fig_dir)
    for i, g in enumerate(groups):
        md += _group_section(i, g, recs[i], attack, classes, out, fig_dir, tex)
    write_text_atomic("\n".join(md), out / "report.md")
    write_text_atomic("\n\n".join(tex) + "\n", out / "tables.tex")
    return out / "report.md"


def _group_section(i: int, g: Group, recs: list[dict], attack: str, classes: list[str], out: Path, fig_dir: Path,
                   tex: list[str]) -> list[str]:
    tag = f"g{i}"
    md = [f"## {g.label}\n", "Runs: " + ", ".join(f"[`{r.path.name}`]({_relative(r.path, out)}) (seed {s})"
                                                 for r, s in zip(g.runs, g.seeds)) + "\n"]
    note = _subset_note(g.runs[0])
    label = f"{g.label} ({note})" if note else g.label  # a figure cut out of the report still says it
    for said in (note, _dropped_note(g.runs[0], classes)):
        if said:
            md.append(f"**{said[0].upper() + said[1:]}.**\n")
    attacks = [n for n in recs[0]["results"] if all(n in r["results"] for r in recs)]
    table = {_column(n, recs[0]["results"][n]): group_entry(recs, n) for n in attacks}
    eps = f", eps {display.eps_text(recs[0]['eps'])}" if "eps" in recs[0] else ""
    seeds = f"mean over {len(recs)} seeds" if len(recs) > 1 else "one seed"
    md.append(f"Per-class accuracy (%), checkpoint `{Path(recs[0]['checkpoint']).stem}` (epoch "
              f"{one_based_epoch(recs[0])}){eps}, {seeds}; evaluations: "
              f"{', '.join(f'`{e}`' for e in recs[0].get('evaluations', []))}:\n")
    md.append(measures.markdown_table(table, classes) + "\n")
    notes = group_notes(recs, attacks) + _elsewhere(g, recs)
    md += [line + "\n" for line in notes]
    tex.append(f"% per-class accuracy (%), {g.label}\n" + _per_class_latex(table, classes)
               + "".join(f"\n% {measures.latex_label(line)}" for line in notes))
    p = figures.per_class_bars(classes, {n: _bars(e) for n, e in table.items()}, f"{label}: per-class accuracy",
                               fig_dir / f"{tag}-per-class.png", errors=_errors_legend(len(recs)))
    md.append(_figure_md(p, out, f"per-class accuracy under every evaluated attack ({', '.join(table)}), with "
                                 f"{_errors_legend(len(recs))}"))
    conf = np.mean([measures.confusion_percent(r["results"][attack]["confusion"]) for r in recs], axis=0)
    order, blocks = class_order(classes)
    p = figures.heatmap(_ordered(conf, order), [classes[k] for k in order],
                        f"{label}: {attack} confusion (% of true class)", fig_dir / f"{tag}-confusion.png",
                        cbar="% of the true class", blocks=blocks)
    md.append(_figure_md(p, out, f"robust confusion matrix under {attack}"
                                 + (", classes grouped by CIFAR-100 super-class" if blocks else "")))
    epochs, lines, val_attack = _curves(g.runs)
    if lines:
        selected = (one_based_epoch(recs[0]), Path(recs[0]["checkpoint"]).stem)
        p = figures.curves(epochs, lines, f"{label}: validation accuracy ({val_attack})",
                           fig_dir / f"{tag}-curves.png", selected=selected)
        md.append(_figure_md(p, out, "training curves: average and worst-class validation accuracy; the dotted "
                                     "line marks the evaluated checkpoint's epoch"))
        md += _class_curves(tag, label, g.runs, val_attack, classes, selected[0], out, fig_dir)
        for name, v in _varying_vectors(g.runs[0]).items():
            p = figures.per_class_curves(epochs, v[: len(epochs)], classes, f"{label}: per-class {name}",
                                         fig_dir / f"{tag}-vector-{name}.png", name)
            md.append(_figure_md(p, out, f"per-class {name} over epochs"))
    diag = next((d for r in g.runs for d in r.diagnostics), None)
    if diag:
        md += _diagnostics_section(tag, label, diag, out, fig_dir)
    return md


def _subset_note(run: Run) -> str:
    c = run.config
    return data.subset_note(c.get("data.dataset", "?"), c.get("data.train_per_class", 0),
                            c.get("data.test_per_class", 0))


def _dropped_note(run: Run, classes: list[str]) -> str:
    return dropped_note(run.config.get("data.drop_classes", []), classes)


def _per_class_latex(table: dict, classes: list[str]) -> str:
    names = list(table)
    esc = measures.latex_label
    lines = [r"\begin{tabular}{l " + "r " * len(names) + "}", r"\toprule",
             "class & " + " & ".join(esc(n) for n in names) + r" \\", r"\midrule"]
    for c, cname in enumerate(classes):
        lines.append(esc(cname) + " & " + " & ".join(esc(measures.class_cell(table[n], c)) for n in names) + r" \\")
    lines.append(r"\midrule")
    for key, label in measures.SUMMARY_ROWS:
        lines.append(esc(label) + " & " + " & ".join(map(esc, measures.summary_cells(table, names, key))) + r" \\")
    note = measures.absent_note(measures.table_absent(table, classes))  # as the Markdown table says it
    return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"] + ([esc(note)] if note else []))


def group_entry(recs: list[dict], attack: str) -> dict:
    """A group's entry under ``attack`` for a per-class table: one seed's own, with its intervals
    (:func:`fastfair.evaluation.per_image.with_intervals`); for several seeds, each per-class accuracy and summary
    value's mean over the seeds with their sd (``per_class_sd``, ``summary_sd``) and Student's t interval of the
    mean (:func:`_seeds`)."""
    entries = [per_image.with_intervals({attack: r["results"][attack]})[attack] for r in recs]
    if len(entries) == 1:
        return entries[0]
    per_class = [_seeds(col) for col in np.asarray([e["per_class"] for e in entries], dtype=float).T]
    keys = [k for k in per_image.SUMMARY_KEYS if all(k in e["summary"] for e in entries)]
    summary = {k: _seeds([e["summary"][k] for e in entries], CV_RANGE if k == "cv" else PERCENT_RANGE) for k in keys}
    return {"per_class": [m for m, _, _, _ in per_class], "per_class_sd": [sd for _, sd, _, _ in per_class],
            "per_class_interval": [None if np.isnan(lo) else [lo, hi] for _, _, lo, hi in per_class],
            "summary": {k: v[0] for k, v in summary.items()}, "summary_sd": {k: v[1] for k, v in summary.items()},
            "summary_interval": {k: [v[2], v[3]] for k, v in summary.items()},
            **({"subset": entries[0]["subset"]} if "subset" in entries[0] else {}),
            # the header's flag: images whose gradients stalled the attack, over the seeds
            **({measures.MASKED: sum(e.get(measures.MASKED, 0) for e in entries)}
               if any(e.get(measures.MASKED) for e in entries) else {})}


def _column(name: str, entry: dict) -> str:
    """An attack's column in a per-class table: its name, ``(subset)`` where it scored part of the test set."""
    return f"{name} (subset)" if entry.get("subset") else name


def group_notes(recs: list[dict], attacks: list[str]) -> list[str]:
    """The lines under a group's per-class table: what its intervals are, each subset column's images, and the
    entries of an older fastfair (without per-image results)."""
    first = {n: recs[0]["results"][n] for n in attacks}
    out = [per_image.SEEDS_NOTE] if len(recs) > 1 else [per_image.INTERVAL_NOTE]
    out += [f"{n} (subset): on {e['subset']} only (a subset evaluation, so wider intervals)"
            for n, e in first.items() if e.get("subset")]
    for rec in recs:
        shown = per_image.with_intervals({n: rec["results"][n] for n in attacks})
        out += [line for line in per_image.table_notes(shown)[1:] if line not in out]
    return out


def _elsewhere(g: Group, recs: list[dict]) -> list[str]:
    """A line per run naming its evaluations these tables leave out (another checkpoint, such as the averaged
    model's, or another split), with their attacks, so none is left out without a word."""
    out = []
    for run, rec in zip(g.runs, recs):
        shown = set(rec.get("evaluations", []))
        rest = [f"`{stem}` ({', '.join(r['results'])})" for stem, r in run.evals.items() if stem not in shown]
        if rest:
            out.append(f"{run.path.name} also holds {', '.join(rest)}, not in these tables: `fastfair report` "
                       "shows the checkpoint the run selects on the split asked for (--split)")
    return out


def _bars(entry: dict) -> tuple[list[float], figures.Interval]:
    """An entry's per-class accuracies and their intervals, as :func:`figures.per_class_bars` draws them."""
    ci = [c if c is not None else [np.nan, np.nan] for c in entry["per_class_interval"]]
    return entry["per_class"], figures.Interval([c[0] for c in ci], [c[1] for c in ci])


def _errors_legend(seeds: int) -> str:
    """What a per-class figure's error bars are."""
    return (f"{per_image.PERCENT} t interval over {seeds} seeds" if seeds > 1
            else f"{per_image.PERCENT} interval (Wilson)")


def _diagnostics_section(tag: str, label: str, d: dict, out: Path, fig_dir: Path) -> list[str]:
    classes, atk = d["classes"], d["attack"]
    md = [f"### Diagnostics (`{Path(d['checkpoint']).stem}`, {d['split']}, {atk})\n"]
    rows = ["| class | CVC clean | CVC adv | entropy clean | entropy adv | inter-class sim. (nearest) | "
            "intra-class var. | weight norm |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    cell = measures.accuracy_cell  # '-' for an absent class's null (NaN in a record from before)
    for k, cname in enumerate(classes):
        rows.append(f"| {cname} | {cell(d['cvc']['clean'][k], 4)} | {cell(d['cvc']['adv'][k], 4)} | "
                    f"{cell(d['entropy']['clean']['per_class'][k], 3)} | "
                    f"{cell(d['entropy']['adv']['per_class'][k], 3)} | "
                    f"{cell(d['inter_class_similarity']['adv'][k], 3)}{_nearest(d['nearest_class']['adv'][k], classes)}"
                    f" | {cell(d['intra_class_variance']['adv'][k], 4)} | {d['weight_norms'][k]:.3f} |")
    md.append("\n".join(rows) + "\n")
    if d.get("absent_classes"):
        md.append(measures.absent_note(d["absent_classes"]) + "\n")
    rc = {tag: measures.correlation_text(v) for tag, v in d["weight_norm_rank_correlation"].items()}
    md.append(f"Mean prediction entropy: clean {d['entropy']['clean']['mean']:.3f}, adversarial "
              f"{d['entropy']['adv']['mean']:.3f}. Spearman rank correlation of classifier weight norm with class "
              f"accuracy: clean {rc['clean']}, {atk} {rc['adv']}. Feature statistics are on adversarial "
              f"inputs.\n")
    order, blocks = class_order(classes)
    p = figures.heatmap(_ordered(d["misclassified_counts"], order), [classes[k] for k in order],
                        f"{label}: misclassified counts under {atk}", fig_dir / f"{tag}-misclassified.png",
                        cbar="images", blocks=blocks)
    md.append(_figure_md(p, out, "misclassified-count matrix"))
    p = figures.scatter_rank(d["weight_norms"], d["accuracy"]["adv"], classes, "classifier weight norm ||w_k||",
                             f"{atk} accuracy (%)", f"{label}: weight norm vs robustness (rho_s {rc['adv']})",
                             fig_dir / f"{tag}-weight-norms.png")
    md.append(_figure_md(p, out, "classifier weight norm against class robustness"))
    if "logit_similarity" in d:  # diagnostics written before it lack it
        md += _logit_similarity(tag, label, d, out, fig_dir)
    if "tsne" in d:
        t = d["tsne"]
        p = figures.tsne(t["clean"], t["adv"], t["labels"], classes, f"{label}: t-SNE of penultimate features",
                         fig_dir / f"{tag}-tsne.png", attack=atk)
        md.append(_figure_md(p, out, "t-SNE of penultimate features, clean and adversarial"))
    return md


# ---- Benz et al. 2021: inter-class discrepancy, the vulnerable class over training, logit similarity ---------

def class_order(classes: list[str]) -> tuple[list[int], list | None]:
    """(order, super-class blocks) of a class axis: CIFAR-100's classes grouped by super-class (Benz et al. 2021,
    Sec. 3.2), any other data set in its own order without blocks."""
    return superclass_order(classes) or (list(range(len(classes))), None)


def _nearest(k, classes: list[str]) -> str:
    """`` (name)`` of a nearest class; nothing where there is none (an absent class's null)."""
    return "" if k is None else f" ({classes[k]})"


def _ordered(matrix, order: list[int]) -> np.ndarray:
    return np.asarray(matrix, dtype=float)[np.ix_(order, order)]


def _discrepancy(groups: list[Group], recs: dict[int, list[dict]], attack: str, classes: list[str], out: Path,
                 fig_dir: Path) -> list[str]:
    """Benz et al. 2021, Figs. 1-2 for every group side by side (standard beside adversarial), and each group's
    spread max - min of clean and robust per-class accuracy with its worst class."""
    lacking = [g.label for i, g in enumerate(groups) if any("clean" not in r["results"] for r in recs[i])]
    if lacking or attack == "clean":
        why = (f"{', '.join(lacking)} lack{'s' if len(lacking) == 1 else ''} a clean evaluation; run: fastfair eval "
               "RUN_DIR --attacks clean" if lacking
               else "the robust column is clean; give --attack NAME")
        return [f"No inter-class discrepancy figure (Benz et al. Figs. 1-2): {why}.\n"]
    series = {g.label: (_per_class_mean(recs[i], "clean")[0], _per_class_mean(recs[i], attack)[0])
              for i, g in enumerate(groups)}
    notes = {_subset_note(g.runs[0]) for g in groups}
    shared = f" ({notes.pop()})" if len(notes) == 1 and "" not in notes else ""
    order, _ = class_order(classes)  # CIFAR-100: a super-class's classes side by side
    p = figures.discrepancy_grid([classes[k] for k in order],
                                 {name: tuple(np.asarray(v)[order] for v in pair) for name, pair in series.items()},
                                 attack, f"inter-class discrepancy: per-class accuracy and {attack} robustness{shared}",
                                 fig_dir / "discrepancy.png")
    mcd = {g.label: {n: group_entry(recs[i], n) for n in ("clean", attack)} for i, g in enumerate(groups)}

    def said(name: str, which: str, acc) -> str:
        entry = mcd[name][which]
        return (f"{which} {entry['summary']['mcd']:.1f}{measures.spread_text(entry.get('summary_sd', {}).get('mcd'))}"
                f"{measures.interval_text(entry['summary_interval']['mcd'])} (worst {lowest_classes(acc, classes)})")

    spread = "; ".join(f"{name}: {said(name, 'clean', clean)}, {said(name, attack, rob)}"
                       for name, (clean, rob) in series.items())
    return ["## Inter-class discrepancy\n",
            _figure_md(p, out, "per-class accuracy (top) and robustness (bottom), without (left) and with (right) "
                               "the mean over classes subtracted (Benz et al. 2021, Figs. 1-2)"),
            f"Spread over classes, max − min in points (MCD; over seeds their mean ± sd) with its {per_image.PERCENT} "
            f"interval, and the worst class of the mean over seeds: {spread}.\n"]


def _class_curves(tag: str, label: str, runs: list[Run], val_attack: str | None, classes: list[str], selected: int,
                  out: Path, fig_dir: Path) -> list[str]:
    """Per-class validation accuracy over epochs, clean and under the validation attack (Benz et al. 2021,
    Sec. 3.1), and which class is worst at each epoch."""
    found = {name: _per_class_epochs(runs, name) for name in ("clean", val_attack) if name is not None}
    panels = {name: v for name, (epochs, v) in found.items() if v is not None}
    if not panels:
        return []
    epochs = next(epochs for epochs, v in found.values() if v is not None)
    p = figures.per_class_accuracy_curves(epochs, panels, classes, f"{label}: per-class validation accuracy",
                                          fig_dir / f"{tag}-class-curves.png", selected=selected)
    said = "; ".join(f"{name}: {worst_class_text(epochs, v, classes)}" for name, v in panels.items())
    seeds = f", mean over {len(runs)} seeds" if len(runs) > 1 else ""
    return [_figure_md(p, out, "per-class validation accuracy over training, clean and under the validation attack "
                               "(Benz et al. 2021, Sec. 3.1); the dotted line marks the evaluated checkpoint's epoch"),
            f"Worst class on the validation split at each epoch{seeds}: {said}.\n"]


def _per_class_epochs(runs: list[Run], name: str) -> tuple[list[int], np.ndarray | None]:
    """(epochs, (epochs, C) per-class validation accuracy under ``name``, mean over the seeds that reached each
    epoch); None where a run's lines lack it."""
    runs = [r for r in runs if r.epochs]
    n = min(len(r.epochs) for r in runs)
    if not all("per_class" in e["val"].get(name, {}) for r in runs for e in r.epochs[:n]):
        return [], None
    v = np.asarray([[e["val"][name]["per_class"] for e in r.epochs[:n]] for r in runs], dtype=float)
    return [e["epoch"] for e in runs[0].epochs[:n]], v.mean(0)


def _epoch_ranges(epochs: list[int]) -> str:
    """1, 2, 3, 7, 9, 10 -> "1-3, 7, 9-10"."""
    parts, start = [], 0
    for i in range(1, len(epochs) + 1):
        if i == len(epochs) or epochs[i] != epochs[i - 1] + 1:
            a, b = epochs[start], epochs[i - 1]
            parts.append(str(a) if a == b else f"{a}-{b}")
            start = i
    return ", ".join(parts)


def lowest_classes(accuracy, classes: list[str]) -> str:
    """The class with the lowest accuracy by name; classes tied lowest together ("bird = cat"), more than three by
    their count and value ("7 classes at 0.0 %")."""
    a = np.asarray(accuracy, dtype=float)  # an absent class (NaN) is nobody's lowest
    low = np.nanmin(a)
    tied = np.flatnonzero(np.isclose(a, low, rtol=0, atol=1e-9))
    return " = ".join(classes[k] for k in tied) if len(tied) <= 3 else f"{len(tied)} classes at {low:.1f} %"


def worst_class_text(epochs: list[int], per_class, classes: list[str]) -> str:
    """Which class has the lowest accuracy at each epoch (:func:`lowest_classes`), longest-held first: "cat in
    epochs 3-10, bird in 1-2" (the vulnerable class changes), or "cat in every epoch (1-10)"."""
    held: dict[str, list[int]] = {}
    for ep, row in zip(epochs, np.asarray(per_class, dtype=float)):
        held.setdefault(lowest_classes(row, classes), []).append(ep)
    if len(held) == 1:
        (name, eps), = held.items()
        return f"{name} in every epoch ({_epoch_ranges(eps)})"
    ranked = sorted(held.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    return ", ".join(f"{name} in epoch{'s' if len(eps) > 1 else ''} {_epoch_ranges(eps)}" for name, eps in ranked)


def _logit_similarity(tag: str, label: str, d: dict, out: Path, fig_dir: Path) -> list[str]:
    """Benz et al. 2021, Sec. 3.2: the cosine similarity of the classes' mean logit vectors (clean and attacked),
    each class's highest and mean similarity to the others beside its accuracy, and their rank correlation."""
    classes, atk, sim = d["classes"], d["attack"], d["logit_similarity"]
    rows = [f"| class | clean acc. | clean max cos (nearest) | clean mean cos | {atk} acc. | {atk} max cos (nearest) "
            f"| {atk} mean cos |", "|---|---:|---:|---:|---:|---:|---:|"]
    for k, cname in enumerate(classes):
        cell = measures.accuracy_cell
        cells = [f"{cell(d['accuracy'][t][k])} | {cell(sim[t]['max'][k], 3)}{_nearest(sim[t]['nearest'][k], classes)}"
                 f" | {cell(sim[t]['mean'][k], 3)}" for t in ("clean", "adv")]
        rows.append(f"| {cname} | " + " | ".join(cells) + " |")
    rc = {t: {k: measures.correlation_text(v) for k, v in sim[t]["rank_correlation"].items()}
          for t in ("clean", "adv")}
    md = ["#### Cross-class similarity of mean logit vectors (Benz et al. 2021, Sec. 3.2)\n", "\n".join(rows) + "\n",
          "Spearman rank correlation of a class's similarity to the other classes with its accuracy (negative: the "
          f"classes the model sees close to others are the vulnerable ones): clean: max {rc['clean']['max']}, "
          f"mean {rc['clean']['mean']}; {atk}: max {rc['adv']['max']}, mean {rc['adv']['mean']}.\n"]
    order, blocks = class_order(classes)
    p = figures.similarity_heatmaps({"clean": _ordered(sim["clean"]["matrix"], order),
                                     f"adversarial ({atk})": _ordered(sim["adv"]["matrix"], order)},
                                    [classes[k] for k in order], f"{label}: cosine similarity of mean logit vectors",
                                    fig_dir / f"{tag}-logit-similarity.png", blocks=blocks)
    md.append(_figure_md(p, out, "cosine similarity of the classes' mean logit vectors, clean and adversarial"))
    p = figures.scatter_rank(sim["adv"]["max"], d["accuracy"]["adv"], classes, "highest cosine similarity to "
                             "another class", f"{atk} accuracy (%)", f"{label}: logit similarity vs robustness "
                             f"(rho_s {rc['adv']['max']})", fig_dir / f"{tag}-logit-similarity-vs-accuracy.png")
    md.append(_figure_md(p, out, "each class's highest mean-logit similarity to another class against its robustness"))
    return md
