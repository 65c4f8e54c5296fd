"""Ablation grids: one TOML file -> named runs under one grid directory -> one comparison table.

A grid file names a ``base`` preset, overrides for every run (``[set]``) and axes::

    base = "demo"                     # optional: preset name, or a TOML path relative to the grid file
    [set]
    "train.epochs" = 100
    [[axes]]                          # a product axis: one key, several values
    key = "train.seed"
    values = [0, 1, 2]
    [[axes]]                          # a zipped axis: several keys that move together
    keys = ["method.name", "method.kl_weight"]
    values = [["trades", 6], ["me-trades", 27]]
    labels = ["trades6", "me-trades27"]   # optional folder-name part for each value

The runs are the product of the axes; ``fastfair grid``'s ``--data-dir`` and ``--set`` go to every run
(after the grid's own keys; a key an axis sweeps is refused). Each run is ``python -m fastfair train`` in its own
process with ``--out GRID/RUN`` (``--resume`` when a checkpoint exists), so the run directory
stays the one contract between train, eval, report and grid. ``GRID/RUN/grid-state.json``
records done / failed (and a failed run's error line); re-running the grid skips done runs, resumes
killed ones and retries failed ones. Before the first run launches, every run's config is checked
(values, names, and one robust attack all runs evaluate, for the table) and its data loaded and split
as its training will (each data set once); one grid process at a time writes a grid folder, and a run
marked running is resumed only once no process holds its lock.
"""
from __future__ import annotations

import itertools
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from fastfair import build, config, data
from fastfair.checks import check_config
from fastfair.config import tomllib
from fastfair.errors import UserError
from fastfair.preset_files import grid_file, grid_names
from fastfair.reports.report import compare
from fastfair.rundir import RunDir, write_text_atomic
from fastfair.scaleout.jobs import Job, outcome, read_state, stopped
from fastfair.scaleout import per_gpu as runs_per_gpu
from fastfair.scaleout.launchers import LAUNCHERS, parse_gpus

SEED_KEY = "train.seed"
DYING_S = 10.0  # how long a restart waits for the child of a killed grid to let go of its run


@dataclass(frozen=True)
class Axis:
    keys: tuple[str, ...]
    values: tuple[tuple, ...]  # one tuple (a value per key) per point of the axis
    labels: tuple[str, ...]


@dataclass(frozen=True)
class Run:
    name: str
    point: dict[str, Any]  # the axis values of this run, key -> value
    sets: dict[str, Any]  # every override: the grid's [set], then the axis values


