"""The GPU figures fastfair ships: training steps measured on lent GPUs, and predicted from the CUDA code Inductor
generates on a CPU, for the rules that pick the CUDA defaults (:mod:`fastfair.gpu_defaults`) and the runs per GPU
(:mod:`fastfair.scaleout.per_gpu`).

The package never reads ``bench/`` (it may be installed from a wheel): ``gpu_figures.json`` beside this module is
generated from ``bench/results`` by ``python bench/speed_report.py --write``, and a test fails when it is stale.
Its format (every list may be empty):

- ``host_launch_us``, ``host_launch_basis``: the host's cost of one kernel launch without CUDA graphs, and where
  that figure comes from;
- ``predicted``: one row per (method, model, batch) that ``bench/lease/gpu_codegen.py`` counted (PGD-10, CIFAR-shaped
  images, the CUDA defaults): ``launches`` (all per step), ``launches_outside`` (those outside any recorded graph),
  the attack's ``bn_mode`` and ``objective``, ``s_gpu`` (the roofline's GPU seconds per step by device family,
  ``h100`` / ``h200`` / ``a100``) and ``memory_gib`` (a run's GPU memory, see ``memory_basis``);
- ``training``: measured rows (``device``, ``time_utc``, method, model, batch, ``loop`` reference | fastfair,
  ``graphs`` and ``cpp_wrapper`` (true / false; null for the reference), ``images_per_s`` (null when the
  configuration failed: ``note`` says why), ``fell_back`` (true: its CUDA graphs failed the check of the first
  steps, so the step without them was timed), ``memory_gib`` (null where not measured));
- ``concurrency``: measured aggregate images/s of ``k`` concurrent runs of one configuration on one GPU;
- ``gpu_tests``: per GPU lease, ``graphs_test``: passed | failed | not run (the test that compares a step recorded
  as CUDA graphs with the same step launched kernel by kernel).
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

FILE = Path(__file__).with_name("gpu_figures.json")
FAMILIES = ("h100", "h200", "a100")  # the devices the predictions are made for (bench/lease/gpu_codegen.py DEVICES)
UNKNOWN_FAMILY = "h100"  # a GPU of none of the families is predicted as an H100 (the reason says so)


@dataclass(frozen=True)
class Figures:
    host_launch_us: float
    host_launch_basis: str
    memory_basis: str
    predicted: tuple[dict, ...]
    training: tuple[dict, ...]
    concurrency: tuple[dict, ...]
    gpu_tests: tuple[dict, ...]


def from_dict(data: dict) -> Figures:
    return Figures(data["host_launch_us"], data["host_launch_basis"], data["memory_basis"],
                   *(tuple(data[k]) for k in ("predicted", "training", "concurrency", "gpu_tests")))


@functools.cache
def shipped() -> Figures:
    """The figures shipped with this fastfair."""
    return from_dict(json.loads(FILE.read_text()))


def family(device: str) -> str:
    """The prediction family of a GPU name (``torch.cuda.get_device_name``): h100, h200 or a100."""
    name = device.lower()
    return next((f for f in FAMILIES if f in name), UNKNOWN_FAMILY)


def latest(rows, key) -> list[dict]:
    """Per ``key(row)``, the row measured last (``time_utc``): a configuration measured again replaces its figure."""
    out: dict = {}
    for row in sorted(rows, key=lambda r: r["time_utc"]):
        out[key(row)] = row
    return list(out.values())


def predicted_step(fig: Figures, method: str, model: str, batch: int, bn_mode: str, objective: str
                   ) -> tuple[dict | None, str]:
    """The predicted row for a run, and how it was matched ("" when exactly). A method without a row of its own
    takes one whose attack runs BatchNorm in the same mode with the same objective (what sets a step's launches
    and bytes: docs/performance.md); another batch size takes the nearest counted one."""
    rows = [r for r in fig.predicted if r["model"] == model]
    same = [r for r in rows if r["method"] == method]
    like = same or [r for r in rows if (r["bn_mode"], r["objective"]) == (bn_mode, objective)]
    if not like:
        return None, ""
    row = min(like, key=lambda r: (abs(r["batch"] - batch), r["batch"], r["method"]))
    notes = ([] if same else [f"counted as {row['method']} (its attack: BN {bn_mode}, {objective})"]) + \
        ([f"counted at batch {row['batch']}"] if row["batch"] != batch else [])
    return row, "; ".join(notes)


def predicted_memory_gib(fig: Figures, method: str, model: str, batch: int) -> float:
    """A run's predicted GPU memory at ``batch``: linear in the batch through the counted batch sizes (a part per
    image, the activations, and a fixed part, the weights, the data set and the context; one size: proportional)."""
    rows = sorted((r for r in fig.predicted if (r["method"], r["model"]) == (method, model)), key=lambda r: r["batch"])
    (b0, m0), (b1, m1) = [(r["batch"], r["memory_gib"]) for r in (rows[0], rows[-1])]
    per_image = (m1 - m0) / (b1 - b0) if b1 != b0 else m0 / b0
    return m0 + per_image * (batch - b0)
