"""What a table costs: its training work, and GPU hours where a committed GPU benchmark figure exists.

The figures are ``bench/results/*.json`` of the source checkout (``python -m bench ...`` writes
them): training rows measured on a CUDA device give images per second for a method and model.
Nothing is scaled from a CPU figure: those are smoke runs of a tiny CNN and say nothing about a
ResNet-18 on a GPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import fastfair
from fastfair import config
from fastfair.reproduce.tables import Table

BENCH = Path(fastfair.__file__).resolve().parents[1] / "bench" / "results"
# (training images before the validation split is carved out, classes)
TRAIN_IMAGES = {"cifar10": (50_000, 10), "cifar100": (50_000, 100), "mnist": (60_000, 10), "svhn": (73_257, 10),
                "stl10": (5_000, 10), "imagenet": (1_281_167, 1000)}


def gpu_images_per_s(folder: Path = BENCH) -> dict[tuple[str, str], tuple[float, str]]:
    """(method, model) -> (fastest training images/s on a GPU, the device), from the committed figures."""
    out: dict[tuple[str, str], tuple[float, str]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        header = data.get("header", {}) if isinstance(data, dict) else {}
        if data.get("bench") != "training" or header.get("device_type") != "cuda" or data.get("smoke"):
            continue
        for row in data.get("rows", []):
            key, speed = (row.get("method"), row.get("model")), row.get("images_per_s")
            if speed and speed > out.get(key, (0.0, ""))[0]:
                out[key] = (float(speed), header.get("device", "GPU"))
    return out


def estimate(table: Table, seeds: int, speeds: dict[tuple[str, str], tuple[float, str]]) -> str:
    """One line: the table's training work and GPU hours, or why there is no GPU figure."""
    hours, devices, missing, epochs = 0.0, set(), [], 0
    for row in table.rows:
        if row.robustbench:  # a released model: evaluated, not trained
            continue
        cfg = config.resolve(row.preset)
        total, classes = TRAIN_IMAGES.get(cfg.data.dataset, (0, 0))
        images = total - cfg.data.val_per_class * classes
        epochs += cfg.train.epochs * seeds
        key = (cfg.method.name, cfg.model.name)
        if key in speeds:
            hours += cfg.train.epochs * seeds * images / speeds[key][0] / 3600
            devices.add(speeds[key][1])
        else:
            missing.append(f"{key[0]} on {key[1]}")
    work = f"{epochs} training epochs in all"
    if not missing:
        return f"{work}; about {hours:.1f} GPU hours of training on {', '.join(sorted(devices))} (evaluation extra)"
    gaps = ", ".join(sorted(set(missing)))
    if not speeds:
        return (f"{work}; GPU hours: no GPU figure yet (bench/results holds CPU smoke figures of a tiny CNN only, "
                "which say nothing about these models on a GPU)")
    return f"{work}; GPU hours: no GPU figure yet for {gaps}"