@dataclass
class Grid:
    name: str
    base: str  # "" for none
    sets: dict[str, Any]
    axes: list[Axis]
    preset: str = ""
    launcher: dict[str, dict] = field(default_factory=dict)  # [launcher.NAME] options
    overrides: dict[str, Any] = field(default_factory=dict)  # the command line's, for every run (override())

    def runs(self) -> list[Run]:
        """The product of the axes, in file order (the last axis varies fastest)."""
        runs = []
        for combo in itertools.product(*(range(len(a.values)) for a in self.axes)):
            point, parts = {}, []
            for axis, i in zip(self.axes, combo):
                point.update(zip(axis.keys, axis.values[i]))
                parts.append(axis.labels[i])
            runs.append(Run(",".join(parts) or "run", point, {**self.sets, **point, **self.overrides}))
        names = [r.name for r in runs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise UserError(f"grid {self.name}: runs {dupes} share a name; an axis repeats a value, or give it labels")
        return runs


def toml_value(value: Any) -> str:
    """A value as one-line TOML text, the form ``--set key=value`` reads back."""
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return tomli_w.dumps({"v": value}).partition("=")[2].strip()


def _label(short: str, value: Any) -> str:
    text = value if isinstance(value, str) else toml_value(value)
    return re.sub(r"[^\w.+=-]", "_", f"{short}={text}")


def _axis(spec: dict, index: int, short_names: dict[str, str]) -> Axis:
    where = f"axes[{index}]"
    unknown = set(spec) - {"key", "keys", "values", "labels"}
    if unknown:
        raise UserError(f"{where}: unknown entries {sorted(unknown)}; an axis has key or keys, values, labels")
    if ("key" in spec) == ("keys" in spec):
        raise UserError(f"{where}: give either key = \"a.b\" (product axis) or keys = [...] (zipped axis)")
    values = spec.get("values")
    if not isinstance(values, list) or not values:
        raise UserError(f"{where}: values must be a non-empty list")
    if "key" in spec:
        keys, rows = (spec["key"],), tuple((v,) for v in values)
    else:
        keys = tuple(spec["keys"])
        if not all(isinstance(v, list) and len(v) == len(keys) for v in values):
            raise UserError(f"{where}: a zipped axis takes values = [[...], ...], each a list of {len(keys)} values")
        rows = tuple(tuple(v) for v in values)
    if "labels" in spec:
        labels = tuple(str(x) for x in spec["labels"])
        if len(labels) != len(rows):
            raise UserError(f"{where}: {len(labels)} labels for {len(rows)} values")
    else:
        labels = tuple("-".join(_label(short_names[k], v) for k, v in zip(keys, row)) for row in rows)
    return Axis(keys, rows, labels)


def load(path_or_name: str) -> tuple[Grid, Path]:
    """Read and check a grid file (a path, or the name of a grid shipped in ``configs/grids/``)."""
    path = Path(path_or_name)
    if not path.is_file():
        shipped = grid_file(path_or_name)
        if not shipped.is_file():
            raise UserError(f"no grid file {path_or_name!r}; shipped grids: {', '.join(grid_names())}")
        path = Path(str(shipped))
    try:
        spec = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{path}: not valid TOML ({err})") from None
    unknown = set(spec) - {"preset", "base", "name", "set", "axes", "launcher"}
    if unknown:
        raise UserError(f"{path}: unknown top-level entries {sorted(unknown)}; "
                        "a grid has preset, base, name, [set], [[axes]], [launcher.NAME]")
    base = spec.get("base", "")  # none: the defaults, as `fastfair train` without --config
    if base and (path.parent / base).is_file():  # a file next to the grid, so the grid works from any folder
        base = str((path.parent / base).resolve())
    axes_spec = spec.get("axes", [])
    keys = [k for a in axes_spec for k in ([a["key"]] if "key" in a else a.get("keys", []))]
    leaf = [k.rpartition(".")[2] for k in keys]
    short = {k: (s if leaf.count(s) == 1 else k) for k, s in zip(keys, leaf)}
    if len(set(keys)) != len(keys):
        raise UserError(f"{path}: a key appears on two axes; zip them into one axis instead")
    axes = [_axis(a, i, short) for i, a in enumerate(axes_spec)]
    grid = Grid(spec.get("name", path.stem), base, config.flatten(spec.get("set", {})), axes,
                spec.get("preset", ""), spec.get("launcher", {}))
    return grid, path


def override(grid: Grid, data_dir: str | None, sets: list[str]) -> None:
    """``fastfair grid --data-dir DIR --set k=v``: keys for every run, read as ``fastfair train`` reads its
    --data-dir (data.data_dir) and --set, over the grid's own. A key an axis sweeps is an error: every
    run would get the one value while its folder name says another."""
    # absolute: each run's saved config then finds the data from any folder (a later eval, a SLURM task)
    given = [("data.data_dir", str(Path(data_dir).expanduser().resolve()), "--data-dir")] if data_dir else []
    given += [(config.qualify(k), v, f"--set {k}") for k, v in config.parse_set(sets).items()]
    swept = {config.qualify(k): i for i, axis in enumerate(grid.axes) for k in axis.keys}
    for key, _, flag in given:
        # a bare key of a method (kl_weight) stays bare here and finds its section only in the run's config
        hit = next((k for k in swept if key in (k, k.rpartition(".")[2])), None)
        if hit:
            raise UserError(f"{flag}: grid {grid.name} sweeps {hit} (axes[{swept[hit]}] of its file), so every run "
                            f"would get one value under a folder named for another; drop it, or change that axis in "
                            "a copy of the grid file")
    grid.overrides = {key: value for key, value, _ in given}


# ---- the grid -----------------------------------------------------------------------------
def prepare(name: str, base: str, sets: dict[str, Any], run_dir: Path) -> tuple[Job, config.Config, str]:
    """One run's job and config, after checking the config resolves exactly as train will resolve it;
    the third item names the keys that changed since the run started ("" when none did, or only keys
    --resume may change)."""
    args = tuple(f"{k}={toml_value(v)}" for k, v in sets.items())
    cfg = config.resolve(base or None, None, list(args))
    check_config(cfg)
    saved, changed = RunDir(run_dir), ""
    if saved.config.is_file() and saved.read_config() != cfg.to_toml():
        # the keys --resume may change (a lower lr for a diverged run, more epochs) may change here too
        # read through the current schema: a key added since the run started holds its default there
        old = config.flatten(config.load_run(saved.path).to_dict())
        new = config.flatten(cfg.to_dict())
        keys = [k for k in new if old.get(k) != new[k] and k != "preset" and k not in config.RESUMABLE]
        changed = ", ".join(keys)
    return Job(name, str(run_dir), base, args), cfg, changed


def check_data(grid: Grid, configs: dict[str, config.Config]) -> None:
    """Every run's data found, loaded and split as its training will split it (each data set loaded once),
    so a missing data set or a batch larger than a split stops the grid before any run starts."""
    loaded: dict[tuple[str, str], data.DataBundle] = {}
    for name, cfg in configs.items():
        where = (cfg.data.dataset, cfg.data.data_dir)
        if where not in loaded:
            try:
                loaded[where] = data.load(*where)
            except UserError as err:
                users = [n for n, c in configs.items() if (c.data.dataset, c.data.data_dir) == where]
                who = "every run" if len(users) == len(configs) else f"runs {', '.join(users)}"
                raise UserError(f"grid {grid.name} ({who}): {err}") from None
        try:
            build.training_splits(cfg, loaded[where])
        except UserError as err:
            raise UserError(f"grid {grid.name}, run {name}: {err}") from None


def jobs(grid: Grid, out: Path) -> tuple[list[tuple[Run, Job]], dict[str, config.Config]]:
    """Every run with its job, and its config by run name, after checking each run's config resolves exactly
    as train will resolve it, and that runs already started were started with the same config."""
    pairs, changed, robust, configs = [], [], [], {}
    for run in grid.runs():
        try:
            job, cfg, keys = prepare(run.name, grid.base, run.sets, out / run.name)
        except UserError as err:
            raise UserError(f"grid {grid.name}, run {run.name}: {err}") from None
        robust.append((run.name, [a for a in cfg.eval.attacks if a != "clean"]))
        if keys:
            changed.append(f"{run.name} ({keys})")
        pairs.append((run, job))
        configs[run.name] = cfg
    if changed:
        raise UserError(f"the grid file changed for runs already started: {'; '.join(changed)}. "
                        f"Restore the grid file, or delete those run folders under {out} to start them anew")
    if robust and not set.intersection(*(set(a) for _, a in robust)):
        listed = "; ".join(f"{name}: {', '.join(a) or 'none'}" for name, a in robust[:4])
        raise UserError(f"grid {grid.name}: its runs share no robust attack in eval.attacks ({listed}), so their "
                        "results cannot be compared; add one to every run, e.g. \"eval.attacks\" = "
                        "[\"clean\", \"pgd20\"] under [set]")
    return pairs, configs


def still_held(job: Job, echo) -> str:
    """Who still holds a run marked running, or nothing once its process has ended (after up to
    DYING_S for the child of a killed grid to die)."""
    deadline = time.time() + DYING_S
    while (holder := RunDir(job.run_dir).locked_by()) and time.time() < deadline:
        time.sleep(0.1)
    if not holder:
        echo(f"  {job.name} was marked running but its process is gone; it resumes")
    return holder


def run_grid(grid_file: str, *, out: str | None = None, gpus: str = "auto", per_gpu: int | str = "auto",
             launcher: str = "local", dry_run: bool = False, data_dir: str | None = None,
             sets: list[str] | None = None, echo=print) -> int:
    """``fastfair grid``: expand, skip done runs, launch the rest, print the comparison table.

    Returns 0 when every run is done, 1 when some failed (their error lines and logs are named)."""
    per_gpu = runs_per_gpu.parse(per_gpu)
    launch = LAUNCHERS.get(launcher)
    here = parse_gpus(gpus) if launcher == "local" else None  # a cluster's GPUs are not this machine's
    grid, path = load(grid_file)
    override(grid, data_dir, sets or [])
    root = Path(out or f"runs/grids/{grid.name}")
    pairs, configs = jobs(grid, root)
    status = {run.name: read_state(root / run.name)["status"] for run, _ in pairs}
    todo = [job for run, job in pairs if status[run.name] != "done"]
    echo(f"grid {grid.name} ({path}): {len(pairs)} runs in {root}, {len(pairs) - len(todo)} done"
         + (f"\n{grid.preset}" if grid.preset else "")
         + (f"\nevery run with: {' '.join(f'{k}={toml_value(v)}' for k, v in grid.overrides.items())}"
            if grid.overrides else ""))
    if todo:
        per_gpu = runs_per_gpu.resolve(per_gpu, [configs[job.name] for job in todo], here, echo)
    if dry_run:
        echo("a dry run loads no data; the grid itself loads every run's data before the first run starts")
        for run, job in pairs:
            resumes = status[run.name] != "done" and RunDir(job.run_dir).last.is_file()
            state = status[run.name] + (" (resumes from its checkpoint)" if resumes else "")
            echo(f"  {run.name:<40} {state:<10} {' '.join(f'{k}={toml_value(v)}' for k, v in run.point.items())}")
        if todo:
            echo("first command: " + shlex.join(todo[0].command()))
        return 0
    check_data(grid, {job.name: configs[job.name] for job in todo})  # a done run needs no data
    with RunDir(root).lock(echo):  # one grid process per grid folder
        busy = [f"{run.name} ({holder})" for run, job in pairs
                if status[run.name] == "running" and (holder := still_held(job, echo))]
        if busy:
            raise UserError(f"runs still being trained by another process: {', '.join(busy)}; wait for them "
                            "to end (or stop them), then run the grid again")
        if todo:
            try:
                launch(todo, gpus=gpus, per_gpu=per_gpu, options=grid.launcher.get(launcher, {}),
                       folder=root / f".{launcher}", echo=echo)
            except KeyboardInterrupt as err:  # a stop signal: the children saved and stopped; say what each kept
                raise stopped(err, [(run.name, root / run.name) for run, _ in pairs]) from None
        states = {run.name: read_state(root / run.name)["status"] for run, _ in pairs}
        failed = [name for name, state in states.items() if state != "done"]
        finished = [root / run.name for run, _ in pairs if run.name not in failed]
        if finished:
            table = compare(finished)  # the same table as `fastfair report`; seeds folded there
            write_text_atomic(table + "\n", root / "results.md")
            echo("\n" + table + f"\n\nwritten: {root / 'results.md'}")
    interrupted = sum(states[name] == "interrupted" for name in failed)  # a child someone else stopped
    echo(f"\n{len(finished)} of {len(pairs)} runs finished, {len(failed) - interrupted} failed"
         + (f", {interrupted} interrupted" if interrupted else "")
         + "".join(f"\n  {outcome(n, root / n)}" for n in failed))
    if failed:
        echo("fix the cause and run the same command again: done runs are skipped, the others resume")
        return 1
    return 0
