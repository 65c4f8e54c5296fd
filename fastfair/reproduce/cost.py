"""What a table costs: its training work, and GPU hours where a GPU has measured the training step.

The figures are the measured training rows the package ships (:mod:`fastfair.gpu_figures`, generated from
``bench/results``): images per second for a method and model on a CUDA device. Nothing is scaled from a CPU figure
or a prediction.
"""
from __future__ import annotations

from typing import Callable

from fastfair import config, gpu_figures
from fastfair.reproduce.paper import PaperRow
from fastfair.reproduce.tables import Table

# (training images before the validation split is carved out, classes)
TRAIN_IMAGES = {"cifar10": (50_000, 10), "cifar100": (50_000, 100), "mnist": (60_000, 10), "svhn": (73_257, 10),
                "stl10": (5_000, 10), "imagenet": (1_281_167, 1000)}


def gpu_images_per_s(fig: gpu_figures.Figures | None = None) -> dict[tuple[str, str], tuple[float, str]]:
    """(method, model) -> (fastest training images/s measured on a GPU, the device)."""
    out: dict[tuple[str, str], tuple[float, str]] = {}
    for row in (fig or gpu_figures.shipped()).training:
        key, speed = (row["method"], row["model"]), row["images_per_s"]
        if speed and speed > out.get(key, (0.0, ""))[0]:
            out[key] = (float(speed), row["device"])
    return out


def estimate(table: Table, seeds: Callable[[PaperRow], int], speeds: dict[tuple[str, str], tuple[float, str]]) -> str:
    """One line: the table's training work and GPU hours, or why there is no GPU figure; ``seeds``: the runs of a
    row (:func:`fastfair.reproduce.runs.row_seeds`)."""
    hours, devices, missing, epochs = 0.0, set(), [], 0
    for row in table.rows:
        if row.evaluated:  # a released model: evaluated, not trained
            continue
        cfg = config.resolve(row.preset)
        total, classes = TRAIN_IMAGES.get(cfg.data.dataset, (0, 0))
        images = total - cfg.data.val_per_class * classes
        epochs += cfg.train.epochs * seeds(row)
        key = (cfg.method.name, cfg.model.name)
        if key in speeds:
            hours += cfg.train.epochs * seeds(row) * images / speeds[key][0] / 3600
            devices.add(speeds[key][1])
        else:
            missing.append(f"{key[0]} on {key[1]}")
    work = f"{epochs} training epochs in all"
    if not missing:
        return f"{work}; about {hours:.1f} GPU hours of training on {', '.join(sorted(devices))} (evaluation extra)"
    gaps = ", ".join(sorted(set(missing)))
    if not speeds:
        return f"{work}; GPU hours: no GPU figure yet (no GPU has measured a training step)"
    return f"{work}; GPU hours: no GPU figure yet for {gaps}"
