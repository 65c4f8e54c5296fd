"""``fastfair reproduce TABLE``: run a paper's table and print it beside the paper's numbers.

The runs go through the grid machinery (:mod:`fastfair.scaleout`): each is ``fastfair train`` in
its own folder ``OUT/runs/<preset>-s<seed>`` with a grid state, so a second invocation skips the
runs done and resumes killed ones, and ``--per-gpu K`` runs K at once on each GPU. Training ends
with the final evaluation of the checkpoint the preset selects (the paper's criterion, on the
validation split) under the attacks the paper reports; the EMA/FAWA model's where the row is an
averaged one.
"""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from fastfair import config
from fastfair.attacks import autoattack, names
from fastfair.evaluation.diagnose import diagnose_checkpoint
from fastfair.errors import UserError
from fastfair.evaluation.foreign import evaluate_foreign
from fastfair.evaluation.per_class import evaluate_checkpoint
from fastfair.evaluation.robustbench import evaluate_robustbench
from fastfair.reproduce import cost, runs, tables
from fastfair.reproduce.figures.registry import FigureRuns
from fastfair.reproduce.paper import PAPERS, SPREAD, STATS
from fastfair.reproduce.verdict import compare_row
from fastfair.reproduce.write import numbers_png, write, write_protocol
from fastfair.rundir import RunDir, file_sha256, read_json
from fastfair.scaleout.grid import prepare, still_held
from fastfair.scaleout.jobs import outcome, read_state, stopped
from fastfair.scaleout import per_gpu as runs_per_gpu
from fastfair.scaleout.launchers import LAUNCHERS, parse_gpus


def listing(seeds: int | None, echo=print, only: str | None = None, scale: str = "full") -> None:
    """Every target (or ``only`` that one) with its rows, each row's seeds at ``scale``
    (:func:`~fastfair.reproduce.runs.row_seeds`: ``seeds`` where given, else its paper's count at a comparable scale)
    and what it costs: the targets with the paper's numbers first, then the protocols without, then the pending ones,
    a line each cut to the terminal's width (``only`` a pending one: its whole reason and route)."""
    waiting = tables.pending()
    if only in waiting:
        chosen, waiting = {}, {only: waiting[only]}
    else:  # an unknown name: one line naming the targets
        chosen, waiting = ({only: tables.get(only)}, {}) if only else (tables.tables(), waiting)
    speeds = cost.gpu_images_per_s()
    runs.SCALES.get(scale)  # an unknown scale: one line naming the scales
    echo("scales (--scale):")
    for name in runs.SCALES:
        echo(f"  {name}: {runs.SCALES.doc(name)}")
    echo(f"seeds at scale {scale}: the paper's count per row at a scale comparable to the paper, 1 at one that is not, "
         "--seeds N for every row")

    def seeds_of(row) -> int:
        return runs.row_seeds(row, seeds, scale)

    def kind(table) -> int:  # 0: the paper's numbers in its rows, 1: a plot drawn from its runs, 2: a protocol
        return 2 if table.protocol else 0 if any(r.numbers and table.own(r) for r in table.rows) else 1

    headings = ("with the paper's numbers (each result printed beside them, with a verdict):",
                "drawn from their runs (the paper's plot; no numbers of the paper's to compare in their rows):",
                "protocols without paper numbers (run and reported, no verdicts):")
    for order, heading in enumerate(headings):
        group = {k: t for k, t in chosen.items() if kind(t) == order}
        if group and not only:
            echo(f"\n{heading}")
        for key, table in group.items():
            _list_target(key, table, seeds, scale, seeds_of, speeds, echo)
    if waiting and not only:
        echo("\npending (they cannot run here; why, and the route to run them: fastfair reproduce NAME --list):")
    for key, spec in waiting.items():
        line = f"{key}: {PAPERS[spec.source].cite}, {spec.item}: {spec.caption}; pending: {spec.pending}"
        echo(line if only else fit(line))


