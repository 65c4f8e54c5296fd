"""Which run a checkpoint belongs to (issue 58): a checkpoint read as part of a run (``--resume``'s ``last.pt`` and
``interrupted.pt``, ``fastfair eval RUN``, any ``RUN/checkpoints/X.pt`` whose result goes into ``RUN/eval/``) must
be that run's, or its numbers are filed as the run's own.

A run's id (:data:`fastfair.rundir.RUN_ID`, named in its config.toml) is in every checkpoint it writes, and a
checkpoint holds its config: one of another run (another id, none where the run has one, or one where the run has
none) is refused, and so is one whose config differs from the run's in a key ``--resume`` may not change (the data,
the model, the method: :data:`fastfair.config.RESUMABLE` names the others), or whose epoch is past the run's epochs.
The config is compared key by key as the running version parses both, rather than by a stored hash of it, which a
later version reading the same files could compute otherwise, and the refusal then names what differs. An older
fastfair's run and checkpoints (no id) get the config and epoch checks only. A checkpoint evaluated on purpose is
given as a file outside a run's ``checkpoints/`` (``fastfair eval FILE``), where nothing is checked.
"""
from __future__ import annotations

from pathlib import Path

from fastfair import config
from fastfair.errors import UserError
from fastfair.rundir import CHECKPOINTS, RUN_ID, RunDir


def check_in_run(path: str | Path, ck: dict) -> None:
    """Refuse the loaded checkpoint ``ck`` (from ``path``) when it lies in a run's ``checkpoints/`` and is not that
    run's (:func:`check`); a file elsewhere is not read as part of a run."""
    path = Path(path)
    run = RunDir.of_checkpoint(path)
    if path.parent.name == CHECKPOINTS and run.config.is_file():
        saved = run.saved_config()
        check(run, path, ck, saved.run_id, config.load_saved_text(saved.text, str(run.config)))


def check(run: RunDir, path: Path, ck: dict, run_id: str | None, cfg: config.Config) -> None:
    """Refuse ``ck`` (loaded from ``path``) as a checkpoint of ``run``, whose id is ``run_id`` (None: an older
    fastfair's run) and config ``cfg``, unless it is one: one ``fastfair: error:`` line saying what differs, how to
    move it out and how to evaluate it on purpose."""
    theirs = ck.get(RUN_ID)
    fix = (f"move it out of {run.checkpoints} (to evaluate it on purpose, `fastfair eval FILE` on it there writes its "
           f"result beside it)")
    if theirs != run_id:
        if run_id is None:
            why = f"belongs to run {theirs}, and {run.path} is an older fastfair's run, without an id"
        elif theirs is None:
            why = f"names no run, and every checkpoint of {run.path} names its run ({run_id})"
        else:
            why = f"belongs to another run ({theirs}; {run.path} is run {run_id})"
        raise UserError(f"{path} {why}: it was copied in from elsewhere, so fastfair does not read it as this run's; "
                        f"{fix}")
    own = config.load_saved_text(ck["config"], str(path))
    differ = _differences(own, cfg)
    if differ:
        raise UserError(f"{path} was trained with other settings than {run.config} ({'; '.join(differ)}): it is "
                        f"another run's checkpoint, so fastfair does not read it as this run's; {fix}")
    if ck["epoch"] > cfg.train.epochs:
        raise UserError(f"{path} holds epoch {ck['epoch']}, past the {cfg.train.epochs} epochs of {run.path} "
                        f"(train.epochs): it is another run's checkpoint, so fastfair does not read it as this run's; "
                        f"{fix}")


def _differences(ck_cfg: config.Config, run_cfg: config.Config, shown: int = 3) -> list[str]:
    """``key 'checkpoint's value', the run's 'value'`` for the first ``shown`` keys outside
    :data:`config.RESUMABLE` (the preset's name aside) whose values differ, and how many more."""
    ours, theirs = config.flatten(ck_cfg.to_dict()), config.flatten(run_cfg.to_dict())
    keys = [k for k in sorted(set(ours) | set(theirs))
            if k != "preset" and k not in config.RESUMABLE and ours.get(k) != theirs.get(k)]
    said = [f"{k} {ours.get(k)!r}, the run's {theirs.get(k)!r}" for k in keys[:shown]]
    return said + ([f"{len(keys) - shown} more"] if len(keys) > shown else [])
