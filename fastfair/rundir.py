"""The run directory, the contract between ``fastfair train``, ``eval``, ``diagnose``, ``report`` and ``grid``;
this module is the one place that names its files::

    RUN/config.toml                                   the resolved config (written atomically)
    RUN/metrics.jsonl                                 one JSON line per finished epoch
    RUN/checkpoints/last.pt                           full training state, rewritten atomically every epoch
    RUN/checkpoints/best_<policy>.pt                  best weights by each selection policy
    RUN/checkpoints/{best_<policy>,last}_avg.pt       the same for the EMA/FAWA-averaged model
    RUN/eval/<checkpoint>-<split>.json                per-class evaluation (+ .aa.npz: AutoAttack's resume state)
    RUN/eval/previous/<checkpoint>-<split>-<hash>.json  earlier results of other weights, data or settings
    RUN/diagnostics/<checkpoint>-<split>-<attack>.json
    RUN/train.log, RUN/grid-state.json                a grid run's output and its done/failed state

Checkpoints are written atomically and loaded with ``torch.load(weights_only=True)``, so a crash never
leaves a torn file and loading never unpickles arbitrary objects.
"""
from __future__ import annotations

import json
import os
import tempfile
import zipfile
from pathlib import Path

import torch

from fastfair.errors import UserError

CHECKPOINTS = "checkpoints"


class RunDir:
    """Paths of one run directory's files, and the reads and writes that must stay consistent."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def of_checkpoint(cls, checkpoint: str | Path) -> RunDir:
        """The run a checkpoint file belongs to: RUN for RUN/checkpoints/X.pt, else the file's folder."""
        folder = Path(checkpoint).parent
        return cls(folder.parent if folder.name == CHECKPOINTS else folder)

    # ---- paths ------------------------------------------------------------------------------
    @property
    def config(self) -> Path:
        return self.path / "config.toml"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def train_log(self) -> Path:
        return self.path / "train.log"

    @property
    def grid_state(self) -> Path:
        return self.path / "grid-state.json"

    def checkpoint(self, name: str, averaged: bool = False) -> Path:
        """``checkpoints/<name>.pt``, or ``<name>_avg.pt`` for the averaged (EMA/FAWA) model."""
        return self.checkpoints / f"{name}{'_avg' if averaged else ''}.pt"

    @property
    def last(self) -> Path:
        return self.checkpoint("last")

    def best(self, policy: str, averaged: bool = False) -> Path:
        return self.checkpoint(f"best_{policy}", averaged)

    def selected_checkpoint(self, select: str, averaged: bool = False) -> Path:
        """The checkpoint a selection policy (``train.select``) picks: ``last.pt`` for ``last``, else its best."""
        return self.checkpoint("last", averaged) if select == "last" else self.best(select, averaged)

    def eval_file(self, checkpoint: Path, split: str) -> Path:
        return self.path / "eval" / f"{Path(checkpoint).stem}-{split}.json"

    def previous_eval_file(self, checkpoint: Path, split: str, tag: str) -> Path:
        """Where an earlier result of other weights, data or settings goes instead of being overwritten."""
        return self.path / "eval" / "previous" / f"{Path(checkpoint).stem}-{split}-{tag}.json"

    def eval_files(self) -> list[Path]:
        return sorted((self.path / "eval").glob("*.json"))

    def diagnostics_file(self, checkpoint: Path, split: str, attack: str) -> Path:
        return self.path / "diagnostics" / f"{Path(checkpoint).stem}-{split}-{attack}.json"

    def diagnostics_files(self) -> list[Path]:
        return sorted((self.path / "diagnostics").glob("*.json"))

    # ---- config and metrics -----------------------------------------------------------------
    def read_config(self) -> str:
        """The saved config's TOML text; a folder without one is not a run directory."""
        if not self.config.is_file():
            raise UserError(f"{self.path} is not a run directory (no config.toml); "
                            "pass a folder written by fastfair train")
        return self.config.read_text()

    def write_config(self, text: str) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        write_text_atomic(text, self.config)

    def append_metrics(self, record: dict) -> None:
        with open(self.metrics, "a") as f:
            f.write(json.dumps(record) + "\n")

    def read_metrics(self) -> list[dict]:
        if not self.metrics.is_file():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def truncate_metrics(self, epoch: int) -> None:
        """Drop the lines of ``epoch`` and later: on resume, the epochs ``last.pt`` does not hold (a kill
        between an epoch's metrics line and its checkpoint leaves such a line; the epoch is redone)."""
        if self.metrics.is_file():
            keep = [line for line in self.metrics.read_text().splitlines()
                    if line and json.loads(line)["epoch"] < epoch]
            write_text_atomic("".join(line + "\n" for line in keep), self.metrics)


# ---- file formats: atomic writes, safe loads ------------------------------------------------
def save_atomic(obj, path: str | Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: a crash
    leaves either the old file or the new one, never a torn one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(text: str, path: str | Path) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path, map_location="cpu") -> dict:
    """Load a fastfair checkpoint without unpickling arbitrary objects."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; pass a run directory or a .pt file written by fastfair train")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip; torch.load on other files fails obscurely
        raise UserError(f"{path} is not a checkpoint written by fastfair train; "
                        "pass a run directory or a .pt file from its checkpoints/")
    return torch.load(path, map_location=map_location, weights_only=True)


def init_model(model, path: str | Path) -> None:
    """Start training from another run's model weights (``train.init_from``; FRL fine-tunes a robust model)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"train.init_from: no checkpoint at {path}; pass a .pt file written by fastfair train")
    ck = load_checkpoint(path)
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as err:
        raise UserError(f"train.init_from: {path} holds a different model ({str(err).splitlines()[0]}); "
                        "use the same model.name, width, norm, head and classes as that run") from None
