"""The run directory, the contract between ``fastfair train``, ``eval``, ``diagnose``, ``report`` and ``grid``;
this module is the one place that names its files::

    RUN/config.toml                                   the resolved config (written atomically)
    RUN/metrics.jsonl                                 one JSON line per finished epoch
    RUN/checkpoints/last.pt                           full training state, rewritten atomically every epoch
    RUN/checkpoints/best_<policy>.pt                  best weights by each selection policy
    RUN/checkpoints/{best_<policy>,last}_avg.pt       the same for the EMA/FAWA-averaged model
    RUN/checkpoints/interrupted.pt                    the state of an epoch stopped at a step boundary (a signal),
                                                      which --resume continues; removed when that epoch ends
    RUN/eval/<checkpoint>-<split>.json                per-class evaluation (+ .aa.npz: AutoAttack's resume state);
                                                      -first<N> before .json: eval --per-class N
    RUN/eval/previous/<checkpoint>-<split>-<hash>.json  earlier results of other weights, data or settings
    RUN/diagnostics/<checkpoint>-<split>-<attack>.json
    RUN/history.jsonl                                 one JSON line per start or resume (and what --resume changed)
    RUN/.lock                                         held (flock) by the one process writing the run
    RUN/train.log, RUN/grid-state.json                a grid run's output and its done/failed state

Every file is replaced atomically (a unique temporary name, fsync, rename, fsync of the folder), so a
crash leaves the old file or the new one, never a torn one; the two append-only logs tolerate a torn
last line (a kill mid-write), which a resume removes. Checkpoints load with
``torch.load(weights_only=True)``: loading never unpickles arbitrary objects.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pickle
import socket
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

from fastfair import stopping
from fastfair.errors import UserError
from fastfair.suggest import hint

CHECKPOINTS = "checkpoints"
# What makes a folder a run: a new run refuses a folder holding any of them. A grid writes
# grid-state.json and train.log before its child trains, so those two do not count.
RUN_FILES = ("config.toml", "metrics.jsonl", "history.jsonl", CHECKPOINTS, "eval", "diagnostics")
# The keys every checkpoint fastfair writes holds (last.pt adds the training state)
CHECKPOINT_KEYS = ("epoch", "model", "spec", "config")
# Epochs are numbered from 1 in every file and line fastfair writes ("epoch 3" = the third epoch,
# checkpoints say which epoch they finished). Files written before this numbering counted from 0
# and lack this marker; readers shift them on load (:func:`one_based_epoch`).
EPOCH_NUMBERING = {"epoch_numbering": "1-based"}


def one_based_epoch(record: dict) -> int:
    """The 1-based epoch of a checkpoint or eval/diagnostics record, also of one written before the
    numbering was 1-based (those lack :data:`EPOCH_NUMBERING` and counted from 0)."""
    return record["epoch"] + (0 if record.get("epoch_numbering") == "1-based" else 1)


def _metrics_one_based(records: list[dict]) -> list[dict]:
    """metrics.jsonl of runs from before the 1-based numbering starts at epoch 0: shift every line."""
    if records and records[0]["epoch"] == 0:
        return [{**r, "epoch": r["epoch"] + 1} for r in records]
    return records


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

    @property
    def history(self) -> Path:
        return self.path / "history.jsonl"

    @property
    def lock_file(self) -> Path:
        return self.path / ".lock"

    def run_files(self) -> list[str]:
        """The names of :data:`RUN_FILES` this folder holds (empty: a new run may start here)."""
        return [name for name in RUN_FILES if (self.path / name).exists()]

    def checkpoint(self, name: str, averaged: bool = False) -> Path:
        """``checkpoints/<name>.pt``, or ``<name>_avg.pt`` for the averaged (EMA/FAWA) model."""
        return self.checkpoints / f"{name}{'_avg' if averaged else ''}.pt"

    def existing_checkpoint(self, name: str) -> Path:
        """``checkpoints/<name>.pt`` (``--checkpoint NAME``); a name the run lacks is an error listing those it has."""
        path = self.checkpoint(name.removesuffix(".pt"))
        if not path.is_file():
            have = sorted(p.stem for p in self.checkpoints.glob("*.pt"))
            why = (" (_avg checkpoints come from weight averaging: train with --ema or --fawa)"
                   if name.endswith("_avg") and not any(h.endswith("_avg") for h in have) else "")
            raise UserError(f"{self.path} has no checkpoint {name!r}{why}.{hint(name, have)} Its checkpoints: "
                            f"{', '.join(have) or 'none yet'}")
        return path

    @property
    def last(self) -> Path:
        return self.checkpoint("last")

    @property
    def interrupted(self) -> Path:
        return self.checkpoint("interrupted")

    def best(self, policy: str, averaged: bool = False) -> Path:
        return self.checkpoint(f"best_{policy}", averaged)

    def selected_checkpoint(self, select: str, averaged: bool = False) -> Path:
        """The checkpoint a selection policy (``train.select``) picks: ``last.pt`` for ``last``, else its best."""
        return self.checkpoint("last", averaged) if select == "last" else self.best(select, averaged)

    def eval_file(self, checkpoint: Path, split: str, per_class: int = 0) -> Path:
        """``eval/<checkpoint>-<split>.json``; ``-first<N>`` added for ``eval --per-class N`` when N is not the
        run's own test set, so a quick check never takes the place of the run's result."""
        return self.path / "eval" / f"{Path(checkpoint).stem}-{split}{f'-first{per_class}' if per_class else ''}.json"

    def previous_eval_file(self, checkpoint: Path, split: str, tag: str) -> Path:
        """Where an earlier result of other weights, data or settings goes instead of being overwritten."""
        return self.path / "eval" / "previous" / f"{Path(checkpoint).stem}-{split}-{tag}.json"

    def eval_files(self) -> list[Path]:
        return sorted((self.path / "eval").glob("*.json"))

    def diagnostics_file(self, checkpoint: Path, split: str, attack: str) -> Path:
        return self.path / "diagnostics" / f"{Path(checkpoint).stem}-{split}-{attack}.json"

    def diagnostics_files(self) -> list[Path]:
        return sorted((self.path / "diagnostics").glob("*.json"))

    # ---- config, metrics and history ---------------------------------------------------------
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
        append_jsonl(record, self.metrics)

    def read_metrics(self) -> list[dict]:
        return _metrics_one_based(read_jsonl(self.metrics)[0])

    def append_history(self, record: dict) -> None:
        append_jsonl(record, self.history)

    def read_history(self) -> list[dict]:
        return read_jsonl(self.history)[0]

    def truncate_metrics(self, done: int) -> bool:
        """Keep the lines of the first ``done`` epochs: on resume, drop those ``last.pt`` does not hold (a
        kill between an epoch's metrics line and its checkpoint leaves such a line; the epoch is redone).
        A torn last line (a kill while appending) goes too; returns whether there was one. Lines of a
        run from before the 1-based numbering are rewritten 1-based."""
        records, torn = read_jsonl(self.metrics)
        records = _metrics_one_based(records)
        if self.metrics.is_file():
            write_text_atomic("".join(json.dumps(r) + "\n" for r in records if r["epoch"] <= done), self.metrics)
        return torn

    # ---- one writer ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def lock(self, log=None):
        """Hold ``RUN/.lock`` while writing the run: a second process refuses, naming the holder.

        The lock is ``flock``, which the kernel drops when its holder dies, so a killed run never
        blocks the next one; the holder's name stays in the file, which is how a takeover is told.
        A folder this call made and nothing else wrote into is removed again: a run refused at
        its start leaves nothing behind."""
        made = not self.path.exists()
        self.make()
        fd = os.open(self.lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UserError(f"{self.path} is being written by another fastfair process "
                                f"({_holder(fd) or 'unknown'}); wait for it to end, or pass another --out") from None
            previous = _holder(fd)
            if previous:
                # a holder killed mid-write leaves its atomic write's temporary file; the checkpoints have no other
                # writer than the lock's holder, so its leftovers go (the files they were for are whole or absent)
                torn = sorted((self.path / CHECKPOINTS).glob(".*.tmp"))
                for tmp in torn:
                    tmp.unlink(missing_ok=True)
                (log or notice)(f"{self.path}: taking over the lock of {previous}, which is no longer running"
                                + (f"; removed its unfinished {', '.join(t.name for t in torn)}" if torn else ""))
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
            os.fsync(fd)
            try:
                yield
            finally:
                os.ftruncate(fd, 0)  # a clean end: no holder to take over from
                if made and os.listdir(self.path) == [self.lock_file.name]:
                    self.lock_file.unlink()
                    self.path.rmdir()
        finally:
            os.close(fd)

    def make(self) -> None:
        """Create the folder, or say in one line why it cannot be one (a file, no permission)."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"{self.path} is a file, not a folder; pass --out a folder (a new one, or a run to resume)")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the folder {self.path} ({err.strerror}); "
                            "pass --out a folder you can write to") from None
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise UserError(f"cannot write to {self.path} (permission denied); pass --out a folder you can write to")

    def locked_by(self) -> str:
        """The live process holding this run's lock ("" when none): a run marked running may be gone."""
        if not self.lock_file.is_file():
            return ""
        fd = os.open(self.lock_file, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd) or "a process"
        finally:
            os.close(fd)  # closing drops the probe's own lock
        return ""


