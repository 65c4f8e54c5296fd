"""Experiment tracking: the epoch's numbers per class, and the final figures, to TensorBoard or W&B.

``train.track`` picks a tracker from :data:`TRACKERS` (``none`` by default). Each is an optional
extra, imported only when chosen; a missing package is one ``fastfair: error:`` line naming the
install before any training starts. Trackers write inside the run directory
(``RUN/tensorboard/``, ``RUN/wandb/``), so a run's numbers and its tracking stay together.

What is logged, under the same names in both:

* per epoch (step = the 1-based epoch): ``train/loss``, ``train/lr``, ``train/images_per_s``,
  ``train/robust_acc`` and ``train/robust_acc/<class>``, and for each validation attack
  ``val/<attack>/{avg,worst,cv,mcd}`` and ``val/<attack>/<class>``;
* after the final evaluation: ``test/<attack>/{avg,worst,cv,mcd}`` and ``test/<attack>/<class>``, and
  the per-class figure as an image.
"""
from __future__ import annotations

import importlib
import os
from pathlib import Path

from fastfair.errors import UserError
from fastfair.registry import Registry
from fastfair.rundir import write_text_atomic

TRACKERS: Registry = Registry("tracker")
SUMMARY_KEYS = ("avg", "worst", "cv", "mcd")  # cv: variance of per-class accuracy, %^2 (Tian et al.'s "CV")


def _require(module: str, extra: str):
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UserError(f"train.track={extra} needs the optional extra: pip install 'fastfair[{extra}]'; "
                        "or set train.track=none") from None


def scalars(record: dict, classes: list[str]) -> dict[str, float]:
    """The scalars of one metrics.jsonl record, named as the module docstring lists them."""
    out = {"train/loss": record["loss"], "train/lr": record["lr"], "train/images_per_s": record["images_per_s"],
           "train/robust_acc": record["train_robust_acc"]}
    out.update({f"train/robust_acc/{c}": v for c, v in zip(classes, record["train_robust_acc_per_class"])})
    for attack, v in record["val"].items():
        out.update(_result(f"val/{attack}", v, v["per_class"], classes))
    return out


def result_scalars(split: str, results: dict, classes: list[str]) -> dict[str, float]:
    """The scalars of an evaluation's results (``{attack: {"per_class", "summary"}}``)."""
    out = {}
    for attack, r in results.items():
        out.update(_result(f"{split}/{attack}", r["summary"], r["per_class"], classes))
    return out


def _result(prefix: str, summary: dict, per_class: list[float], classes: list[str]) -> dict[str, float]:
    return {**{f"{prefix}/{k}": summary[k] for k in SUMMARY_KEYS if k in summary},
            **{f"{prefix}/{c}": a for c, a in zip(classes, per_class) if a is not None}}  # None: an absent class


class Tracker:
    """No tracking: what every tracker does, as nothing."""

    def __init__(self, run_dir: Path, config: dict):
        self.run_dir = run_dir

    def log(self, values: dict[str, float], step: int) -> None:
        pass

    def image(self, name: str, png: Path, step: int) -> None:
        pass

    def close(self) -> None:
        pass


TRACKERS.register("none", "no experiment tracking")(Tracker)


@TRACKERS.register("tensorboard", "TensorBoard event files in RUN/tensorboard (pip install 'fastfair[tensorboard]')")
class TensorBoard(Tracker):
    def __init__(self, run_dir: Path, config: dict):
        super().__init__(run_dir, config)
        _require("tensorboard", "tensorboard")  # torch's writer needs it; say so before any training
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))
        self.writer.add_text("config", "\n".join(f"    {k} = {v!r}" for k, v in sorted(config.items())), 0)

    def log(self, values: dict[str, float], step: int) -> None:
        for name, v in values.items():
            self.writer.add_scalar(name, v, step)
        self.writer.flush()  # a killed run keeps its epochs in the event file

    def image(self, name: str, png: Path, step: int) -> None:
        import matplotlib.image

        self.writer.add_image(name, matplotlib.image.imread(png)[..., :3], step, dataformats="HWC")
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


@TRACKERS.register("wandb", "Weights & Biases, RUN/wandb; offline with WANDB_MODE=offline (pip install "
                            "'fastfair[wandb]')")
class WandB(Tracker):
    """One W&B run per run directory: its id is kept in RUN/wandb-id, so --resume and the final
    evaluation continue the same W&B run instead of starting new ones."""

    def __init__(self, run_dir: Path, config: dict):
        super().__init__(run_dir, config)
        wandb = _require("wandb", "wandb")
        id_file = run_dir / "wandb-id"
        run_id = id_file.read_text().strip() if id_file.is_file() else wandb.util.generate_id()
        write_text_atomic(run_id, id_file)
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "fastfair"), id=run_id, resume="allow",
                              dir=str(run_dir), name=run_dir.name, config=config)

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def image(self, name: str, png: Path, step: int) -> None:
        self.run.log({name: self.wandb.Image(str(png))}, step=step)

    def close(self) -> None:
        self.run.finish()


def open_tracker(name: str, run_dir: str | Path, config: dict) -> Tracker:
    """The tracker ``train.track`` names, writing into ``run_dir``; ``config``: the flat config it records."""
    return TRACKERS.get(name)(Path(run_dir), config)
