"""The run directory, the contract between ``fastfair train``, ``eval``, ``diagnose``, ``report`` and ``grid``;
this module is the one place that names its files::

    RUN/config.toml                                   the resolved config (written atomically), under its checksum
                                                      line and the line naming the run's id (:data:`RUN_LINE`)
    RUN/metrics.jsonl                                 one JSON line per finished epoch
    RUN/checkpoints/last.pt                           full training state, rewritten atomically every epoch
    RUN/checkpoints/best_<policy>.pt                  best weights by each selection policy
    RUN/checkpoints/epoch.pt                          the weights after epoch train.select_epoch (train.select = epoch)
    RUN/checkpoints/{best_<policy>,last,epoch}_avg.pt the same for the EMA/FAWA-averaged model
    RUN/checkpoints/interrupted.pt                    the state of an epoch stopped at a step boundary (a signal),
                                                      which --resume continues; removed when that epoch ends
    RUN/eval/<checkpoint>-<split>.json                per-class evaluation (+ .aa.npz: AutoAttack's resume state);
                                                      -first<N> before .json: eval --per-class N
    RUN/eval/previous/<checkpoint>-<split>-<hash>.json  earlier results of other weights, data or settings
    RUN/diagnostics/<checkpoint>-<split>-<attack>.json
    RUN/diagnostics/<checkpoint>-<split>-<attack>.npz  a figure's per-class measures and 2-D features of the
                                                      checkpoint, reused while it and the settings are unchanged
    RUN/history.jsonl                                 one JSON line per start or resume (and what --resume changed)
    RUN/.lock                                         held (flock) by the one process writing the run
    RUN/train.log, RUN/grid-state.json                a grid run's output and its done/failed state

Every file is replaced atomically (a unique temporary name, fsync, rename, fsync of the folder), so a
crash leaves the old file or the new one, never a torn one; the two append-only logs tolerate a torn
last line (a kill mid-write), which a resume removes. Every file a run writes goes through here
(:func:`replacing`, :func:`append_text` and the writers on them), so a write that fails (disk full,
I/O error) is one :class:`~fastfair.errors.WriteError` line naming the file and the free space, with the
old file kept (docs/reliability.md). Checkpoints load with ``torch.load(weights_only=True)``: loading
never unpickles arbitrary objects.

Every file a later command trusts also proves on load that its bytes are those written (docs/reliability.md,
"Damaged files"): a disk, copy or transfer that changes bytes in place (zeroes, same length) would otherwise give a
wrong number without a word, as ``torch.load`` reads such a file without complaint. The checksum lives inside the
file, so the one atomic rename writes content and checksum together and no crash can part them:

* checkpoints (``torch.save``) and ``.npz`` files are zip archives whose every member carries a CRC-32 (torch
  writes it while ``torch.serialization.get_crc32_options()`` holds, the default, which :func:`save_atomic` keeps
  on); :func:`load_checkpoint` reads every member once, streaming, and checks it (:func:`zip_damage`), since
  ``torch.load`` does not; numpy checks a member's CRC-32 as it reads it, and :func:`load_npz` says which file.
  CRC-32 finds every burst of changed bytes up to 32 bits long and any other change but 1 in 2**32: enough
  against damage, which is all it is for (it proves nothing against a deliberate edit);
* JSON records carry :data:`JSON_CHECKSUM`, the SHA-256 of their canonical content (:func:`write_json_atomic`,
  :func:`read_json`), and so does each line of the append-only logs ``metrics.jsonl`` and ``history.jsonl``
  (:func:`jsonl_line`, :func:`read_jsonl`): a line is appended on its own, so it carries its own;
  ``config.toml`` starts with a ``# sha256:`` comment line of the rest (:meth:`RunDir.read_config`);
* FFCV's ``.beton`` files, another library's format, are named with their SHA-256 in ``meta.json``
  (:mod:`fastfair.data.ffcv` says what a crash can leave), hashed in full once and again only when their size,
  mtime or inode changed (:func:`fastfair.data.ffcv.verify_beton`).

Which version wrote a file is known from its run, not from the file: ``config.toml``'s first line under its checksum
line names the run's id (:data:`RUN_LINE`), which a run gets when it starts and every checkpoint of it carries
(:data:`RUN_ID`). A run with that line was written by a fastfair that signs each of its files, so a file of it (its
config, a line of its logs, a JSON record under it) without its checksum is damage, refused like a changed one:
removing a file's checksum cannot make it pass as an older file. Were the mark in each file, removing it with the
checksum would. A run without the line is an older fastfair's (:meth:`RunDir.saved_config` says so once): its files
without checksums are read as before, unchecked, and never signed afterwards: what is read from them is an
:class:`Unchecked` record, and the writers write a record holding one without a checksum (:func:`jsonl_line`,
:func:`write_json_atomic`). A checkpoint saved with torch's CRC-32 off loads as before (nothing to check).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import io
import json
import os
import pickle
import re
import shutil
import socket
import sys
import tempfile
import uuid
import zipfile
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from fastfair import safe_load, stopping
from fastfair.errors import UserError, WriteError, no_checkpoint
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
# the key of a checkpoint's run id (absent from an older fastfair's checkpoints), and config.toml's line naming the id
# (under the checksum line, inside what it covers): the mark of a run whose every file carries its checksum
RUN_ID = "run_id"
RUN_LINE = "# fastfair run {}: every file of this run carries its checksum"
_RUN_LINE = re.compile(r"# fastfair run ([0-9a-f]{32}): ")
# who holds a lock and whose temporary files are whose: "pid N on HOST", ".<name>.<HOST>.<pid>.*.tmp"
_HOST = socket.gethostname()


def one_based_epoch(record: dict) -> int:
    """The 1-based epoch of a checkpoint or eval/diagnostics record, also of one written before the
    numbering was 1-based (those lack :data:`EPOCH_NUMBERING` and counted from 0)."""
    return record["epoch"] + (0 if record.get("epoch_numbering") == "1-based" else 1)


def _metrics_one_based(records: list[dict]) -> list[dict]:
    """metrics.jsonl of runs from before the 1-based numbering starts at epoch 0: shift every line (such lines
    predate the checksums: each stays :class:`Unchecked`)."""
    if records and records[0].get("epoch") == 0:
        return [type(r)({**r, "epoch": r["epoch"] + 1}) for r in records]
    return records


def new_run_id() -> str:
    """The id of a new run, which its config.toml names and every checkpoint of it carries."""
    return uuid.uuid4().hex


class SavedConfig(NamedTuple):
    """A run's ``config.toml`` as read (:meth:`RunDir.saved_config`)."""
    text: str  # the TOML text, its checksum line and run line left out
    run_id: str | None  # None: an older fastfair's run (no run line), whose files are read as before
    checked: bool  # whether it had a checksum line (which matched)


