"""The optimiser (``train.optimizer``) and the learning-rate schedule (``train.lr_schedule``) of a run.

Every schedule is a pure function of the epoch (0-based) and the part of it done, which the trainer
sets before every step: a resumed run continues it exactly with no scheduler state to save, and a
schedule key ``--resume`` changes (``config.RESUMABLE``) acts from the resumed epoch on. The step
schedule reads the epoch alone (MultiStepLR's epoch-wise decay); the others are per step and read
the fractional epoch ``t = epoch + (i + 1) / steps`` after step ``i``, as Wong et al. 2020's and Rice
et al. 2020's code set ``lr_schedule(epoch + (i + 1) / len(loader))`` before each step.
"""
from __future__ import annotations

import collections
import math
from dataclasses import fields
from typing import Callable

import numpy as np
import torch

from fastfair.config import TrainConfig
from fastfair.registry import Registry

OPTIMIZERS: Registry = Registry("optimizer")
LR_SCHEDULES: Registry = Registry("learning-rate schedule")


def implementation(dev: torch.device) -> dict:
    """The optimiser's implementation: one fused kernel on CUDA, multi-tensor (foreach) elsewhere."""
    return {"fused": True} if dev.type == "cuda" else {"foreach": True}


@OPTIMIZERS.register("sgd", "SGD with heavy-ball momentum (Polyak 1964) or Nesterov's (Sutskever et al. 2013); "
                            "train.weight_decay as an L2 term added to the gradient")
def _sgd(params, t: TrainConfig, impl: dict) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay, nesterov=t.nesterov,
                           **impl)


@OPTIMIZERS.register("adam", "Adam (Kingma & Ba 2015, Alg. 1; train.adam_betas, train.adam_eps); "
                             "train.weight_decay as an L2 term added to the gradient, which the moments then rescale")
def _adam(params, t: TrainConfig, impl: dict) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=t.lr, betas=tuple(t.adam_betas), eps=t.adam_eps, weight_decay=t.weight_decay,
                            **impl)


@OPTIMIZERS.register("adamw", "AdamW (Loshchilov & Hutter 2019, Alg. 2): Adam with decoupled weight decay, "
                              "w <- w - lr_t * train.weight_decay * w each step (torch.optim.AdamW: the decay "
                              "follows the schedule, so the paper's lambda is train.weight_decay * train.lr)")
def _adamw(params, t: TrainConfig, impl: dict) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=t.lr, betas=tuple(t.adam_betas), eps=t.adam_eps,
                             weight_decay=t.weight_decay, **impl)


def optimizer(t: TrainConfig, params, dev: torch.device) -> torch.optim.Optimizer:
    """The run's optimiser over ``params``; its state (Adam's moments) is a plain tensor dict for the checkpoint."""
    return OPTIMIZERS.get(t.optimizer)(params, t, implementation(dev))


Rate = Callable[[int, float], float]  # (0-based epoch, part of it done after this step, in (0, 1]) -> rate


@LR_SCHEDULES.register("step", "train.lr times train.lr_gamma after each of train.lr_milestones, per epoch "
                               "(MultiStepLR; the decay of Madry et al. 2018's and most AT codes)")
def _step(t: TrainConfig) -> Rate:
    """lr * gamma^(milestones <= epoch), multiplied in milestone order as MultiStepLR does, so its rates agree to the
    last bit with the torch scheduler that earlier fastfair runs stepped once per epoch."""
    lr, gamma, counts = t.lr, t.lr_gamma, sorted(collections.Counter(t.lr_milestones).items())

    def rate(epoch: int, done: float) -> float:
        out = lr
        for milestone, n in counts:
            if milestone <= epoch:
                out = out * gamma ** n
        return out

    return rate


@LR_SCHEDULES.register("cosine", "cosine annealing from train.lr to train.lr_min over the run, per step "
                                 "(Loshchilov & Hutter 2017, SGDR Eq. 5 without restarts)")
def _cosine(t: TrainConfig) -> Rate:
    """eta_min + (eta_max - eta_min) (1 + cos(pi T_cur / T)) / 2 (Loshchilov & Hutter 2017, Eq. 5), one period over
    the run, T_cur the fractional epoch (the paper updates it every batch)."""
    hi, lo, total = t.lr, t.lr_min, t.epochs
    return lambda epoch, done: lo + (hi - lo) * (1 + math.cos(math.pi * (epoch + done) / total)) / 2


@LR_SCHEDULES.register("cyclic", "triangular cycles between train.lr_min and train.lr, each train.lr_cycle_epochs "
                                 "long (0: one cycle over the run, as Wong et al. 2020's train_fgsm.py), per step "
                                 "(Smith 2017)")
def _cyclic(t: TrainConfig) -> Rate:
    """Smith 2017's triangular policy (Sec. 3.1): cycle = floor(1 + it / 2s), x = |it / s - 2 cycle + 1|,
    lr = base + (max - base) max(0, 1 - x), with it the fractional epoch and s half of train.lr_cycle_epochs."""
    hi, lo = t.lr, t.lr_min
    half = (t.lr_cycle_epochs or t.epochs) / 2

    def rate(epoch: int, done: float) -> float:
        it = epoch + done
        cycle = math.floor(1 + it / (2 * half))
        return lo + (hi - lo) * max(0.0, 1 - abs(it / half - 2 * cycle + 1))

    return rate


