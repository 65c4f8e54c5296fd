"""The teacher of a distillation method (ABSLD; RSLAD and ARD read one the same way), as the config names it: its
keys and the check that needs nothing but the config. ``fastfair.training.teacher`` loads it (it needs build and the
run directory, which import the config, which imports every method).

``method.teacher`` names it in one of three ways, each loaded without unpickling anything:

* a fastfair run directory: the checkpoint its ``train.select`` names (as ``fastfair eval RUN`` picks it);
* a ``.pt`` checkpoint written by ``fastfair train`` (its model spec rebuilds the architecture);
* ``rb:NAME``, a RobustBench model (``fastfair zoo`` lists them), its weights in ``method.teacher_model_dir``
  (RobustBench's layout, fetched there by ``fastfair zoo --fetch``).

A teacher that cannot serve the run (no such file or name, another number of classes) is one UserError before
the first epoch: :func:`check_source` from the config alone (``Method.check``),
``fastfair.training.teacher.load_teacher`` once the data set's classes are known (the trainer, before
``Method.setup``).
"""
from __future__ import annotations

from pathlib import Path

from fastfair.errors import UserError
from fastfair.schema import Key

RB = "rb:"

KEYS = {
    "teacher": Key("", "the distillation teacher: a fastfair run directory, a checkpoint file of fastfair train, or "
                       "rb:NAME (a RobustBench model; fastfair zoo lists them)"),
    "teacher_model_dir": Key("./models", "RobustBench's model folder for an rb:NAME teacher (<dataset>/Linf/NAME.pt; "
                                         "fastfair zoo --fetch --models NAME puts it there)"),
}


def check_source(source: str, method: str) -> None:
    """A UserError naming the fix where ``method.teacher`` is empty or names no file or folder (rb: names are
    checked when loaded, which needs RobustBench's list)."""
    if not source:
        raise UserError(f"{method} distils from a teacher: give one with --set method.teacher=RUN_DIR (a fastfair "
                        "run), a checkpoint .pt file of fastfair train, or rb:NAME (a RobustBench model)")
    if not source.startswith(RB) and not Path(source).exists():
        raise UserError(f"method.teacher: no run directory or checkpoint at {source}; pass a fastfair run "
                        "directory, a .pt file from its checkpoints/, or rb:NAME")