# what to do with a config.toml that is not as fastfair wrote it; how a run's settings change instead
CONFIG_FIX = ("copy it again from where it came from, or restore it from the config every checkpoint of the run "
              "holds; to change a setting, `fastfair train --out {run} --resume --set KEY=VALUE` changes those "
              "--resume may change (recorded in history.jsonl), and any other needs a new run")
_HISTORY_FIX = "delete that line (it records one start or resume of the run)"
_SAID_OLDER: set[Path] = set()  # the older runs this process has said so of, once each


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
        """The checkpoint a selection policy (``train.select``) picks: ``last.pt`` for ``last``, ``epoch.pt`` (the
        weights after ``train.select_epoch``) for ``epoch``, else its best."""
        return self.checkpoint(select, averaged) if select in ("last", "epoch") else self.best(select, averaged)

    def eval_file(self, checkpoint: Path, split: str, per_class: int = 0) -> Path:
        """``eval/<checkpoint>-<split>.json``; ``-first<N>`` added for ``eval --per-class N`` when N is not the
        run's own test set, so a quick check never takes the place of the run's result."""
        return self.path / "eval" / f"{Path(checkpoint).stem}-{split}{f'-first{per_class}' if per_class else ''}.json"

    def previous_eval_file(self, checkpoint: Path, split: str, tag: str) -> Path:
        """Where an earlier result of other weights, data or settings goes instead of being overwritten."""
        return self.path / "eval" / "previous" / f"{Path(checkpoint).stem}-{split}-{tag}.json"

    def again(self, record: Path) -> str:
        """What to do with this run's damaged eval or diagnostics file ``record`` (``eval/<checkpoint>-<split>
        [-first<N>].json``, ``diagnostics/<checkpoint>-<split>-<attack>.json``): delete it, and the command."""
        checkpoint, split, *rest = Path(record).name.split(".")[0].split("-")
        command = f"{self.path} --checkpoint {checkpoint} --split {split}"
        if Path(record).parent.name == "diagnostics":
            command = f"diagnose {command}" + (f" --attack {rest[0]}" if rest else "")
        else:
            command = f"eval {command}" + (f" --per-class {rest[0].removeprefix('first')}" if rest else "")
        return f"delete it and run `fastfair {command}` again"

    def eval_files(self) -> list[Path]:
        return sorted((self.path / "eval").glob("*.json"))

    def diagnostics_file(self, checkpoint: Path, split: str, attack: str) -> Path:
        return self.path / "diagnostics" / f"{Path(checkpoint).stem}-{split}-{attack}.json"

    def measures_file(self, checkpoint: Path, split: str, attack: str) -> Path:
        return self.path / "diagnostics" / f"{Path(checkpoint).stem}-{split}-{attack}.npz"

    def diagnostics_files(self) -> list[Path]:
        return sorted((self.path / "diagnostics").glob("*.json"))

    # ---- config, metrics and history ---------------------------------------------------------
    def read_config(self) -> str:
        """The saved config's TOML text, its checksum line checked and left out; a folder without one is not a run
        directory."""
        return self.saved_config().text

    def run_id(self) -> str | None:
        """The run's id (:data:`RUN_LINE`); None for an older fastfair's run, or a folder without config.toml."""
        return self.saved_config().run_id if self.config.is_file() else None

    def saved_config(self) -> SavedConfig:
        """``config.toml``: its text, checksum checked, and the run's id. A config.toml that names a run but lost
        its checksum line was edited (fastfair writes the two together), and so was one that names no run where
        ``history.jsonl`` does: each is a UserError. An older fastfair's run (no run line) is said once, and read
        as before."""
        if not self.config.is_file():
            raise UserError(f"{self.path} is not a run directory (no config.toml); "
                            "pass a folder written by fastfair train")
        text, checked = _read_toml(self.config, CONFIG_FIX.format(run=self.path))
        head, _, body = text.partition("\n")
        named = _RUN_LINE.match(head)
        if named and not checked:
            raise UserError(f"{self.config} has no checksum line, which fastfair writes with the config of every run "
                            f"that names its id (this one: {named[1]}): it was edited or damaged, so fastfair does not "
                            f"read it; {CONFIG_FIX.format(run=self.path)}")
        if named:
            return SavedConfig(body, named[1], True)
        history = {r["run"] for r in read_jsonl(self.history, _HISTORY_FIX)[0] if "run" in r}
        if history:
            raise UserError(f"{self.config} names no run, though {self.history.name} names run {min(history)} (its "
                            f"config.toml names it on its second line, under the checksum): it was edited or replaced, "
                            f"so fastfair does not read it; {CONFIG_FIX.format(run=self.path)}")
        if self.path.resolve() not in _SAID_OLDER:
            _SAID_OLDER.add(self.path.resolve())
            notice(f"{self.path} is an older fastfair's run (its config.toml names no run id): its files are read as "
                   f"before, those without a checksum unchecked, and its checkpoints checked against its config only")
        return SavedConfig(text, None, checked)

    def write_config(self, text: str, run_id: str | None, signed: bool = True) -> None:
        """config.toml: the run's line (:data:`RUN_LINE`) and ``text`` under a checksum line. An older fastfair's
        run (``run_id`` None) keeps its kind: signed only where its checksum line was there and matched
        (``signed``), so a config nobody checked is not certified by being written again."""
        self.path.mkdir(parents=True, exist_ok=True)
        if run_id:
            write_toml(f"{RUN_LINE.format(run_id)}\n{text}", self.config)
        elif signed:
            write_toml(text, self.config)
        else:
            write_text_atomic(text, self.config)

    def append_metrics(self, record: dict) -> None:
        append_jsonl(record, self.metrics)

    @contextlib.contextmanager
    def metrics_until_saved(self, record: dict):
        """Append an epoch's metrics line before its checkpoint, written in the block (a kill in between redoes the
        epoch on --resume, which drops the line): a checkpoint that fails takes the line off at once, so
        metrics.jsonl never claims an epoch whose checkpoint did not land. Cutting back needs no free space."""
        start = self.metrics.stat().st_size if self.metrics.is_file() else 0
        self.append_metrics(record)
        try:
            yield
        except BaseException:
            os.truncate(self.metrics, start)
            raise

    def _metrics_fix(self) -> str:
        return (f"restore {self.metrics.name} from a copy, or delete that line to read the run without that epoch's "
                "numbers (its checkpoints do not depend on them)")

    def read_metrics(self) -> list[dict]:
        return _metrics_one_based(read_jsonl(self.metrics, self._metrics_fix(), signed=self.run_id() is not None)[0])

    def append_history(self, record: dict) -> None:
        append_jsonl(record, self.history)

    def read_history(self) -> list[dict]:
        """``history.jsonl``, each line's checksum checked (read by --resume and report); a line naming another run
        than config.toml means the files of two runs were mixed: a UserError."""
        run_id = self.run_id()
        records = read_jsonl(self.history, _HISTORY_FIX, signed=run_id is not None)[0]
        for i, record in enumerate(records):
            if record.get("run", run_id) != run_id:
                raise UserError(f"{self.history}, line {i + 1}, is of run {record['run']}, and {self.config} names "
                                f"run {run_id}: the files of two runs were mixed; copy this run's folder again from "
                                f"where it came from")
        return records

    def truncate_metrics(self, done: int) -> bool:
        """Keep the lines of the first ``done`` epochs: on resume, drop those ``last.pt`` does not hold (a
        kill between an epoch's metrics line and its checkpoint leaves such a line; the epoch is redone).
        A torn last line (a kill while appending) goes too; returns whether there was one. Lines of a
        run from before the 1-based numbering are rewritten 1-based, still without a checksum (:func:`jsonl_line`)."""
        records, torn = read_jsonl(self.metrics, self._metrics_fix(), signed=self.run_id() is not None)
        records = _metrics_one_based(records)
        if self.metrics.is_file():
            write_text_atomic("".join(jsonl_line(r, self.metrics) for r in records if r["epoch"] <= done),
                              self.metrics)
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
            except OSError as err:
                raise _no_locks(self.lock_file, err) from None
            previous = _holder(fd)
            if previous:
                self._take_over(previous, log or notice)
            with writing(self.lock_file):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid {os.getpid()} on {_HOST}".encode(), 0)
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

    def _take_over(self, previous: str, log) -> None:
        """Take over the lock of ``previous`` ("pid N on HOST"), whose flock is gone, and remove its unfinished
        atomic writes (``.<name>.<host>.<pid>.*.tmp`` anywhere in the run: the files they were for are whole or
        absent). A holder on another host is refused on a shared filesystem, where this host may not see its lock."""
        pid, host = _parse_holder(previous)
        shared = _shared_filesystem(self.path)
        if host and host != _HOST and shared:
            raise UserError(f"{self.path} was being written by {previous}, another host, and is on a shared filesystem "
                            f"({shared}) whose locks this host may not see, so fastfair cannot tell whether that "
                            f"process still runs; if it has ended (ask the scheduler, or `ps -p {pid}` on {host}), "
                            f"delete {self.lock_file} and run the command again")
        unfinished = sorted(self.path.rglob(f".*.{host}.{pid}.*.tmp")) if pid else []
        for tmp in unfinished:
            tmp.unlink(missing_ok=True)
        log(f"{self.path}: taking over the lock of {previous}, which is no longer running" + (
            f"; removed its unfinished {', '.join(str(t.relative_to(self.path)) for t in unfinished)}"
            if unfinished else ""))

    def load_last(self) -> dict:
        """``last.pt`` for --resume. A truncated one (copied part-way: fastfair's own writes are atomic) stops the
        resume with how to go on: no earlier full state is kept (it would double the run's largest file), and
        training the run again from its first epoch is the user's call, not done silently over their checkpoints."""
        if self.last.is_file() and truncated(self.last):
            raise UserError(f"cannot resume {self.path}: {self.last} {TRUNCATED}; copy it again from where it came "
                            f"from, or move it aside and {self.resume_without_last()}")
        return load_checkpoint(self.last)

    def resume_without_last(self) -> str:
        """What ``--resume`` does once ``last.pt`` is moved aside, said after "move it aside and": it continues from
        an intact ``interrupted.pt`` (which holds the whole state of its epoch so far), else trains the run again
        from its first epoch."""
        resume = f"`fastfair train --out {self.path} --resume`"
        path = self.interrupted
        if path.is_file() and zipfile.is_zipfile(path) and not zip_damage(path):
            with contextlib.suppress(Exception):  # an unreadable one is not offered
                ck = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                return (f"{resume} continues from {path.name} (epoch {one_based_epoch(ck) + 1}, after step "
                        f"{ck['step']} of {ck['steps']})")
        return f"{resume} trains the run again from its first epoch"

    def stale_eval(self, path: Path, record: dict) -> str:
        """Why the result ``path`` (``record``) is not of the weights its checkpoint holds now, in one line ("" when
        it is, or is not of a checkpoint of this run): a checkpoint rewritten after it was evaluated (a resumed
        training's new best, ``last.pt`` after more epochs). Only a checkpoint newer than the result is loaded."""
        ckpt = self.checkpoints / Path(record.get("checkpoint", "")).name
        if (not ckpt.is_file() or "fingerprint" not in record
                or ckpt.stat().st_mtime_ns <= Path(path).stat().st_mtime_ns):
            return ""
        ck = load_checkpoint(ckpt, needs=("model",))
        if state_sha256(ck["model"]) == record["fingerprint"]["weights"]:
            return ""
        return (f"{path} is of other weights than {ckpt.name} holds now (epoch {one_based_epoch(record)} was "
                f"evaluated; the checkpoint, rewritten since, holds epoch {ck.get('epoch', '?')}); evaluate it again: "
                f"fastfair eval {self.path} --checkpoint {ckpt.stem}")

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
        except OSError as err:
            raise _no_locks(self.lock_file, err) from None
        finally:
            os.close(fd)  # closing drops the probe's own lock
        return ""


