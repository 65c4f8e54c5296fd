"""The teacher of a distillation method (ABSLD; RSLAD and ARD read one the same way): a frozen model in eval mode.

``method.teacher`` names it in one of three ways, each loaded without unpickling anything:

* a fastfair run directory: the checkpoint its ``train.select`` names (as ``fastfair eval RUN`` picks it);
* a ``.pt`` checkpoint written by ``fastfair train`` (its model spec rebuilds the architecture);
* ``rb:NAME``, a RobustBench model (``fastfair zoo`` lists them), its weights in ``method.teacher_model_dir``
  (RobustBench's layout, fetched there by ``fastfair zoo --fetch``).

A teacher that cannot serve the run (no such file or name, another number of classes) is one UserError before
the first epoch: :func:`check_source` from the config alone (``Method.check``), :func:`load_teacher` once the
data set's classes are known (``Method.setup``).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

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


# build, rundir and robustbench are imported where a teacher loads: build imports config, which imports every method
def _from_run(source: str) -> tuple[nn.Module, int, str]:
    from fastfair import build
    from fastfair.rundir import load_checkpoint

    path = build.checkpoint_path(source)
    ck = load_checkpoint(path)
    model = build.model_from_spec(ck["spec"], torch.device("cpu"), False)
    model.load_state_dict(ck["model"])
    return model, int(ck["spec"]["num_classes"]), str(path)


def _from_zoo(name: str, dataset: str, model_dir: str) -> tuple[nn.Module, int, str]:
    from fastfair.evaluation import robustbench

    if dataset not in robustbench.DATASETS:
        raise UserError(f"method.teacher={RB}{name}: RobustBench holds {', '.join(robustbench.DATASETS)} models; "
                        f"this run trains on {dataset}: give a fastfair run or checkpoint of {dataset} instead")
    if not robustbench.installed():
        raise UserError(f"method.teacher={RB}{name} needs RobustBench: {robustbench.INSTALL}")
    path = robustbench.model_file(name, dataset, model_dir=model_dir)
    if not path.is_file():
        raise UserError(f"method.teacher={RB}{name}: no weights at {path}; "
                        f"{robustbench.place(name, dataset, robustbench.THREAT, model_dir)}")
    model, _ = robustbench.load(name, dataset=dataset, model_dir=model_dir, echo=lambda *a: None)
    return model, {"cifar10": 10, "cifar100": 100}[dataset], f"{RB}{name} ({path})"


def load_teacher(source: str, *, dataset: str, num_classes: int, device, model_dir: str = "./models") -> nn.Module:
    """The teacher ``source`` names (module docstring) on ``device``, in eval mode, its parameters frozen; a
    UserError where it has other than ``num_classes`` outputs."""
    check_source(source, "the method")
    if source.startswith(RB):
        model, classes, where = _from_zoo(source[len(RB):], dataset, model_dir)
    else:
        model, classes, where = _from_run(source)
    if classes != num_classes:
        raise UserError(f"method.teacher {where} has {classes} classes and this run's data set {num_classes}; "
                        "give a teacher trained on the same classes")
    model = model.to(device).eval()
    model.requires_grad_(False)
    return model