@LR_SCHEDULES.register("onecycle", "linear from train.lr_min up to train.lr at train.lr_peak_epoch (0: 2/5 of the "
                                   "run) and down to train.lr_min at the end, per step (Smith & Topin 2019; Wong et "
                                   "al. 2020's train_cifar.py)")
def _onecycle(t: TrainConfig) -> Rate:
    """One cycle (Smith & Topin 2019) as Wong et al. 2020's CIFAR code draws it (np.interp): linear from lr_min at
    epoch 0 up to lr at the peak epoch (their epochs * 2 // 5 by default) and down to lr_min at the end."""
    peak = peak_epoch(t)
    xs, ys = ([0, peak, t.epochs], [t.lr_min, t.lr, t.lr_min]) if peak < t.epochs else ([0, peak], [t.lr_min, t.lr])
    return lambda epoch, done: float(np.interp(epoch + done, xs, ys))


@LR_SCHEDULES.register("piecewise", "piecewise linear through train.lr_epochs / train.lr_values, per step (Wong et "
                                    "al. 2020's ImageNet schedule)")
def _piecewise(t: TrainConfig) -> Rate:
    """Piecewise linear through (train.lr_epochs, train.lr_values), as Wong et al. 2020's ImageNet code
    (main_fast.py: np.interp over its configs' lr_epochs, lr_values)."""
    xs, ys = list(t.lr_epochs), list(t.lr_values)
    return lambda epoch, done: float(np.interp(epoch + done, xs, ys))


def peak_epoch(t: TrainConfig) -> float:
    """onecycle's peak: train.lr_peak_epoch, or Wong et al.'s epochs * 2 // 5 for 0."""
    return t.lr_peak_epoch or t.epochs * 2 // 5


def schedule(t: TrainConfig) -> Rate:
    """The run's rate as a function of (0-based epoch, part of the epoch done after the step)."""
    return LR_SCHEDULES.get(t.lr_schedule)(t)


def spans_run(t: TrainConfig) -> bool:
    """Whether the schedule's curve is drawn over train.epochs, so that a run made longer redraws it."""
    return t.lr_schedule in ("cosine", "onecycle") or (t.lr_schedule == "cyclic" and not t.lr_cycle_epochs)


# key -> (the choice, the values of it that read the key): a value of the key other than its default (and other
# than "none": false, 0, []) beside another choice would do nothing (fastfair.checks says so)
READ_BY: dict[str, tuple[str, tuple[str, ...]]] = {
    "momentum": ("optimizer", ("sgd",)), "nesterov": ("optimizer", ("sgd",)),
    "adam_betas": ("optimizer", ("adam", "adamw")), "adam_eps": ("optimizer", ("adam", "adamw")),
    "lr_milestones": ("lr_schedule", ("step",)), "lr_gamma": ("lr_schedule", ("step",)),
    "lr_min": ("lr_schedule", ("cosine", "cyclic", "onecycle")),
    "lr_cycle_epochs": ("lr_schedule", ("cyclic",)), "lr_peak_epoch": ("lr_schedule", ("onecycle",)),
    "lr_epochs": ("lr_schedule", ("piecewise",)), "lr_values": ("lr_schedule", ("piecewise",)),
}


def unread(t: TrainConfig) -> list[tuple[str, str]]:
    """(key, choice) of each train key set to something beside a choice that does not read it (:data:`READ_BY`)."""
    defaults = {f.name: f.default_factory() if callable(f.default_factory) else f.default for f in fields(t)}
    out = []
    for key, (choice, readers) in READ_BY.items():
        value = getattr(t, key)
        if getattr(t, choice) not in readers and value and value != defaults[key]:
            out.append((key, choice))
    return out


def describe(t: TrainConfig) -> str:
    """One line naming the optimiser and the schedule with the values they read."""
    betas = f"betas {t.adam_betas[0]:g}, {t.adam_betas[1]:g}, eps {t.adam_eps:g}"
    opt = {"sgd": f"momentum {t.momentum:g}{', Nesterov' if t.nesterov else ''}, weight decay {t.weight_decay:g} (L2)",
           "adam": f"{betas}, weight decay {t.weight_decay:g} (L2)",
           "adamw": f"{betas}, weight decay {t.weight_decay:g} (decoupled)"}[t.optimizer]
    rate = {"step": f"{t.lr:g}, x{t.lr_gamma:g} after epochs {t.lr_milestones}, per epoch",
            "cosine": f"{t.lr:g} down to {t.lr_min:g}, per step",
            "cyclic": f"{t.lr_min:g} up to {t.lr:g} and back every {t.lr_cycle_epochs or t.epochs:g} epochs, per step",
            "onecycle": f"{t.lr_min:g} up to {t.lr:g} at epoch {peak_epoch(t):g}, down to {t.lr_min:g} at "
                        f"{t.epochs}, per step",
            "piecewise": f"through {list(zip(t.lr_epochs, t.lr_values))} (epoch, rate), per step"}[t.lr_schedule]
    return f"optimizer {t.optimizer} ({opt}); lr_schedule {t.lr_schedule} ({rate})"