def notice(message: str) -> None:
    """A repair the user should know of (a stale lock, a torn line), shown even under --quiet."""
    print(f"fastfair: {message}", file=sys.stderr)


def _holder(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip()


def _parse_holder(holder: str) -> tuple[str, str]:
    """(pid, host) of a lock's "pid N on HOST"; ("", "") for a name it does not hold."""
    pid, _, host = holder.removeprefix("pid ").partition(" on ")
    return (pid, host) if pid.isdigit() and host else ("", "")


def _no_locks(lock_file: Path, err: OSError) -> UserError:
    return UserError(f"cannot lock {lock_file} ({err.strerror}): its filesystem does not support file locks, which "
                     "keep a second fastfair process out of a run; write runs to a filesystem that does (Lustre: "
                     "mount with -o flock)")


# filesystems shared between hosts, whose locks a host may not see (NFS mounted with nolock or local_lock, Lustre's
# localflock, BeeGFS without global locks): a lock naming another host cannot be checked from here
SHARED_FILESYSTEMS = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                      "9p", "afs", "ocfs2", "gfs2", "orangefs", "pvfs2", "panfs", "wekafs", "virtiofs"}


def _shared_filesystem(path: Path) -> str:
    """The type of the shared filesystem ``path`` is on ("" for a local one), from /proc/mounts; where that
    cannot be read, "unknown": fastfair then assumes a shared one."""
    try:
        mounts = Path("/proc/mounts").read_text()
    except OSError:
        return "unknown"
    return shared_in(os.path.realpath(path), mounts)


