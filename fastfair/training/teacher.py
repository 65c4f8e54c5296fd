"""Loads a distillation method's teacher (``method.teacher``: a fastfair run, a checkpoint file or ``rb:NAME``; its
keys and their config check are ``fastfair.methods.teacher``'s) frozen, in eval mode, without unpickling anything."""
from __future__ import annotations

import torch
from torch import nn

from fastfair import build
from fastfair.errors import UserError
from fastfair.evaluation import robustbench
from fastfair.methods.teacher import RB, check_source
from fastfair.rundir import instead_of_model_flag, load_checkpoint


def _from_run(source: str) -> tuple[nn.Module, int, str]:
    path = build.checkpoint_path(source)
    with instead_of_model_flag(f"method.teacher takes a fastfair run, its checkpoint or {RB}NAME (a RobustBench "
                               "model)"):
        ck = load_checkpoint(path)
    model = build.model_from_spec(ck["spec"], torch.device("cpu"), False)
    model.load_state_dict(ck["model"])
    return model, int(ck["spec"]["num_classes"]), str(path)


def _from_zoo(name: str, dataset: str, model_dir: str) -> tuple[nn.Module, int, str]:
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



def attach(method, num_classes: int, device) -> None:
    """Gives a distilling method (``method.distils``) the teacher its config names, unless a loop of your own handed
    it one already (``method.teacher = net``); what the trainer and ``fastfair.method`` do before ``setup``."""
    if method.distils and method.teacher is None:
        m = method.cfg.method
        method.teacher = load_teacher(m.teacher, dataset=method.cfg.data.dataset, num_classes=num_classes,
                                      device=device, model_dir=m.teacher_model_dir)
