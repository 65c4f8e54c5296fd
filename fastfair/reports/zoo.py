"""``fastfair zoo``: RobustBench's models with their reported averages, evaluated per class as a batch, and the
worst-class leaderboard across them (``zoo.md``, ``zoo.json``, ``zoo.png``).

Each model is one ``fastfair eval rb:NAME`` child run through the grid's launchers (K per GPU, its log and
state in ``OUT/NAME/``); its result is the JSON that command writes beside the weights. A model whose last run
finished with the same command is not run again, so an interrupted batch goes on where it stopped.
"""
from __future__ import annotations

import math
from pathlib import Path

from fastfair import display
from fastfair.errors import UserError
from fastfair.evaluation import measures, per_image, robustbench as rb
from fastfair.reports import figures
from fastfair.rundir import RunDir, Unchecked, read_json, write_json_atomic, write_text_atomic
from fastfair.scaleout import jobs as grid_jobs
from fastfair.scaleout.launchers import LAUNCHERS

FULL_TEST = {"cifar10": 10_000, "cifar100": 10_000}  # the test sets RobustBench reports on


def result_file(name: str, dataset: str, threat: str, model_dir: str | Path | None, per_class: int | None) -> Path:
    """Where ``fastfair eval rb:NAME`` writes its per-class result (beside the weights)."""
    weights = rb.model_file(name, dataset, threat, model_dir)
    return RunDir.of_checkpoint(weights).eval_file(weights, "test", per_class or 0)


def leaderboard(dataset: str, threat: str) -> list[tuple[str, dict | None]]:
    """(name, reported numbers or None) of RobustBench's list, by reported AutoAttack accuracy, best first."""
    reported = rb.reported(dataset, threat)
    return sorted(((n, reported.get(n)) for n in rb.names(dataset, threat)),
                  key=lambda item: -(item[1]["autoattack"] if item[1] else -1))


def listing(dataset: str, threat: str, model_dir: str | None, echo=print) -> None:
    """The models, their reported numbers, and whether their weights and a per-class result are here."""
    header = ["model", "architecture", "clean", "AA", "weights", "per-class result"]
    rows = []
    for name, info in leaderboard(dataset, threat):
        have = rb.model_file(name, dataset, threat, model_dir).is_file()
        done = result_file(name, dataset, threat, model_dir, None).is_file()
        rows.append(([name, info["architecture"] if info else "?",
                      f"{info['clean']:.2f}" if info else "-", f"{info['autoattack']:.2f}" if info else "-",
                      "yes" if have else "-", "yes" if done else "-"], False))
    echo(f"RobustBench's {dataset} {threat} models (reported clean and AutoAttack accuracy, %), weights looked for "
         f"in {Path(model_dir or rb.DEFAULT_DIR) / dataset / threat}:")
    display.print_table(header, rows, text_columns=2)
    echo("\nevaluate per class: fastfair zoo --run --models NAME,NAME (or --top N, or every model whose weights are "
         "here) --attacks clean,aa; weights not here are fetched first (--fetch only fetches them)")


def choose(models: str | None, top: int | None, dataset: str, threat: str, model_dir: str | None) -> list[str]:
    """The models named (``--models``), the top N of the leaderboard, or else every model whose weights are here."""
    board = [name for name, _ in leaderboard(dataset, threat)]
    if models and top:
        raise UserError("--models and --top both choose the models; pass one")
    if models:
        chosen = [m.strip() for m in models.split(",") if m.strip()]
        for name in chosen:
            rb.entry(name, dataset, threat)  # an unknown name: one line
        return chosen
    if top:
        return [n for n in board if rb.single_file(n, dataset, threat)][:top]
    chosen = [n for n in board if rb.model_file(n, dataset, threat, model_dir).is_file()]
    if not chosen:
        raise UserError(f"no RobustBench weights under {Path(model_dir or rb.DEFAULT_DIR) / dataset / threat}; "
                        "name the models (--models, --top N), whose weights are fetched, or pass --model-dir where "
                        "they are")
    return chosen


def fetch(names: list[str], dataset: str, threat: str, model_dir: str | None, echo=print) -> None:
    """The weights of ``names`` that are not in ``model_dir`` yet, downloaded one after another (``--fetch``, and
    ``--run`` before its first evaluation, so that no two children download the same file)."""
    missing = [n for n in names if not rb.model_file(n, dataset, threat, model_dir).is_file()]
    for name in missing:
        rb.fetch(name, dataset=dataset, threat=threat, model_dir=model_dir, echo=echo)
    echo(f"{len(names)} models: {len(names) - len(missing)} were here, {len(missing)} fetched, in "
         f"{Path(model_dir or rb.DEFAULT_DIR) / dataset / threat}")