def plural(n: int, word: str) -> str:
    """``1 row``, ``2 rows``."""
    return f"{n} {word}{'s' * (n != 1)}"


def fit(line: str, width: int | None = None) -> str:
    """``line`` cut to ``width`` (default the terminal's, $COLUMNS where set), its end marked."""
    width = width or shutil.get_terminal_size().columns
    return line if len(line) <= width else line[:width - 1] + "…"


def _list_target(key: str, table: tables.Table, seeds: int | None, scale: str, seeds_of, speeds, echo) -> None:
    """A target's lines of ``--list``: its title, runs and seeds, what it draws, its rows, what it lacks, its cost."""
    echo(f"{key}: {table.title} ({PAPERS[table.source].title}); {plural(len(table.rows), 'row')}, "
         f"{plural(sum(map(seeds_of, table.rows)), 'run')} (seeds: {runs.seeds_text(list(table.rows), seeds, scale)})")
    if table.spec:
        echo(f"  draws: {table.spec.caption}" + (f" (partial: {table.spec.partial})" if table.spec.partial else ""))
    elif table.figure:
        echo("  draws: nothing yet (no drawer registered): the rows' numbers only")
    for row in table.rows:
        released = (f"; RobustBench's {row.robustbench}, evaluated, not trained" if row.robustbench else
                    f"; the authors' released model, evaluated, not trained: {row.released.place(None)} (or "
                    f"under --model-dir)" if row.released else "")
        echo(f"  {row.preset:<32} {row.row} x {plural(seeds_of(row), 'seed')} [{_what_it_reports(row, table)}; "
             f"follows {row.follows}{released}]")
    for pending in table.pending:
        echo(f"  not run yet: {pending}")
    echo(f"  cost: {cost.estimate(table, seeds_of, speeds)}")


def _what_it_reports(row, table: tables.Table) -> str:
    """The statistics the paper gives per attack, or which rows' runs this row is for."""
    def stats(n) -> str:
        return "/".join([s for s in (*STATS, *SPREAD) if getattr(n, s) is not None]
                        + (["per class"] if n.per_class else []))

    if table.protocol:
        return "no paper numbers: a protocol"
    if row.numbers and not table.own(row):
        return f"its runs (its numbers are {row.where}'s)"
    if row.numbers:
        last = (f"; last epoch: {', '.join(f'{a} {stats(n)}' for a, n in row.last.items())}"
                if row.last and row.table == table.number else "")
        return ", ".join(f"{a} {stats(n)}" for a, n in row.numbers.items()) + last
    roles = {"transfer substitute" if r.substitute == row.preset else "fine-tuning base"
             for r in table.rows if row.preset in r.depends_on}
    if not roles:  # a figure's run the paper plots without a number in its text (CFA Fig. 2's eight margins)
        return "no numbers of its own: the figure plots its runs"
    return f"no numbers of its own: the {' and '.join(sorted(roles))} of the other rows"


def _record(run_dir: Path, planned: runs.PlannedRun) -> tuple[dict | None, str]:
    """The evaluation record the paper's numbers compare with, and the checkpoint it is of."""
    run = RunDir(run_dir)
    cfg = config.load_run(run.path)
    plain = run.selected_checkpoint(cfg.train.select)
    averaged = run.selected_checkpoint(cfg.train.select, averaged=True)
    ckpt = averaged if planned.averaged and averaged.is_file() else plain
    path = run.eval_file(ckpt, cfg.eval.split)
    # FAWA averages in only the epochs that pass its fairness threshold: there may be none
    label = ckpt.name + (" (no averaged model was written)" if planned.averaged and ckpt == plain else "")
    return (read_json(path) if path.is_file() else None), label