def shared_in(real: str, mounts: str) -> str:
    """The type of the shared filesystem the absolute path ``real`` is on by ``mounts`` (as /proc/mounts lists
    them: device, mount point, type, ...; the longest mount point holding ``real`` wins), "" for a local one."""
    best, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[1])  # a space is written \040
        if (real == point or real.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind if kind in SHARED_FILESYSTEMS or kind.startswith("fuse.") else ""


# ---- file formats: atomic writes, safe loads ------------------------------------------------
def _replace_atomic(write, path: str | Path) -> None:
    """Write through ``write(binary file)`` to a new temporary file beside ``path`` and rename it over ``path``
    (:func:`replacing`). A stop signal (Ctrl-C, SIGTERM: :mod:`fastfair.stopping`) lands after the rename: between
    creating the temporary file and the ``try`` that removes it, an interrupt would leave it behind."""
    with stopping.held(), replacing(path) as tmp, io.BufferedWriter(_open(tmp, "wb")) as f:
        write(f)


@contextlib.contextmanager
def replacing(path: str | Path):
    """Yields a new temporary path beside ``path``; what the block writes there replaces ``path`` when it ends
    (fsync, rename, fsync of the folder): a crash leaves the old file or the new one, two writers never share a
    temporary file, and a failed write (:func:`writing`) leaves the old file and no temporary one. The
    temporary name carries this host and process (:func:`_temporary_prefix`), so an unfinished one is known."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = None
        try:
            with stopping.held():  # the name is known before a stop signal can land
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=_temporary_prefix(path), suffix=".tmp")
                os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would make the run unreadable to others
                os.close(fd)
            yield Path(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            if tmp:
                Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)


def _open(path: str | Path, mode: str) -> io.FileIO:
    """The lowest layer of every write fastfair makes to a run (tests put a full disk here): the file
    unbuffered, so a failed append knows where it started."""
    return io.FileIO(path, mode)


def _temporary_prefix(path: Path) -> str:
    """``.<name>.<host>.<pid>.``: whose temporary file it is, so one left by a process that has ended can go."""
    return f".{path.name}.{_HOST}.{os.getpid()}."


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
    """``torch.save`` atomically (:func:`_replace_atomic`), with the CRC-32 of every member that
    :func:`load_checkpoint` checks (torch's default; turned back on here should a caller have turned it off)."""
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(True)
    try:
        _replace_atomic(lambda f: torch.save(obj, f), path)
    finally:
        torch.serialization.set_crc32_options(crc)


def write_bytes_atomic(data: bytes, path: str | Path) -> None:
    _replace_atomic(lambda f: f.write(data), path)


def write_text_atomic(text: str, path: str | Path) -> None:
    write_bytes_atomic(text.encode(), path)


# the key of a JSON record's checksum, and the first words of config.toml's checksum line
JSON_CHECKSUM = "content_sha256"
TOML_CHECKSUM = "# sha256:"
TOML_CHECKSUM_WHY = "  (of the lines below; fastfair checks it on every read)"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_toml(text: str, path: Path) -> None:
    """A TOML file whole or not at all, its first line the checksum :func:`read_toml` checks."""
    write_text_atomic(f"{TOML_CHECKSUM} {_sha256(text.encode())}{TOML_CHECKSUM_WHY}\n{text}", path)


def read_toml(path: Path) -> str:
    """The text of a TOML file fastfair wrote (a study's settings, :func:`write_toml`), its ``# sha256:`` line checked
    and left out; bytes changed since it was written are a UserError. One without that line (older) is read as it
    is. A run's config.toml is read by :meth:`RunDir.saved_config`, which knows whether its run signs every file."""
    return _read_toml(path, "copy it again from where it came from. If you edited it on purpose, delete that first "
                            "line")[0]


def _read_toml(path: Path, fix: str) -> tuple[str, bool]:
    """(the text of a TOML file, its ``# sha256:`` line checked and left out; whether it had that line). Bytes
    changed since it was written are a UserError saying ``fix``."""
    data = path.read_bytes()
    first, _, rest = data.partition(b"\n")
    if b"\0" not in data and not first.startswith(TOML_CHECKSUM.encode()):  # from before the checksum
        return data.decode(errors="replace"), False  # the TOML parser names any character that is not text
    if first.removeprefix(TOML_CHECKSUM.encode()).split()[:1] != [_sha256(rest).encode()]:
        raise UserError(f"{path} is damaged: its content does not match the checksum on its first line (bytes "
                        f"changed after fastfair wrote it); {fix}")
    return rest.decode(), True


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file, read in 4 MB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while piece := f.read(4 << 20):
            h.update(piece)
    return h.hexdigest()


def _json_sha256(record: dict) -> str:
    """SHA-256 of a JSON record's canonical text (sorted keys, no spaces), its checksum key left out: the same
    for the record written and the record read back, whatever the indent."""
    content = {k: v for k, v in record.items() if k != JSON_CHECKSUM}
    return _sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode())


def _json_text(obj, path: str | Path, indent: int | None = None) -> str:
    """``obj`` as JSON text, refusing NaN and inf: Python's ``json`` writes them as bare ``NaN``/``Infinity``, which
    is not JSON (most readers reject the file) and says nothing. A value that can be undefined (an absent class's
    cell) is written as null by its producer, who knows what it means
    (:func:`fastfair.evaluation.measures.json_values`)."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError as err:  # a bug of the writer, not the user's: said with the file it was for
        raise ValueError(f"{path}: {err} (write an undefined value as null)") from None


class Unchecked(dict):
    """A JSON object read from a file or line without a checksum, outside a run that signs its files (an older
    fastfair's): read as it is, and never signed afterwards. :func:`read_json` and :func:`read_jsonl` make every
    object of such a record one, so what is built from its parts still holds one (:func:`holds_unchecked`)."""


def holds_unchecked(obj) -> bool:
    """Whether ``obj`` is or holds (in its dicts and lists) an :class:`Unchecked` record: content no checksum
    vouched for, which the writers do not sign."""
    if isinstance(obj, Unchecked):
        return True
    if isinstance(obj, dict):
        return any(holds_unchecked(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(isinstance(v, (dict, list, tuple)) and holds_unchecked(v) for v in obj)
    return False


def write_json_atomic(obj, path: str | Path, indent: int | None = 1) -> None:
    """``obj`` as JSON (no NaN or inf: :func:`_json_text`), atomically; a dict (every record fastfair reads back)
    gains :data:`JSON_CHECKSUM`, which :func:`read_json` checks, unless it holds content read unchecked
    (:class:`Unchecked`), which stays without one. The checksum is of the record as JSON reads it back (keys become
    strings, tuples lists), so it is computed on that."""
    if isinstance(obj, dict) and not holds_unchecked(obj):
        obj = json.loads(_json_text(obj, path))
        obj[JSON_CHECKSUM] = _json_sha256(obj)
    write_text_atomic(_json_text(obj, path, indent), path)


def write_npz_atomic(arrays: dict, path: str | Path, compressed: bool = False) -> None:
    """``np.savez`` (``np.savez_compressed``) of ``arrays`` to ``path`` atomically; no .npz is added to the name."""
    _replace_atomic(lambda f: (np.savez_compressed if compressed else np.savez)(f, **arrays), path)


def state_sha256(state: dict) -> str:
    """SHA-256 of every tensor of a state dict, by name: the ``weights`` of a result's fingerprint."""
    h = hashlib.sha256()
    for name, t in sorted(state.items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def read_json(path: str | Path, fix: str = "delete it and run the command that wrote it again") -> dict:
    """A JSON file fastfair wrote, its checksum (:data:`JSON_CHECKSUM`) checked and left out; a damaged one (not
    JSON, written in place by an older version, or bytes changed since) is a UserError saying ``fix``. A record
    without a checksum is damage too under a run that signs its files (:func:`_in_signed_run`), else an older
    fastfair's, read as it is (:class:`Unchecked`)."""
    try:
        text = Path(path).read_text()
        record = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UserError(f"{path} is damaged (not JSON); {fix}") from None
    if not isinstance(record, dict):
        return record
    if JSON_CHECKSUM not in record:
        if _in_signed_run(Path(path)):
            raise UserError(f"{path} has no checksum ({JSON_CHECKSUM}), which every record fastfair writes in this "
                            f"run carries: it was edited or damaged; {fix}")
        return json.loads(text, object_hook=Unchecked)
    if record[JSON_CHECKSUM] != _json_sha256(record):
        raise UserError(f"{path} is damaged: its content does not match its checksum ({JSON_CHECKSUM}: bytes "
                        f"changed after fastfair wrote it); {fix}")
    del record[JSON_CHECKSUM]
    return record


def _in_signed_run(path: Path) -> bool:
    """Whether ``path`` lies in a run that signs every file (its config.toml names its id), as its records do:
    ``RUN/X``, ``RUN/eval/X``, ``RUN/eval/previous/X``, ``RUN/diagnostics/X``."""
    for folder in list(path.absolute().parents)[:3]:
        if (folder / "config.toml").is_file():
            return RunDir(folder).run_id() is not None
    return False


def load_npz(path: str | Path, fix: str) -> dict[str, np.ndarray]:
    """Every array of an ``.npz`` fastfair wrote, without pickle; numpy checks each member's CRC-32 as it reads it,
    so a damaged file (or a cut-short one) is a UserError naming it, the damage and ``fix``."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except (zipfile.BadZipFile, ValueError, EOFError, zlib.error) as err:
        raise UserError(f"{path} is damaged ({err}: bytes changed or lost after fastfair wrote it); {fix}") from None


def append_text(text: str, path: str | Path) -> None:
    """Append ``text`` and fsync it: once this returns, it survives a crash. A failed append (:func:`writing`)
    is cut off again, so the file keeps only what was whole before."""
    data = text.encode()
    with writing(path), _open(path, "ab") as f:
        start = os.fstat(f.fileno()).st_size
        try:
            done = 0
            while done < len(data):  # an unbuffered write may take part of the data
                done += f.write(data[done:])
            os.fsync(f.fileno())
        except BaseException:
            os.ftruncate(f.fileno(), start)
            raise


def jsonl_line(record: dict, path: str | Path) -> str:
    """One line of an append-only log: ``record`` with its own :data:`JSON_CHECKSUM` (as a JSON file carries one),
    which :func:`read_jsonl` checks, so a line whose bytes changed is refused rather than read as another number. A
    line read without a checksum (:class:`Unchecked`) is written again without one."""
    if holds_unchecked(record):
        return _json_text(record, path) + "\n"
    record = json.loads(_json_text(record, path))
    return _json_text({**record, JSON_CHECKSUM: _json_sha256(record)}, path) + "\n"


def append_jsonl(record: dict, path: str | Path) -> None:
    """Append one checksummed JSON line (:func:`jsonl_line`, :func:`append_text`)."""
    append_text(jsonl_line(record, path), path)


# ---- failed writes: one line naming the file, why, and the free space there ----------------------
@contextlib.contextmanager
def writing(path: str | Path):
    """Any OSError while writing ``path`` (disk full, quota, I/O error, read-only, no permission) becomes one
    :class:`WriteError` naming the file, why, the free space on its filesystem and that the old file is kept.
    The writers above do so; other writers of a run's files (a library that writes its own file) run in it."""
    path = Path(path)
    existed = path.exists()
    try:
        yield
    except OSError as err:
        raise _write_error(path, err, existed) from None
    except RuntimeError as err:  # torch.save reports its file's failed write as a RuntimeError raised over it
        cause = err.__cause__ or err.__context__
        if not isinstance(cause, OSError):
            raise
        raise _write_error(path, cause, existed) from None


def check_writable(folder: str | Path, elsewhere: str) -> Path:
    """``folder``, made with its parents where missing, checked to take new files before any long work: a read-only
    filesystem or a folder without write permission is one :class:`WriteError` naming ``elsewhere`` (how to write
    somewhere else), rather than a traceback from its first ``mkdir`` or a failed write after the work."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if not os.access(folder, os.W_OK):  # access(2) says EROFS and missing permission alike, for root too
            code = errno.EROFS if os.statvfs(folder).f_flag & os.ST_RDONLY else errno.EACCES
            raise OSError(code, os.strerror(code))
    except OSError as err:
        why = _WHY.get(err.errno, ((err.strerror or str(err)).lower(), ""))[0]
        raise WriteError(f"cannot write in {folder}: {why}; nothing was written; {elsewhere}, or make it writable") \
            from None
    return folder


# what went wrong, and what the user does about it, by errno
_WHY = {errno.ENOSPC: ("no space left on the device", "free some space"),
        errno.EDQUOT: ("the disk quota is used up", "free some space or raise the quota"),
        errno.EIO: ("input/output error, from a failing disk or a network filesystem gone away", "fix the disk"),
        errno.EROFS: ("the filesystem is read-only", "make it writable or write elsewhere"),
        errno.EACCES: ("permission denied", "make it writable or write elsewhere"),
        errno.EPERM: ("permission denied", "make it writable or write elsewhere")}


def _write_error(path: Path, err: OSError, existed: bool) -> WriteError:
    why, fix = _WHY.get(err.errno, ((err.strerror or str(err)).lower(), "fix the disk"))
    kept = f"the previous {path.name} is kept as it was" if existed else f"no {path.name} was written"
    return WriteError(f"cannot write {path}: {why} ({free_space(path)}); {kept}; {fix}")


def free_space(path: Path) -> str:
    """``12.3 GB free on /data``: the free space of the filesystem ``path`` is (or would be) on."""
    folder = _on_disk(path)
    mount = folder
    while not os.path.ismount(mount):
        mount = mount.parent
    try:
        return f"{_size(shutil.disk_usage(folder).free)} free on {mount}"
    except OSError:
        return f"free space on {mount} unknown"


def check_space(path: Path, needed: int, what: str) -> None:
    """Refuse, before writing, ``what`` of about ``needed`` bytes at ``path`` where its filesystem has less free."""
    if shutil.disk_usage(_on_disk(path)).free < needed:
        raise WriteError(f"cannot write {path}: {what} need about {_size(needed)} ({free_space(path)}); nothing was "
                         "written; free some space")


def _on_disk(path: Path) -> Path:
    """The nearest existing folder at or above ``path``: whose filesystem ``path`` is (or would be) on."""
    folder = Path(os.path.abspath(path))
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    return folder


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def read_jsonl(path: str | Path, fix: str, signed: bool = False) -> tuple[list[dict], bool]:
    """(records, whether a torn last line was left out), each line's checksum (:func:`jsonl_line`) checked and left
    out. Only the last line may be torn (a kill while appending); a line before it that is not JSON, or any line
    whose content does not match its checksum, means the file was damaged otherwise: a UserError naming the line
    and ``fix``. In a run that signs its files (``signed``) a line without a checksum is such damage too; else it
    is an older fastfair's line, read as it is (:class:`Unchecked`)."""
    path = Path(path)
    if not path.is_file():
        return [], False
    lines = path.read_bytes().decode(errors="replace").splitlines()  # a damaged byte fails as JSON, named below
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                return records, True
            raise UserError(f"{path}, line {i + 1}, is not JSON: the file is damaged; "
                            f"delete that line (and any half-written one) and run the command again") from None
        if isinstance(record, dict) and JSON_CHECKSUM in record:
            if record.pop(JSON_CHECKSUM) != _json_sha256(record):
                raise UserError(f"{path}, line {i + 1}, is damaged: its content does not match its checksum "
                                f"({JSON_CHECKSUM}: bytes changed after fastfair wrote it); {fix}")
        elif signed:
            raise UserError(f"{path}, line {i + 1}, has no checksum ({JSON_CHECKSUM}), which every line fastfair "
                            f"writes in this run carries: it was edited or damaged; {fix}")
        else:
            record = json.loads(line, object_hook=Unchecked)
        records.append(record)
    return records, False


# another program's model file is often what a user meant: fastfair eval reads it when told its architecture
FOREIGN_HINT = "; to evaluate a model file fastfair did not write, add --model ARCH (fastfair models)"


@contextlib.contextmanager
def instead_of_model_flag(what: str):
    """:func:`load_checkpoint`'s refusals inside the block end with ``what`` (what the caller takes instead of a
    fastfair checkpoint) where they would name ``--model ARCH``, a flag of ``fastfair eval`` alone."""
    try:
        yield
    except UserError as err:
        if FOREIGN_HINT not in str(err):
            raise
        raise UserError(str(err).replace(FOREIGN_HINT, f"; {what}")) from None


TRUNCATED = "is truncated (a zip, as torch.save writes, whose end is missing: a copy or a write that stopped part-way)"


def truncated(path: Path) -> bool:
    """Whether ``path`` begins as a zip (every checkpoint torch.save writes) but lacks the zip's end."""
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04" and not zipfile.is_zipfile(path)


def load_checkpoint(path: str | Path, map_location="cpu", needs: tuple[str, ...] = CHECKPOINT_KEYS) -> dict:
    """Load a fastfair checkpoint without unpickling arbitrary objects; a file that is not one
    (empty, truncated, another program's, or holding objects other than tensors) is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise no_checkpoint(path)
    if truncated(path):
        raise UserError(f"{path} {TRUNCATED}; pass another .pt file, or copy this one again")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip; torch.load on other files fails obscurely
        raise UserError(f"{path} is not a checkpoint written by fastfair train (empty or another format); pass a "
                        f"run directory or a .pt file from its checkpoints/{FOREIGN_HINT}")
    damage = zip_damage(path)
    if damage:
        raise UserError(f"{path} is damaged: {damage} (bytes changed after fastfair wrote it: a disk, copy or "
                        f"transfer error), so fastfair does not load it; {_instead_of(path)}")
    try:
        ck = safe_load.weights_only(path, map_location)  # a protocol torch cannot read safely is its own line
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


def zip_damage(path: str | Path) -> str:
    """What is damaged in the zip ``path`` ("" when nothing is): every member is read once, in 4 MB pieces, and
    checked against its CRC-32 (zipfile checks it at a member's end), or its directory or a header is unreadable.
    A zip whose CRCs are all 0 was saved with torch's CRC-32 off and cannot be checked."""
    try:
        with zipfile.ZipFile(path) as z:
            members = z.infolist()
            if not any(m.CRC for m in members):
                return ""
            for m in members:
                try:
                    with z.open(m) as f:
                        while f.read(4 << 20):
                            pass
                except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as err:
                    return f"its part {m.filename} fails its " + ("CRC-32 check" if "CRC" in str(err) else
                                                                  f"check ({err})")
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        return f"its zip directory is unreadable ({err})"
    return ""


def _instead_of(path: Path) -> str:
    """What to do instead of loading the damaged checkpoint ``path``: copy it again, or use the intact checkpoints
    of its run (each with its epoch), or for last.pt train the run again from its first epoch."""
    run = RunDir.of_checkpoint(path)
    intact = []
    for other in sorted(run.checkpoints.glob("*.pt")) if path.parent == run.checkpoints else []:
        if other != path and zipfile.is_zipfile(other) and not zip_damage(other):
            with contextlib.suppress(Exception):  # an unreadable one is not offered
                ck = torch.load(other, map_location="cpu", weights_only=True, mmap=True)
                # interrupted.pt's epoch counts those done before it: it holds part of the next
                intact.append(f"{other.stem} (epoch {one_based_epoch(ck) + (other == run.interrupted)})")
    todo = "copy it again from where it came from"
    if path == run.last:
        todo += f", or move it aside and {run.resume_without_last()}"
    if intact:
        todo += (f"; the run's intact checkpoints: {', '.join(intact)}, e.g. `fastfair eval {run.path} --checkpoint "
                 f"{intact[0].split()[0]}`")
    return todo


def init_model(model, path: str | Path) -> None:
    """Start training from another run's model weights (``train.init_from``; FRL fine-tunes a robust model)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"train.init_from: no checkpoint at {path}; pass a .pt file written by fastfair train")
    with instead_of_model_flag("train.init_from takes a checkpoint of a fastfair run (RUN/checkpoints/*.pt)"):
        ck = load_checkpoint(path, needs=("model",))
    try:
        model.load_state_dict(ck["model"])
    except RuntimeError as err:
        raise UserError(f"train.init_from: {path} holds a different model ({str(err).splitlines()[0]}); "
                        "use the same model.name, width, norm, head and classes as that run") from None