def run(*, models: str | None, top: int | None, dataset: str, threat: str, model_dir: str | None, attacks: str,
        data_dir: str | None, per_class: int | None, seed: int | None, out: str | None, gpus: str, per_gpu: int,
        launcher: str, echo=print) -> int:
    """Evaluate the chosen models per class (skipping those already done with the same command), then write the
    leaderboard; 1 if a model failed."""
    rb.check_threat(dataset, threat)
    names = choose(models, top, dataset, threat, model_dir)
    start = LAUNCHERS.get(launcher)  # an unknown launcher fails before any work
    fetch(names, dataset, threat, model_dir, echo)
    folder = Path(out or f"runs/zoo/{dataset}-{threat}")
    where = str(Path(model_dir or rb.DEFAULT_DIR).resolve())
    common = ["--dataset", dataset, "--threat", threat, "--model-dir", where, "--attacks", attacks, "--quiet",
              *(["--data-dir", str(Path(data_dir).resolve())] if data_dir else []),
              *(["--per-class", str(per_class)] if per_class else []), *(["--seed", str(seed)] if seed is not None
                                                                           else [])]
    todo, skipped = [], []
    for name in names:
        job = grid_jobs.Job(name, str(folder / name), "", (), argv=("eval", f"{rb.PREFIX}{name}", *common))
        state = grid_jobs.read_state(job.run_dir)
        finished = state["status"] == "done" and state.get("command", [])[1:] == job.command()[1:]
        if finished and result_file(name, dataset, threat, model_dir, per_class).is_file():
            skipped.append(name)
        else:
            todo.append(job)
    echo(f"{len(names)} models: {len(todo)} to evaluate, {len(skipped)} done earlier with the same command"
         + (f" ({', '.join(skipped)})" if skipped else ""))
    if todo:
        start(todo, gpus=gpus, per_gpu=per_gpu, options={}, folder=folder / ".submitit", echo=echo)
    done = [n for n in names if grid_jobs.read_state(folder / n)["status"] == "done"]
    failed = [n for n in names if n not in done]
    echo(f"{len(done)} of {len(names)} models evaluated")
    for name in failed:
        echo(f"  {grid_jobs.outcome(name, folder / name)}")
    if done:
        path = write(done, dataset=dataset, threat=threat, model_dir=model_dir, per_class=per_class, out=folder)
        echo(f"written: {path} (and {path.with_suffix('.json').name}, {path.with_suffix('.png').name})")
    return 1 if failed else 0


def _robust(records: dict[str, dict]) -> str:
    """The attack of the leaderboard: aa where every model has it, else the strongest attack every model has."""
    common = set.intersection(*(set(r["results"]) - {"clean"} for r in records.values()))
    if not common:
        raise UserError("the models share no attack besides clean; run them with the same --attacks")
    if "aa" in common:
        return "aa"
    return min(common, key=lambda a: sum(r["results"][a]["summary"]["avg"] for r in records.values()))


def _comparable(record: dict, dataset: str) -> str:
    """'' when the result is on the full test set RobustBench reports on, else why it is not comparable."""
    full = FULL_TEST.get(dataset)
    if record["images"] != full:
        return f"{record['images']} test images, not the full {full}: not comparable to the reported numbers"
    return ""


def _differs(ours: float, theirs: float, n: int) -> bool:
    """Whether two accuracies (%) on n images differ by more than 3 binomial standard errors (+ rounding)."""
    p = min(max(theirs / 100, 1e-3), 1 - 1e-3)
    return abs(ours - theirs) > 300 * math.sqrt(p * (1 - p) / n) + 0.01