def reproduce(table: str | None, *, seeds: int | None = None, data_dir: str = "", per_gpu: int | str = "auto",
              scale: str = "full", list_only: bool = False, out: str | None = None, gpus: str = "auto",
              sets: list[str] | None = None, model_dir: str | None = None, launcher: str = "local",
              paper_selection: bool = False, echo=print) -> int:
    """``fastfair reproduce``: 0 when every run is done and the report written, 1 when some failed. ``seeds``: every
    row's (None: its paper's count at a comparable scale, 1 at another; :func:`runs.row_seeds`). ``launcher``
    runs the trainings (``fastfair grid``'s registry: local, submitit). ``paper_selection``: the rows recording the
    paper's own checkpoint rule (``[paper] paper_selection``, e.g. ME's best PGD-20 on the test set) pick by it,
    in their own folder, and the report says where they chose."""
    if list_only:
        listing(seeds, echo, only=table, scale=scale)
        return 0
    if not table:
        raise UserError("name a table or figure (fastfair reproduce TARGET), or list them: fastfair reproduce --list")
    per_gpu = runs_per_gpu.parse(per_gpu)
    tab = tables.get(table)
    launch = LAUNCHERS.get(launcher)  # an unknown launcher fails before any work
    scale_spec = runs.SCALES.get(scale)
    if paper_selection and not any(r.paper_selection for r in tab.rows):
        raise UserError(f"--paper-selection: no row of {table} records a checkpoint rule of its paper that fastfair's "
                        "differs from; leave it out")
    root = Path(out or f"runs/reproduce/{table}-{scale}{'-paper-selection' if paper_selection else ''}")
    user_sets = config.parse_set(sets or [])
    planned = runs.plan(tab, seeds, scale, data_dir, root, user_sets, model_dir, paper_selection)
    # an authors' file not placed yet is pending at any scale; other rows are left out at a scale without their data
    pending = list(dict.fromkeys(f"{p.row.preset} ({p.row.row}): {p.missing}" for p in planned
                                 if p.missing and p.row.released))
    left_out = list(dict.fromkeys(f"{p.row.preset} ({p.row.row}): {p.missing}" for p in planned
                                  if p.missing and not p.row.released))
    if all(p.missing for p in planned):
        # a target over several data sets refuses one .npz (runs.plan): name what it takes, not FILE.npz
        several = len({config.resolve(p.row.preset).data.dataset for p in planned}) > 1
        raise UserError(f"no row of {table} has its data at --scale {scale} ({'; '.join(left_out)}): pass --data-dir "
                        + ("a folder holding the files named" if several else "FILE.npz, or a folder holding the file "
                           "named") + ", or run it at --scale full")
    planned = [p for p in planned if not p.missing]
    if runs.needs_autoattack(planned):
        autoattack.default_backend()  # a missing AutoAttack package stops here, before any training
    evaluated = [p for p in planned if p.row.evaluated]  # released models: evaluated once the others are done
    planned = [p for p in planned if not p.row.evaluated]
    jobs, configs, changed = [], [], []
    for p in planned:
        try:
            job, cfg, keys = prepare(p.name, p.row.preset, p.sets, p.run_dir(root))
        except UserError as err:
            raise UserError(f"table {table}, run {p.name}: {err}") from None
        if keys:
            changed.append(f"{p.name} ({keys})")
        jobs.append(job)
        configs.append(cfg)
    if changed:
        raise UserError(f"runs already started under {root} were started with other settings: {'; '.join(changed)}. "
                        "Use the same options as then, another --out, or delete those run folders")
    status = {j.name: read_state(j.run_dir)["status"] for j in jobs}
    echo(f"reproduce {tab.title} at scale {scale}: {len(jobs)} runs in {root}, "
         f"{sum(s == 'done' for s in status.values())} done" +
         (f"; then {len(evaluated)} evaluations of released models" if evaluated else ""))
    for r in left_out:
        echo(f"  not run at this scale: {r}")
    for r in pending:
        echo(f"  pending: {r}")
    ran = {p.row.preset: p.sets for p in planned + evaluated}
    seeds_line = runs.seeds_text(list(tab.rows), seeds, scale)
    not_run = [f"Not run at this scale: {r}" for r in left_out] + [f"Pending: {r}" for r in pending]
    todo = [cfg for j, cfg in zip(jobs, configs) if status[j.name] != "done"]
    if todo:
        per_gpu = runs_per_gpu.resolve(per_gpu, todo, parse_gpus(gpus), echo)
    with RunDir(root).lock(echo):
        busy = [f"{j.name} ({holder})" for j in jobs if status[j.name] == "running" and (holder := still_held(j, echo))]
        if busy:
            raise UserError(f"runs still being trained by another process: {', '.join(busy)}; wait for them to end "
                            "(or stop them), then run the same command again")
        # A row that fine-tunes another row's model (FRL) starts once that row's runs have ended.
        for wave in (lambda p: not p.row.depends_on, lambda p: bool(p.row.depends_on)):
            todo = [j for p, j in zip(planned, jobs) if wave(p) and status[j.name] != "done"]
            if todo:
                try:
                    launch(todo, gpus=gpus, per_gpu=per_gpu, options={}, folder=root / f".{launcher}", echo=echo)
                except KeyboardInterrupt as err:  # a stop signal: the children saved and stopped; say what each kept
                    raise stopped(err, [(j.name, Path(j.run_dir)) for j in jobs]) from None
        records, folders, run_lines, failed = _collect(planned, jobs)
        lasts = _last_records(planned, jobs, tab, gpus, echo)
        for p in evaluated:  # after the trained rows: a transfer attack needs its substitute's run
            _evaluate_released(p, root, model_dir, gpus, records, folders, run_lines, failed, echo)
        if records and tab.protocol:  # a study without numbers: what its protocol measures, and the study's figures
            _diagnose(planned, jobs, gpus, echo)
            notes = _notes(tab, scale, user_sets, paper_selection, ran) + not_run
            path = write_protocol(root, tab, records, planned + evaluated, scale=scale,
                                  scale_doc=runs.SCALES.doc(scale), seeds=seeds_line, runs=run_lines, notes=notes)
            echo(f"written: {path}, its figures and the study's report ({root / tab.key}-study[-<dataset>]/report.md)")
        elif records:  # at least one run finished: the table with what there is
            comparable = scale_spec.comparable and not user_sets
            runs_for = {p.row.preset: p.runs_for for p in planned + evaluated}
            # each row's own classes: a table may span data sets (Tian et al. KDD Table 5)
            any_classes = next(recs[0]["classes"] for recs in records.values())
            comparisons = []
            whole = scale == "full"  # the full scale evaluates the paper's test images; the subset scale a part
            for row in tab.ordered():
                if row.preset not in runs_for or not tab.own(row):  # left out at this scale (the notes say why),
                    continue  # or a row a figure reuses: its numbers are its own table's
                recs = records.get(row.preset, [])
                classes = recs[0]["classes"] if recs else any_classes
                comparisons += compare_row(row, recs, comparable, classes, runs_for[row.preset], whole)
                if row.last and row.table == tab.number:  # its own table prints the last epoch's numbers too
                    last = dataclasses.replace(row, numbers=row.last, row=f"{row.row} (last epoch)")
                    comparisons += compare_row(last, lasts.get(row.preset, []), comparable, classes,
                                               runs_for[row.preset], whole)
            banner = (f"**Checkpoints selected on the test set** (--paper-selection: {_on_test(tab)}), as the paper "
                      "did: the test images that give the numbers below also chose the checkpoint.\n"
                      if paper_selection else "")
            notes = _notes(tab, scale, user_sets, paper_selection, ran) + not_run
            drawn = None
            if tab.spec or tab.figure:
                drawn, numbers, why = _draw(tab, root, planned + evaluated, records, folders, scale, comparable,
                                            gpus, echo)
                comparisons += numbers
                notes += [why] if why else []
            path = write(root, tab, comparisons, scale=scale, scale_doc=runs.SCALES.doc(scale), seeds=seeds,
                         runs=run_lines, user_sets=list(sets or []), banner=banner, notes=notes, drawn=drawn)
            pngs = drawn if drawn is not None else [numbers_png(root, tab)]
            echo(f"written: {path}" + "".join(f", {p}" for p in pngs))
    if failed:
        echo(f"{len(failed)} of {len(jobs) + len(evaluated)} runs did not finish:\n"
             + "\n".join(f"  {line}" for line in failed)
             + "\nfix the cause and run the same command again: done runs are skipped, the others resume")
        return 1
    return 0


