"""How many runs a grid (or a reproduced table) puts on each GPU: ``--per-gpu K``, or ``auto``.

A run whose host issues its kernels slower than the GPU runs them leaves the GPU idle for the difference, and K
runs side by side fill it: ``auto`` picks K from the step's figures (:mod:`fastfair.gpu_figures`), per distinct
step of the runs, and takes the smallest:

1. from a measured concurrency curve for the same step on the same GPU model: the smallest K whose aggregate
   images/s is within ``FULL`` of the best K measured;
2. else from the step's predicted times: K runs issue K / host steps a second and the GPU runs 1 / GPU seconds, so
   K = ceil(FULL x host seconds / GPU seconds per step) comes within ``FULL`` of filling it; the host issues every
   launch without CUDA graphs, only those outside the recorded graphs with them (so K = 1 for a graphed step);
3. bounded by memory: K runs of ``memory_gib`` each (measured on a GPU, else predicted) within ``MEMORY_SHARE`` of
   the smallest GPU's memory;
4. capped by host cores: ``CORES_PER_RUN`` a run (one for the Python thread that issues its launches, one for its
   compile workers, data and the rest), over every GPU's runs.

A step with no figures (another model, an image size other than CIFAR's 32x32) gets K = 1. On a machine without a
GPU ``auto`` is 1: each run's PyTorch threads already use every core, and K runs would split them (``slot_envs``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from fastfair import build, gpu_figures
from fastfair.config import Config
from fastfair.errors import UserError
from fastfair.gpu_figures import Figures, family, latest, predicted_memory_gib, predicted_step

FULL = 0.95  # a K whose aggregate throughput is within 5% of the best measured fills the GPU
MEMORY_SHARE = 0.8  # of a GPU's memory, for K runs: predicted memory is not measured, and fragmentation adds
CORES_PER_RUN = 2
CIFAR_SHAPED = ("cifar10", "cifar100", "svhn")  # 32x32 RGB: the images the figures were counted for
CUDA = torch.device("cuda")  # where a run's CUDA graphs are decided for: the GPU it will get


@dataclass(frozen=True)
class Choice:
    k: int
    why: str
    where: str = "per GPU"

    def line(self) -> str:
        return f"--per-gpu auto: {self.k} run{'s' if self.k > 1 else ''} {self.where}: {self.why}"


def parse(value) -> int | str:
    """``--per-gpu``'s value: a positive number of runs, or ``auto``; anything else is a UserError."""
    text = str(value).strip()
    if text == "auto":
        return "auto"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise UserError(f"--per-gpu takes a number of runs per GPU (1, 2, ...) or auto; got {value!r}")