def write(names: list[str], *, dataset: str, threat: str, model_dir: str | None, per_class: int | None,
          out: Path) -> Path:
    """``zoo.md``, ``zoo.json`` and ``zoo.png`` of the models' per-class results, best worst class first."""
    records = {n: read_json(result_file(n, dataset, threat, model_dir, per_class), "delete it and run fastfair zoo "
                                                                                     "--run again") for n in names}
    # one leaderboard, one test set: a result evaluated on other images (an eval run by hand since) is refused
    by_data: dict[str, list[str]] = {}
    for name, record in records.items():
        by_data.setdefault(record["fingerprint"]["data"], []).append(name)
    if len(by_data) > 1:
        groups = "; ".join(", ".join(group) for group in by_data.values())
        raise UserError(f"the models' results are on different test images ({groups}); evaluate them on the same "
                        f"data: delete {out}/NAME/grid-state.json of the odd ones and run the same zoo command again")
    classes = next(iter(records.values()))["classes"]
    attack = _robust(records)
    rows = []
    for name, record in records.items():
        rep = record["source"].get("reported")
        res = per_image.with_intervals({n: record["results"][n] for n in dict.fromkeys(("clean", attack))
                                        if n in record["results"]})
        summary, ci = res[attack]["summary"], res[attack]["summary_interval"]
        note = _comparable(record, dataset)
        if not note and rep and attack == "aa" and _differs(summary["overall"], rep["autoattack"], record["images"]):
            note = f"AutoAttack {summary['overall']:.2f} here, {rep['autoattack']:.2f} reported: beyond sampling error"
        rows.append({"model": name, "architecture": record["source"]["architecture"],
                     "reported_clean": rep["clean"] if rep else None,
                     "reported_autoattack": rep["autoattack"] if rep else None,
                     "clean": res["clean"]["summary"]["avg"] if "clean" in res else None,
                     "robust": summary["avg"], "worst_class": classes[summary["worst_class"]],
                     "worst": summary["worst"],
                     "cv": summary["cv"], "mcd": summary["mcd"], "per_class": res[attack]["per_class"],
                     "intervals": {"clean": res["clean"]["summary_interval"]["avg"] if "clean" in res else None,
                                   "robust": ci["avg"], "worst": ci["worst"], "cv": ci["cv"], "mcd": ci["mcd"],
                                   "per_class": res[attack]["per_class_interval"]},
                     "missing": per_image.missing_note(res),
                     "images": record["images"], "note": note,
                     "result": str(result_file(name, dataset, threat, model_dir, per_class))})
    rows.sort(key=lambda r: (-r["worst"], -r["robust"]))
    out.mkdir(parents=True, exist_ok=True)
    board = {"dataset": dataset, "threat": threat, "attack": attack, "classes": classes, "models": rows}
    # numbers of a result read without a checksum (an older fastfair's) are not signed into it
    unchecked = any(isinstance(r, Unchecked) for r in records.values())
    write_json_atomic(Unchecked(board) if unchecked else board, out / "zoo.json")

    def fmt(r: dict, key: str | None = None, value=None) -> str:
        """A number of ours with its interval (``key`` in the row's intervals), or a reported one bare."""
        v = r[key] if key else value
        return "-" if v is None else f"{v:.2f}" + (measures.interval_text(r["intervals"][key]) if key else "")

    lines = [f"# Worst-class leaderboard: RobustBench {dataset} {threat} models under {attack}", "",
             f"Accuracies in %; ours are means of per-class accuracies under `{attack}` (eps 8/255), each with its "
             f"{per_image.PERCENT} interval (a stratified bootstrap over the test images; a class's: Wilson's), "
             "RobustBench's are its reported clean and AutoAttack accuracy on the full test set, bare as it reports "
             "them. Sorted by the worst class, whose interval is biased low (a resample's weakest class is weaker "
             "than the class weakest on average).", "",
             "| # | model | architecture | reported clean | reported AA | clean | " + attack
             + " | worst class | CV (%²) | MCD | note |",
             "|---:|---|---|---:|---:|---:|---:|---|---:|---:|---|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | {r['model']} | {r['architecture']} | {fmt(r, value=r['reported_clean'])} | "
                     f"{fmt(r, value=r['reported_autoattack'])} | {fmt(r, 'clean')} | {fmt(r, 'robust')} | "
                     f"{r['worst_class']} {fmt(r, 'worst')} | {fmt(r, 'cv')} | {fmt(r, 'mcd')} | {r['note']} |")
    lines += [f"{r['model']}: {r['missing']}." for r in rows if r["missing"]]
    lines += ["", f"Per-class accuracy under `{attack}` (%), with its {per_image.PERCENT} interval (Wilson's):", "",
              "| model | " + " | ".join(classes) + " |", "|---|" + "---:|" * len(classes)]
    lines += [f"| {r['model']} | " + " | ".join(
        measures.accuracy_cell(v, 1) + ("" if v is None else measures.interval_text(ci))
        for v, ci in zip(r["per_class"], r["intervals"]["per_class"])) + " |" for r in rows]
    lines += ["", "![per-class accuracy of each model](zoo.png)", ""]
    path = out / "zoo.md"
    write_text_atomic("\n".join(lines), path)
    figures.models_by_class([r["per_class"] for r in rows], [r["model"] for r in rows], classes,
                            [r["robust"] for r in rows],
                            f"RobustBench {dataset} {threat}: per-class accuracy under {attack}", out / "zoo.png")
    return path