def _draw(tab: tables.Table, root: Path, planned: list[runs.PlannedRun], records: dict[str, list[dict]],
          folders: dict[str, list[Path]], scale: str, comparable: bool, gpus: str,
          echo) -> tuple[list[Path], list, str]:
    """A figure's drawer on the finished runs: (the PNGs it drew, the numbers it compared, why it drew nothing or
    '' when it drew). It draws once every row has a finished seed: a plot missing a row would look complete."""
    if tab.spec is None:
        return [], [], f"No drawer is registered for {tab.key}: the rows' numbers above are all it reports yet."
    missing = sorted({p.row.preset for p in planned} - set(records))
    if missing:
        return [], [], (f"{tab.where} not drawn: no finished run of {', '.join(missing)} yet (run the same command "
                        "again)")
    fig = FigureRuns(tab.key, root, scale, comparable, next(iter(records.values()))[0]["classes"], folders, records,
                     gpus, echo)
    numbers = tab.spec.draw(fig)
    return fig.pngs, numbers, ""


def _evaluate_released(p: runs.PlannedRun, root: Path, model_dir: str | None, gpus: str, records: dict,
                       folders: dict, run_lines: list, failed: list, echo) -> None:
    """A released model's row (RobustBench's, or the authors' own file): evaluated per class under the row's attacks
    and eval settings, the result in the row's own run folder (fingerprinted: a second invocation reuses it). The
    authors' file's SHA-256 is printed, and checked where the preset records one."""
    cfg = config.resolve(p.row.preset, sets=p.sets)
    saved = config.resolve(p.row.preset)  # the model's data set and architecture (the subset scale reads an .npz)
    run_dir = p.run_dir(root)
    released = p.row.released
    what = f"RobustBench {p.row.robustbench}" if p.row.robustbench else f"the authors' file {released.file}"
    echo(f"evaluate {p.name}: {what} under {', '.join(p.attacks)}")
    common = dict(attacks=list(p.attacks), split="test", data_dir=cfg.data.data_dir,
                  device="cpu" if gpus == "cpu" else cfg.train.device, batch_size=None, amp=False, quiet=True,
                  aa_backend="auto", seed=None, substitute=cfg.eval.substitute or None, eps=cfg.eval.eps,
                  alpha=cfg.eval.alpha, run_dir=run_dir)
    try:
        if p.row.robustbench:
            record = evaluate_robustbench(p.row.robustbench, dataset=saved.data.dataset, threat="Linf",
                                          model_dir=model_dir, **common)
        else:
            path = released.path(model_dir)
            sha = file_sha256(path)
            if released.sha256 and sha != released.sha256:
                raise UserError(f"{path} has SHA-256 {sha}, not the {released.sha256} the preset records: it is not "
                                f"the file the row was checked with; {released.place(model_dir)}")
            echo(f"  {path}: SHA-256 {sha}" + ("" if released.sha256 else
                                               f" (preset {p.row.preset} records none yet: add sha256 = \"{sha}\" to "
                                               "its [paper] released once the file is known to be the authors')"))
            data = "npz" if cfg.data.dataset == "npz" else saved.data.dataset
            record = evaluate_foreign(path, model=saved.model.name, dataset=data, normalize=released.normalize,
                                      num_classes=None, **common)
    except UserError as err:
        failed.append(f"{p.name}: fastfair: error: {err}")
        run_lines.append((str(run_dir), "failed", what))
        return
    records.setdefault(p.row.preset, []).append(record)
    folders.setdefault(p.row.preset, []).append(run_dir)
    run_lines.append((str(run_dir), "done", f"{what} (sha256 {record['source']['sha256'][:12]})"))