def notice(message: str) -> None:
    """A repair the user should know of (a stale lock, a torn line), shown even under --quiet."""
    print(f"fastfair: {message}", file=sys.stderr)


def _holder(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip()


# ---- file formats: atomic writes, safe loads ------------------------------------------------
def _replace_atomic(write, path: str | Path) -> None:
    """Write through ``write(binary file)`` to a uniquely named temporary file in ``path``'s folder,
    fsync, rename it over ``path``, fsync the folder: a crash leaves the old file or the new one,
    and two writers never share a temporary file. A stop signal (Ctrl-C, SIGTERM) lands after the rename: between
    creating the temporary file and the ``try`` that removes it, an interrupt would leave it behind."""
    path = Path(path)
    with stopping.held():
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would make the run unreadable to others
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _umask()  # read once, at import: os.umask can only be read by setting it


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(obj, path: str | Path) -> None:
    """``torch.save`` atomically (:func:`_replace_atomic`)."""
    _replace_atomic(lambda f: torch.save(obj, f), path)


def write_bytes_atomic(data: bytes, path: str | Path) -> None:
    _replace_atomic(lambda f: f.write(data), path)


def write_text_atomic(text: str, path: str | Path) -> None:
    write_bytes_atomic(text.encode(), path)


def write_json_atomic(obj, path: str | Path, indent: int | None = 1) -> None:
    write_text_atomic(json.dumps(obj, indent=indent), path)


def read_json(path: str | Path) -> dict:
    """A JSON file fastfair wrote; a damaged one (written in place by an older version) is a UserError."""
    try:
        return json.loads(Path(path).read_text())
    except json.JSONDecodeError:
        raise UserError(f"{path} is damaged (not JSON); delete it and run the command again") from None


def append_jsonl(record: dict, path: str | Path) -> None:
    """Append one JSON line and fsync it: once this returns, the line survives a crash."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: str | Path) -> tuple[list[dict], bool]:
    """(records, whether a torn last line was left out). Only the last line may be torn (a kill
    while appending); a bad line before it means the file was damaged otherwise."""
    path = Path(path)
    if not path.is_file():
        return [], False
    lines = path.read_text().splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                return records, True
            raise UserError(f"{path}, line {i + 1}, is not JSON: the file is damaged; "
                            f"delete that line (and any half-written one) and run the command again") from None
    return records, False


# another program's model file is often what a user meant: fastfair eval reads it when told its architecture
FOREIGN_HINT = "; to evaluate a model file fastfair did not write, add --model ARCH (fastfair models)"


def load_checkpoint(path: str | Path, map_location="cpu", needs: tuple[str, ...] = CHECKPOINT_KEYS) -> dict:
    """Load a fastfair checkpoint without unpickling arbitrary objects; a file that is not one
    (empty, truncated, another program's, or holding objects other than tensors) is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no checkpoint at {path}; pass a run directory or a .pt file written by fastfair train")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip; torch.load on other files fails obscurely
        raise UserError(f"{path} is not a checkpoint written by fastfair train (empty, truncated or another "
                        f"format); pass a run directory or a .pt file from its checkpoints/{FOREIGN_HINT}")
    try:
        ck = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        # weights_only refused an object: such a file runs code when unpickled, so it is never loaded
        raise UserError(f"{path} is unsafe to load: it holds Python objects other than tensors, which could run "
                        "code; fastfair does not unpickle it. Use a checkpoint written by fastfair train") from None
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as err:
        raise UserError(f"{path} is damaged or not a checkpoint written by fastfair train "
                        f"({type(err).__name__}); pass another .pt file, or resume from the run's last.pt") from None
    missing = [k for k in needs if not isinstance(ck, dict) or k not in ck]
    if missing:
        raise UserError(f"{path} is not a checkpoint written by fastfair train (it lacks {', '.join(missing)}); "
                        f"pass a run directory or a .pt file from its checkpoints/{FOREIGN_HINT}")
    if "epoch" in ck:  # older checkpoints counted from 0: read every one 1-based
        ck.update(epoch=one_based_epoch(ck), **EPOCH_NUMBERING)
    return ck


def init_model(model, path: str | Path) -> None:
    """Start training from another run's model weights (``train.init_from``; FRL fine-tunes a robust model)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"train.init_from: no checkpoint at {path}; pass a .pt file written by fastfair train")
    ck = load_checkpoint(path, needs=("model",))
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as err:
        raise UserError(f"train.init_from: {path} holds a different model ({str(err).splitlines()[0]}); "
                        "use the same model.name, width, norm, head and classes as that run") from None