def host_cores() -> int:
    """The cores this process may run on (a SLURM allocation or taskset), else every core."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_gib: float


def visible(gpus: list[str]) -> list[Gpu]:
    """Name and memory of each GPU id of ``--gpus`` (after ``parse_gpus``)."""
    props = [torch.cuda.get_device_properties(int(g)) for g in gpus]
    return [Gpu(p.name, p.total_memory / 2**30) for p in props]


def _step(cfg: Config) -> tuple:
    """What a run's figures depend on: method, model, batch, CUDA graphs on a GPU, the attack's BN mode and
    objective."""
    graphs, _ = build.cudagraphs(cfg, CUDA)
    return (cfg.method.name, cfg.model.name, cfg.data.batch_size, graphs, cfg.attack.bn_mode, cfg.attack.objective)


def _measured_k(fig: Figures, gpu: Gpu, step: tuple) -> tuple[int, str] | None:
    method, model, batch, graphs = step[:4]
    curve = sorted((r for r in latest(fig.concurrency, lambda r: (r["device"], r["method"], r["model"], r["batch"],
                                                                  r["graphs"], r["k"]))
                    if (r["device"], r["method"], r["model"], r["batch"], r["graphs"]) == (gpu.name, *step[:4])),
                   key=lambda r: r["k"])
    if not curve:
        return None
    best = max(r["images_per_s"] for r in curve)
    k = next(r["k"] for r in curve if r["images_per_s"] >= FULL * best)
    shown = ", ".join(f"K={r['k']} {r['images_per_s']:,.0f}" for r in curve)
    return k, (f"{method} {model} batch {batch} {'with' if graphs else 'without'} CUDA graphs, measured on an "
               f"{gpu.name}: aggregate img/s {shown}; K={k} is within {1 - FULL:.0%} of the best")


def _predicted_k(fig: Figures, gpu: Gpu, step: tuple) -> tuple[int, str] | None:
    method, model, batch, graphs, bn_mode, objective = step
    row, matched = predicted_step(fig, method, model, batch, bn_mode, objective)
    if row is None:
        return None
    fam = family(gpu.name)
    host = (row["launches_outside"] if graphs else row["launches"]) * fig.host_launch_us * 1e-6
    gpu_s = row["s_gpu"][fam]
    k = max(1, math.ceil(FULL * host / gpu_s))  # K runs issue K / host steps a second, the GPU runs 1 / gpu_s
    as_ = "" if fam in gpu.name.lower() else f", predicted as an {fam.upper()}"
    return k, (f"{method} {model} batch {batch} {'with' if graphs else 'without'} CUDA graphs issues "
               f"{1e3 * host:.1f} ms of launches per step for {1e3 * gpu_s:.1f} ms of GPU work (PREDICTED"
               f"{as_}{'; ' + matched if matched else ''})")


def _memory_gib(fig: Figures, step: tuple) -> tuple[float, str] | None:
    method, model, batch, graphs, bn_mode, objective = step
    measured = [r for r in latest(fig.training, lambda r: (r["device"], r["method"], r["model"], r["batch"], r["loop"],
                                                           r["graphs"], r["cpp_wrapper"]))
                if (r["loop"], r["method"], r["model"], r["batch"], r["graphs"]) == ("fastfair", *step[:4])
                and r["memory_gib"]]
    if measured:
        return max(r["memory_gib"] for r in measured), "measured"
    row, _ = predicted_step(fig, method, model, batch, bn_mode, objective)
    return (predicted_memory_gib(fig, row["method"], model, batch), "predicted") if row else None


def choose(configs: list[Config], gpus: list[Gpu], *, cores: int | None = None, fig: Figures | None = None) -> Choice:
    """``--per-gpu auto`` for runs ``configs`` on ``gpus`` (none: the CPU)."""
    if not gpus or all(c.train.device == "cpu" for c in configs):
        return Choice(1, "no GPU, and each run's PyTorch threads already use every core", "at a time")
    fig = fig or gpu_figures.shipped()
    cores = cores or host_cores()
    smallest = min(gpus, key=lambda g: g.memory_gib)
    by_cores = max(1, cores // (CORES_PER_RUN * len(gpus)))
    choices = []
    for step, dataset in dict.fromkeys((_step(c), c.data.dataset) for c in configs):
        if dataset not in CIFAR_SHAPED:
            choices.append(Choice(1, f"no figures for {dataset} images (counted for 32x32: {', '.join(CIFAR_SHAPED)})"))
            continue
        found = [_measured_k(fig, g, step) or _predicted_k(fig, g, step) for g in gpus]
        if None in found:
            choices.append(Choice(1, f"no figures for {step[0]} on {step[1]} (counted: ResNet-18, PreActResNet-18, "
                                     "WRN-34-10): give --per-gpu K"))
            continue
        k, why = min(found)
        parts = [why]
        memory = _memory_gib(fig, step)
        if memory:
            fit = max(1, int(MEMORY_SHARE * smallest.memory_gib / memory[0]))
            parts.append(f"{memory[0]:.1f} GiB a run ({memory[1]}) lets {fit} fit in {MEMORY_SHARE:.0%} of "
                         f"{smallest.memory_gib:.0f} GiB")
            k = min(k, fit)
        parts.append(f"{cores} host cores allow {by_cores}")
        choices.append(Choice(min(k, by_cores), "; ".join(parts)))
    return min(choices, key=lambda c: c.k)


def resolve(per_gpu: int | str, configs: list[Config], gpus: list[str] | None, echo=print) -> int:
    """The runs per GPU for ``configs`` on GPU ids ``gpus`` (``parse_gpus``; empty: the CPU; None: GPUs elsewhere,
    a cluster's): ``per_gpu`` itself when a number, else ``auto``'s choice, printed in one line with why."""
    if per_gpu != "auto":
        return per_gpu
    if gpus is None:
        choice = Choice(1, "the GPUs the runs will get are not visible from here; give --per-gpu K to run more")
    else:
        choice = choose(configs, visible(gpus))
    echo(choice.line())
    return choice.k