def _last_records(planned: list[runs.PlannedRun], jobs: list, tab: tables.Table, gpus: str, echo) -> dict:
    """preset -> the evaluation records of its finished runs' last-epoch model (the averaged one where the row
    averages), for the rows whose table prints it (CFA Table 1's Last columns); each evaluated once, then read."""
    out: dict[str, list[dict]] = {}
    for p, j in zip(planned, jobs):
        if not (p.row.last and p.row.table == tab.number) or read_state(j.run_dir)["status"] != "done":
            continue
        run = RunDir(j.run_dir)
        cfg = config.load_run(run.path)
        ckpt = run.checkpoint("last", averaged=p.averaged)
        done = run.eval_file(ckpt, cfg.eval.split)
        if not done.is_file():
            echo(f"evaluate {p.name}'s last epoch ({ckpt.name}) under {', '.join(p.attacks)}")
            evaluate_checkpoint(ckpt, attacks=list(p.attacks), split=cfg.eval.split, quiet=True,
                                device="cpu" if gpus == "cpu" else cfg.train.device,
                                per_class=cfg.data.test_per_class or None)
        out.setdefault(p.row.preset, []).append(read_json(done))
    return out


def _diagnose(planned: list[runs.PlannedRun], jobs: list, gpus: str, echo) -> None:
    """``fastfair diagnose`` of every finished run of a study's section under its first robust attack, once (the
    report's mean-logit similarity, Benz et al. Sec. 3.2, and the other per-class diagnostics come from it)."""
    for p, j in zip(planned, jobs):
        attack = next((a for a in p.attacks if a != "clean" and not a.startswith(names.CORRUPT)), None)
        if attack is None or read_state(j.run_dir)["status"] != "done":
            continue
        run = RunDir(j.run_dir)
        ckpt = run.selected_checkpoint(config.load_run(run.path).train.select)
        if run.diagnostics_file(ckpt, "test", attack).is_file():
            continue
        echo(f"diagnose {p.name} under {attack}")
        diagnose_checkpoint(ckpt, attack=attack, device="cpu" if gpus == "cpu" else "auto", tsne_points=0,
                            quiet=True)


def _collect(planned: list[runs.PlannedRun], jobs: list) -> tuple[dict[str, list[dict]], dict[str, list[Path]], list,
                                                                   list[str]]:
    """(preset -> the evaluation records of its finished seeds, preset -> their run folders, (run folder, status,
    checkpoint) per run, the runs that did not finish, with their logs)."""
    records: dict[str, list[dict]] = {}
    folders: dict[str, list[Path]] = {}
    run_lines, failed = [], []
    for p, j in zip(planned, jobs):
        state = read_state(j.run_dir)["status"]
        rec, ckpt = _record(Path(j.run_dir), p) if state == "done" else (None, "-")
        if rec is None and state != "done":
            failed.append(outcome(j.name, j.run_dir))  # its fastfair: error: line or crash, and its log
        elif rec is None:
            failed.append(f"{j.name}: finished without a test result (log: {RunDir(j.run_dir).train_log})")
        else:
            records.setdefault(p.row.preset, []).append(rec)
            folders.setdefault(p.row.preset, []).append(Path(j.run_dir))
        run_lines.append((str(j.run_dir), state, ckpt))
    return records, folders, run_lines, failed


def _selected(cfg, scaled_epoch: int | None = None, val_per_class: int | None = None) -> str:
    """How fastfair picks the row's checkpoint, as the notes say it: the policy, the attack it scores and where;
    ``scaled_epoch``, ``val_per_class``: the epoch a shorter scale keeps and the validation split it holds out,
    where they are not the preset's."""
    t = cfg.train
    if t.select == "epoch":
        shrunk = f" (epoch {scaled_epoch} at this scale)" if scaled_epoch not in (None, t.select_epoch) else ""
        return f"train.select = epoch, the model after epoch {t.select_epoch}{shrunk}"
    if t.select == "last":
        return "train.select = last, the last epoch's model"
    if t.select_split == "test":
        return (f"train.select = {t.select} by {t.val_attack} on the TEST set (train.select_split = test): the "
                "checkpoint was selected on the test images it is evaluated on")
    held = cfg.data.val_per_class if val_per_class is None else val_per_class
    return (f"train.select = {t.select} by {t.val_attack} on a validation split of {held} training images a class, "
            "held out of training")


def _on_test(tab: tables.Table) -> str:
    """The rows ``--paper-selection`` changes, with the keys it sets."""
    return "; ".join(f"{r.preset}: " + ", ".join(f"{k} = {v}" for k, v in r.paper_selection.items())
                     for r in tab.rows if r.paper_selection)


def _notes(tab: tables.Table, scale: str, user_sets: dict, paper_selection: bool = False,
           ran: dict[str, dict] | None = None) -> list[str]:
    """The report's protocol notes, a line per row; ``ran``: preset -> the sets its runs got (a scale's data)."""
    notes = []
    for row in tab.rows:
        preset = config.resolve(row.preset, sets=row.paper_selection if paper_selection else None)
        follows = "paper and the authors' code (they agree)" if row.follows == "both" else row.follows
        # a row's runs get a substitute only while their attacks keep a transfer attack (runs.plan)
        made_on = row.substitute and (ran is None or "eval.substitute" in ran.get(row.preset, {}))
        if row.released:
            notes.append(f"`{row.preset}` ({row.row}): the authors' released model ({row.released.url}), evaluated "
                         f"(not trained) at eps {preset.eval.eps:g}, step {preset.eval.alpha:g}, as "
                         f"{preset.model.name} with inputs scaled '{row.released.normalize}'; SHA-256 "
                         f"{row.released.sha256 or 'not recorded (the run line prints the placed file’s)'}"
                         f"{'; transfer attacks made on ' + row.substitute + ' (same seed)' if made_on else ''}"
                         f". Preset: {preset.preset}")
            continue
        if row.robustbench:
            notes.append(f"`{row.preset}` ({row.row}): the released model, RobustBench's {row.robustbench}, "
                         f"evaluated (not trained) at eps {preset.eval.eps:g}, step {preset.eval.alpha:g}"
                         f"{'; transfer attacks made on ' + row.substitute + ' (same seed)' if made_on else ''}"
                         f". Preset: {preset.preset}")
            continue
        spec = runs.SCALES.get(scale)  # a scale that shrinks the run shrinks the epoch it keeps too
        scaled = {} if spec.comparable else spec.changes(config.flatten(preset.to_dict()), user_sets)
        held = (ran or {}).get(row.preset, {}).get("data.val_per_class")  # the subset scale holds out fewer
        notes.append(f"`{row.preset}` ({row.row}): follows the {follows}; "
                     f"{'the study' if tab.protocol else 'paper'}'s checkpoint: {row.selection}; "
                     f"fastfair: {_selected(preset, scaled.get('train.select_epoch'), held)}"
                     f"{'; fine-tunes ' + row.init_from + ' (same seed)' if row.init_from else ''}"
                     f"{'; transfer attacks made on ' + row.substitute + ' (same seed)' if made_on else ''}. "
                     f"Preset: {preset.preset}")
    notes += [f"Not run by fastfair yet: {p}" for p in tab.pending]
    if scale != "full":
        notes.append(f"Scale {scale}: {runs.SCALES.doc(scale)}.")
    if user_sets:
        notes.append("Every run also got --set " + ", ".join(f"{k}={v!r}" for k, v in user_sets.items()) + ".")
    return notes
