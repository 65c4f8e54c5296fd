"""The training loop: one data flow for every method (docs/design.md).

Per step: method.perturb -> method.loss -> optimiser step -> per-class counting on the device.
Per epoch: read the counters once, let the method update its per-class vectors, validate per
class, keep the best checkpoints by each selection policy, write the last checkpoint atomically
and append one line to ``metrics.jsonl``. A killed run continues exactly with ``--resume``
because every epoch reseeds the RNGs from (seed, epoch) and the checkpoint holds all state.

A stop signal (Ctrl-C, SIGTERM, SIGUSR1: :mod:`fastfair.stopping`) stops training at the next step boundary,
agreed by every rank under torchrun. Mid-epoch, ``checkpoints/interrupted.pt`` keeps the epoch's state
there (weights, optimiser, per-class sums so far, every rank's random streams and buffers); ``--resume``
draws and drops the loader's batches of the saved steps and continues, bit for bit on a CPU.
"""
from __future__ import annotations

import contextlib
import copy
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from fastfair import build, config, cpu, data, identity, ops, stopping
from fastfair.checks import check_config
from fastfair.training import averaging, fallback, optim, teacher
from fastfair.scaleout import distributed
from fastfair.attacks import autoattack, names
from fastfair.attacks.pgd import can_compile_descent, compile_descent, descend, descent_capture
from fastfair.training.class_state import ClassState
from fastfair.training.divergence import diverged, nonfinite_stats, nonfinite_tensors
from fastfair.config import Config
from fastfair.errors import UserError
from fastfair.evaluation.measures import NonFinite
from fastfair.evaluation.per_class import evaluate, evaluate_checkpoint
from fastfair.methods import METHODS
from fastfair.progress import Progress
from fastfair.reports import figures, summary, tracking
from fastfair.rundir import (EPOCH_NUMBERING, RUN_ID, RunDir, init_model, load_checkpoint, new_run_id, notice,
                             save_atomic)
from fastfair.training.selection import policy_scores, scored_policies


def _seed(cfg: Config, epoch: int) -> None:
    # torchrun: other ranks get their own streams (attack random starts); rank 0 keeps one process's
    torch.manual_seed(cfg.train.seed * 100_003 + epoch + 1 + 1_000_003 * distributed.current().rank)


class Trainer:
    def __init__(self, cfg: Config, out: str | Path, resume: bool = False, quiet: bool = False):
        warnings = check_config(cfg)  # every value, before any data is loaded or anything written
        self.cfg, self.out = cfg, Path(out)
        self.main = distributed.current().is_main  # only rank 0 writes the run directory and prints
        self.progress = Progress(enabled=cfg.train.progress and not quiet and self.main,
                                 every_s=cfg.train.progress_every_s)
        self.log = self.progress.print
        overridden = config.overrides_line(cfg)
        if overridden:  # flags beat the preset, and say which of its keys they changed (kept for train.log)
            self.log(overridden)
        self.dev = build.device(cfg)
        graphs, graphs_note = build.cudagraphs(cfg, self.dev)  # a refused setting is refused before data loads
        self.amp = build.autocast_dtype(cfg, self.dev)
        self.cl = build.channels_last(cfg, self.dev)
        self.bundle, sp = build.training_splits(cfg)
        self.spec = build.model_spec(cfg, self.bundle)
        if autoattack.NAME in names.expand(cfg.eval.attacks):  # the final evaluation's, refused before training
            autoattack.check_classes(self.bundle.num_classes, "eval.attacks: ")
        x, y = sp["train"]
        self.train_loader = distributed.train_loader(build.train_loader(cfg, sp["train"], self.dev, self.cl))
        self.val_loader = build.eval_loader(cfg, distributed.shard(sp["val"]), self.dev, self.cl, name="val")
        self.test_split = sp
        # the validation split's size per class, on every epoch line: with 10 images a class's accuracy moves in
        # steps of 10 points, which "worst" shows as jumps
        per_class = torch.bincount(sp["val"][1], minlength=self.bundle.num_classes)
        low, high = int(per_class.min()), int(per_class.max())
        self.val_size = (f"{low}/class" if low == high else f"{low}-{high}/class") + \
            (" of the TEST set" if cfg.train.select_split == "test" else "")  # the paper's rule chooses on it
        d = cfg.data
        if d.train_per_class or d.test_per_class:
            self.log(f"{data.subset_note(d.dataset, d.train_per_class, d.test_per_class)}: {len(y)} training, "
                     f"{len(sp['test'][1])} test images")

        torch.manual_seed(cfg.train.seed)
        self.model = build.model_from_spec(self.spec, self.dev, self.cl)
        if cfg.train.init_from:
            init_model(self.model, cfg.train.init_from)
        self.model, self.train_model = distributed.prepare_model(self.model, cfg)  # DDP under torchrun
        # Compiled (CUDA by default): the attack's K steps as one graph with the model traced
        # inside (compile_descent), the method's loss with the model inside it (one graph for the
        # forwards + loss of the update), and the model alone for validation. Checkpoints use
        # the uncompiled module. With CUDA graphs (CUDA by default) the step's regions are compiled
        # twice, with and without them, and the first steps check one against the other
        # (fallback.CheckedStep); validation, under 1 % of an epoch's launches, runs without.
        compile_ = build.compiler(cfg, self.dev)
        self.ways = fallback.TwoWay(build.compiler(cfg, self.dev, graphs=True), compile_) if graphs else None
        step_compile = self.ways or compile_
        self.net = compile_(self.model) if compile_ else self.model
        compiled_descent = bool(compile_ and cfg.train.compile_attack and can_compile_descent())
        if compiled_descent:
            descent, self.attack_net = compile_descent(step_compile), self.model
        else:  # an eager loop of steps around the (compiled) model
            descent, self.attack_net = descend, self.net
            if compile_ and cfg.train.compile_attack:  # the faster mode where Dynamo breaks the descent
                self.log(f"train.compile_attack: torch {torch.__version__} does not capture the attack as one "
                         f"graph ({descent_capture()}); the attack runs as an eager loop around the compiled model")
        backend = ops.backend(build.kernels(cfg, self.dev, compiled_descent))
        self.method = METHODS.get(cfg.method.name)(cfg, backend, descent, step_compile if compiled_descent else None)
        self.loss_fn = step_compile(self.method.objective) if compile_ else self.method.objective
        self._step = (fallback.CheckedStep(self._one_step, self.ways, self._snapshot, self._restore, self._fell_back)
                      if self.ways else self._one_step)
        self.state = ClassState(self.bundle.num_classes, self.dev,
                                train_counts=torch.bincount(y, minlength=self.bundle.num_classes))
        teacher.attach(self.method, self.bundle.num_classes, self.dev)
        self.method.setup(self.state)
        warnings = warnings + self.method.setup_warnings()  # what the options know once they saw the class counts
        self.method.use_loader(self.train_loader, self.state)  # before a resume loads the state the loader reads
        self.opt = optim.optimizer(cfg.train, self.model.parameters(), self.dev)
        self.rate = optim.schedule(cfg.train)  # (epoch, part done) -> lr: set before every step, nothing to save
        self.start_epoch = 0
        self.run_id: str | None = None  # the run's id (rundir.RUN_ID); None for an older fastfair's run
        self.within: dict | None = None  # an interrupted epoch's saved state, continued by run_epoch
        self.best: dict[str, float] = {}  # best score by policy name (+ "_avg" for the averaged model)
        self.averager = averaging.build(cfg, self.model)  # EMA / FAWA, or None
        self._said_negative = False  # the note on a loss below 0 (ME's entropy bonus), printed once
        self._prepare_dir(resume)
        # what is saved: (epochs, steps of the next epoch, that epoch's steps); the line of a stopped run says it
        self.kept = (self.start_epoch, *((self.within["step"], self.within["steps"]) if self.within else (0, 0)))
        if self.main:  # the run folder keeps the console's lines and the periodic progress lines
            self.progress.attach(self.run.train_log)
        if (cfg.train.optimizer, cfg.train.lr_schedule) != ("sgd", "step"):  # said beside the defaults' usual pair
            self.log(optim.describe(cfg.train))
        if graphs_note:  # train.cudagraphs=auto gave way to train.cpp_wrapper=on
            self.log(graphs_note)
        if self.amp and self.dev.type == "cpu" and cfg.train.amp == "auto":  # a choice this machine made: said
            self.log("train.amp=auto: bf16 autocast on this CPU (native bf16); evaluation stays fp32; "
                     "--set train.amp=off trains in fp32")
        # train.track (TensorBoard, W&B): rank 0 alone; a missing package fails here, before any epoch
        self.tracker = _tracker(cfg, self.out) if self.main else tracking.Tracker(self.out, {})
        # settings the run cuts short (checks.check_epochs): said once every refusal above had its chance, so a
        # refused run shows its one error line alone
        for line in warnings if self.main else []:
            self.progress.warn(line)

    # ---- run directory ------------------------------------------------------------------
    @property
    def run(self) -> RunDir:
        return RunDir(self.out)

    def _prepare_dir(self, resume: bool) -> None:
        """A new run needs a folder without run files, and gets its id; a resumed one continues its saved config
        (changed only in :data:`config.RESUMABLE` keys, recorded in ``history.jsonl``) from checkpoints that are
        its own (:mod:`fastfair.identity`)."""
        run, changed = self.run, {}
        signed = True  # config.toml is written with its checksum line (an older run's without, where it had none)
        if resume:
            text, self.run_id, signed = run.saved_config()
            saved = config.load_saved_text(text, str(run.config))
            changed = config.resume_changes(saved, self.cfg)
            run.read_history()  # each line checked, and of this run
            if run.last.is_file():
                self._load(self._own(run.last, run.load_last(), saved))
            self.within = self._interrupted_epoch(saved)
            if run.last.is_file() or self.within:
                self._reschedule(saved, changed)
                where = (f"in epoch {self.start_epoch + 1} of {self.cfg.train.epochs} after step "
                         f"{self.within['step']} of {self.within['steps']}" if self.within else
                         f"after epoch {self.start_epoch} of {self.cfg.train.epochs}")
                self.log(f"resuming {self.out} {where}")
                newer = [p for p in scored_policies() if p not in self.best]
                if newer:  # the checkpoint predates these policies: their best is over the epochs from now on
                    self.log(f"selection polic{'ies' if len(newer) > 1 else 'y'} {', '.join(newer)} came after this "
                             f"run started: {', '.join(f'best_{p}.pt' for p in newer)} will cover epochs "
                             f"{self.start_epoch + 1}-{self.cfg.train.epochs} only")
            elif run.read_metrics():  # last.pt moved aside (damaged), and no interrupted.pt to continue from
                self.log(f"{self.out}: {run.last} is not there, and nothing else holds the state of its finished "
                         f"epochs: training the run again from its first epoch")
            else:  # stopped (killed, diverged) in its first epoch: nothing to keep
                self.log(f"{self.out}: no epoch had finished; starting it again from the first")
            if self.main and run.truncate_metrics(self.start_epoch):
                notice(f"{run.metrics}: removed a half-written last line (the run was killed while writing it)")
        elif run.run_files():
            raise UserError(f"{self.out} already holds a run ({', '.join(run.run_files())}); pass --resume to "
                            "continue it, or another --out for a new run")
        else:
            self.run_id = new_run_id()
        distributed.barrier()  # every rank has looked at the folder before rank 0 writes into it
        if self.main:
            # first: a run whose config could not be written holds nothing
            run.write_config(self.cfg.to_toml(), self.run_id, signed)
            run.checkpoints.mkdir(parents=True, exist_ok=True)
            # "epoch": the first epoch this process trains (1-based, like every epoch fastfair writes)
            # "step": the steps of that epoch an interrupted epoch had saved
            run.append_history({**self._identity("run"), "event": "resume" if resume else "start",
                                "epoch": self.start_epoch + 1,
                                **({"step": self.within["step"]} if self.within else {}),
                                "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                "changed": changed})

    def _reschedule(self, saved: Config, changed: dict) -> None:
        """After --resume changed train.epochs under a schedule drawn over the run (cosine, onecycle, one cyclic
        cycle): say that the epochs still to train follow the redrawn curve. Every other change (train.lr,
        milestones, ...) needs no word: the rate is a function of the config and the epoch, set every step."""
        t = self.cfg.train
        if "train.epochs" not in changed or not optim.spans_run(t):
            return
        before = optim.schedule(saved.train)
        self.log(f"train.epochs {changed['train.epochs'][0]} -> {t.epochs}: train.lr_schedule={t.lr_schedule} is "
                 f"drawn over the run, so epoch {self.start_epoch + 1} on follows the {t.epochs}-epoch curve (its "
                 f"rate there {self.rate(self.start_epoch, 0.0):.4g}, {before(self.start_epoch, 0.0):.4g} before)")

    def _identity(self, key: str = RUN_ID) -> dict:
        """``{key: the run's id}`` for what the run writes; {} for an older fastfair's run, which has none."""
        return {key: self.run_id} if self.run_id else {}

    def _own(self, path: Path, ck: dict, saved: Config) -> dict:
        """``ck`` (from ``path``) once it is this run's (:func:`identity.check` against the saved config) and within
        the epochs this resume trains to."""
        identity.check(self.run, path, ck, self.run_id, saved)
        if ck["epoch"] > self.cfg.train.epochs:  # the saved epochs held it: --epochs asked for fewer
            raise UserError(f"{path} holds epoch {ck['epoch']}, and --resume was given {self.cfg.train.epochs} epochs: "
                            f"the epochs trained stay trained; pass --epochs {ck['epoch']} or more, or leave it out")
        return ck

    # Inside the loop ``epoch`` is 0-based (it seeds the RNGs and the loader, so resumed runs stay
    # bit-exact); everything written or printed says ``epoch + 1``, the epoch's number from 1.
    def _state(self, epoch: int) -> dict:
        return {
            "epoch": epoch + 1, **EPOCH_NUMBERING, **self._identity(), "model": self.model.state_dict(),
            "optimizer": self.opt.state_dict(),
            "class_state": self.state.state_dict(),
            "best": dict(self.best), "spec": self.spec, "config": self.cfg.to_toml(),
            "average": self.averager.state_dict() if self.averager else None,
        }

    def _interrupted_epoch(self, saved: Config) -> dict | None:
        """``checkpoints/interrupted.pt`` when it continues the epoch after ``last.pt``'s, or a later one (``last.pt``
        moved aside, or older: it holds the whole state of its epoch so far), loaded, with this rank's part of it
        (``step``, ``steps``, ``model``, ``rng``, ``sums``, ``buffers``); None when there is none. One from before
        ``last.pt`` (a stop between that epoch's end and the file's removal) is removed: ``last.pt``, loaded and
        checked above, holds its epoch whole. One written by another number of processes cannot give each rank its
        streams: its epoch starts again from ``last.pt``, or is refused where ``last.pt`` does not reach it (it is
        the run's latest state, which training on would delete)."""
        path = self.run.interrupted
        if not path.is_file():
            return None
        ck = self._own(path, load_checkpoint(path), saved)
        if ck["epoch"] < self.start_epoch:
            if self.main:
                path.unlink()
                self.log(f"removed {path}: its epoch {ck['epoch'] + 1} is whole in last.pt")
            return None
        world = distributed.current().world
        if len(ck["ranks"]) != world:
            if ck["epoch"] > self.start_epoch:
                raise UserError(f"{path} holds the run's latest state (epoch {ck['epoch'] + 1}, after step "
                                f"{ck['step']} of {ck['steps']}), written by {len(ck['ranks'])} processes, and this "
                                f"run has {world}, which cannot continue it; resume with {len(ck['ranks'])} "
                                f"processes, or move it aside to train from the state last.pt holds")
            self.log(f"{path} was written by {len(ck['ranks'])} processes and this run has {world}: epoch "
                     f"{self.start_epoch + 1} starts again from its first step")
            return None
        if ck["epoch"] > self.start_epoch:
            last = f"holds epoch {self.start_epoch}" if self.run.last.is_file() else "is not there"
            self.log(f"{self.run.last} {last}: continuing from {path.name}, the run's latest state")
        self._load(ck)
        return {"step": ck["step"], "steps": ck["steps"], "model": ck["model"],
                **ck["ranks"][distributed.current().rank]}

    def _load(self, ck: dict) -> None:
        self.model.load_state_dict(ck["model"])
        self.opt.load_state_dict(ck["optimizer"])  # an earlier run's "scheduler" is not read: the rate is a function
        self.state.load_state_dict(ck["class_state"])
        self.best = dict(ck["best"])
        if self.averager:
            self.averager.load_state_dict(ck["average"])
        self.start_epoch = ck["epoch"]  # epochs done (1-based number of the last) = 0-based index of the next

    # ---- the loop -------------------------------------------------------------------------
    def _autocast(self):
        return torch.autocast(self.dev.type, dtype=self.amp) if self.amp else contextlib.nullcontext()

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One step; no host sync (counters stay on the device). With CUDA graphs the first steps at each batch shape
        are also run without them and compared, which syncs (fallback.CheckedStep)."""
        self._step(x, y)

    def _one_step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        distributed.sync_buffers(self.model)  # torchrun: every rank attacks and trains from rank 0's BN statistics
        with self._autocast():
            x_adv = self.method.perturb(self.attack_net, x, y, self.state)
            loss, logits = self.loss_fn(self.train_model, x, x_adv, y, self.state)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.method.after_step(self.model)
        self.state.count(logits, y, loss)

    # ---- CUDA graphs' check (fallback.CheckedStep): what a step changes, copied and put back ----------------
    def _snapshot(self) -> dict:
        rng = {"cpu": torch.get_rng_state()}
        if self.dev.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.dev)
        return copy.deepcopy({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
                              "class_state": self.state.state_dict(), "rng": rng})

    def _restore(self, saved: dict) -> None:
        self.model.load_state_dict(saved["model"])  # copied into the parameters and buffers, which stay where they are
        self.opt.load_state_dict(copy.deepcopy(saved["optimizer"]))  # it would keep these very tensors
        self.state.load_state_dict(saved["class_state"])
        torch.set_rng_state(saved["rng"]["cpu"])
        if "cuda" in saved["rng"]:
            torch.cuda.set_rng_state(saved["rng"]["cuda"], self.dev)

    def _fell_back(self, problem: str) -> None:
        self.progress.warn(f"train.cudagraphs: the step with CUDA graphs {problem}; this run goes on with the "
                           "compiled step without them (--set train.cudagraphs=off skips the check)")

    def validate(self, epoch: int | None = None, model=None) -> dict:
        """The validation split under clean and train.val_attack; ``epoch``: the epoch trained just before, whose
        non-finite logits are its divergence (None: the initial model, whose are the model's error)."""
        c = self.cfg
        try:
            return evaluate(self.net if model is None else model, self.val_loader, ["clean", c.train.val_attack],
                            eps=c.eval.eps, alpha=c.eval.alpha, classes=self.bundle.classes,
                            cw_kappa=c.eval.cw_kappa, clip_start=c.eval.clip_start)
        except NonFinite as err:  # finite weights can still overflow the logits: the run diverged all the same
            if epoch is not None:
                self._stop_if_diverged(epoch, [f"validation logits ({err.nonfinite} of {err.images} images under "
                                               f"{err.attack})"])
            raise

    def run_epoch(self, epoch: int) -> dict:
        _seed(self.cfg, epoch)
        self.method.begin_epoch(self.model, epoch)
        self.train_loader.set_epoch(epoch)
        self.model.train()  # once per epoch: attacks restore the mode they found, validation comes after
        steps, batch = len(self.train_loader), build.batch_size(self.cfg, epoch)  # after set_epoch: its phase's
        lr = self.rate(epoch, 1 / steps)  # the first step's, recorded
        within, self.within = self.within, None
        done = within["step"] if within else 0  # steps an interrupted epoch had saved
        vote = distributed.StopVote()
        t0 = time.perf_counter()
        # the run's ETA: the later epochs at this one's steps (a later phase's batch size may change them)
        with self.progress.task(f"epoch {epoch + 1}/{self.cfg.train.epochs}", steps, images_per_step=batch,
                                later=(self.cfg.train.epochs - epoch - 1) * steps) as advance:
            try:
                for i, (x, y) in enumerate(self.train_loader):
                    if i < done:  # a saved step's batch: drawn and dropped, so the loader's stream goes on as it did
                        advance()
                        continue
                    if within and i == done:
                        self._continue(within)
                    # a signal at the last boundary (torchrun: agreed by the ranks one step late)
                    signum = vote.lagged(stopping.requested())
                    if signum:
                        self._stop_in_epoch(epoch, i, done, steps, signum, vote)
                    # a function of (epoch, step) alone, so a resumed run continues it exactly
                    for group in self.opt.param_groups:
                        group["lr"] = self.rate(epoch, (i + 1) / steps)
                    self.train_step(x, y)
                    advance()
            finally:
                vote.close()
        distributed.reduce_class_state(self.state)
        stats = self.state.read()  # the epoch's one host sync
        self._stop_if_diverged(epoch, nonfinite_stats(stats))
        seconds = time.perf_counter() - t0
        distributed.sync_buffers(self.model)  # torchrun: every rank validates the same BN statistics
        val = self.validate(epoch)
        va = val[self.cfg.train.val_attack]["summary"]
        # the method's own pass over the validation split (WAT's per-class loss); {} for most methods
        val_method = self.method.validation_pass(self.attack_net, self.val_loader, self.state, epoch)
        # lr_next: the rate the next epoch starts at, for a method whose update decays with it (ABSLD's temperatures)
        self.method.end_epoch(self.state, epoch, {**stats, "val": val, "val_method": val_method,
                                                  "lr_next": self.rate(epoch + 1, 0.0)})
        # before anything of the epoch is written: weights, optimiser and per-class state all finite
        self._stop_if_diverged(epoch, nonfinite_tensors(self._state(epoch)))
        record = {
            "epoch": epoch + 1, "lr": lr, "loss": stats["loss"], "train_robust_acc": stats["train_acc"],
            "train_robust_acc_per_class": stats["train_acc_per_class"],
            "val": {k: {"per_class": v["per_class"], **{s: v["summary"][s] for s in ("avg", "worst", "cv", "mcd")},
                        "entropy": v["entropy"]} for k, v in val.items()},
            "vectors": stats["vectors"], "epoch_time_s": seconds,
            "images_per_s": (steps - done) * batch / seconds,
        }
        if self.averager:
            record["average"] = self._average(epoch, va["worst"])
        if self.main:  # torchrun: rank 0 alone writes
            with self.run.metrics_until_saved(record):  # the line stays only once the checkpoint landed
                self._checkpoint(epoch, va)
            self.tracker.log(tracking.scalars(record, self.bundle.classes), epoch + 1)
        self.log(f"epoch {epoch + 1:3d}  loss {stats['loss']:.4f}  train-robust {stats['train_acc']:.1f}  "
                 f"val {self.val_size}: clean {val['clean']['summary']['avg']:.1f}  {self.cfg.train.val_attack} "
                 f"{va['avg']:.1f} (worst {va['worst']:.1f})  {record['images_per_s']:.0f} img/s")
        if stats["loss"] < 0 and not self._said_negative:
            self._said_negative = True
            self.log("  (the loss is below 0 because the method subtracts a term from it, e.g. the ME entropy "
                     "bonus beta*H(p); that is expected, not a fault)")
        return record

    def _continue(self, within: dict) -> None:
        """Before the first step after the saved ones: the weights as saved (``begin_epoch`` ran again on them),
        and this rank's buffers, sums of the epoch so far and random streams as they were after the last saved
        step."""
        self.model.load_state_dict(within["model"])
        for name, buffer in self.model.named_buffers():
            buffer.copy_(within["buffers"][name])
        self.state.load_sums(within["sums"])
        torch.set_rng_state(within["rng"]["cpu"])
        if self.dev.type == "cuda" and "cuda" in within["rng"]:
            torch.cuda.set_rng_state(within["rng"]["cuda"], self.dev)

    def _stop_in_epoch(self, epoch: int, step: int, done: int, steps: int, signum: int, vote) -> None:
        """Stop every rank at this step boundary: save the epoch's state so far to ``interrupted.pt`` (rank 0
        writes; with every rank's random streams, sums and buffers: torchrun's ranks hold their own BatchNorm
        statistics between DDP's broadcasts, which an attack in eval mode reads), unless it is the state already
        saved (``done`` steps)."""
        vote.close()
        buffers = {name: b.detach().cpu().clone() for name, b in self.model.named_buffers()}
        parts = distributed.gather_host({"rng": _rng_state(self.dev), "sums": self.state.sums_state(),
                                         "buffers": buffers})
        if self.main and step > done:
            save_atomic({**self._state(epoch), "epoch": epoch, "step": step, "steps": steps, "ranks": parts},
                        self.run.interrupted)
        self.kept = (epoch, step, steps)
        distributed.barrier()  # no rank ends before rank 0 has saved: torchrun stops the others when one ends
        raise stopping.Stopped(signum)

    def _stop_if_signalled(self) -> None:
        """At an epoch boundary, where everything trained is saved: stop when a rank received a stop signal."""
        signum = distributed.StopVote().now(stopping.requested())
        if signum:
            raise stopping.Stopped(signum)

    def _stopped_at_once(self) -> str:
        """The line of a process a second Ctrl-C ends inside a step that never returns to Python
        (:mod:`fastfair.stopping`): the last whole checkpoint on disk, and how to go on from it."""
        epochs, step, steps = self.kept
        go_on = f"continue with: {distributed.command(f'train --out {self.out} --resume')}"
        if step:
            saved = (f"{epochs} epoch{'s' * (epochs != 1)} and " if epochs else "") + f"{step} of {steps} steps"
            kept = f"the last whole checkpoint is {self.run.interrupted} ({saved})"
        elif epochs:
            kept = f"the last whole checkpoint is {self.run.last} (epoch {epochs} of {self.cfg.train.epochs})"
        else:
            kept = "no epoch had finished, so no checkpoint was kept"
        return f"stopped at once by a second Ctrl-C inside a training step; {kept}; {go_on}"

    def _stop_if_diverged(self, epoch: int, nonfinite: list[str]) -> None:
        if nonfinite:
            # last.pt holds the epoch before (written by this process or the one resumed from)
            raise diverged(epoch, nonfinite, str(self.out), epoch - 1 if epoch > 0 else None, self.cfg.train.lr)

    def _average(self, epoch: int, worst: float) -> dict:
        """Average the epoch in (EMA/FAWA), then validate and keep the averaged model's checkpoints."""
        accepted = self.averager.update(self.model, epoch, worst / 100.0)
        if not self.averager.started:
            return {"accepted": accepted}
        self._stop_if_diverged(epoch, [f"averaged {n}" for n in nonfinite_tensors(self.averager.model.state_dict())])
        val = self.validate(epoch, self.averager.model)
        va = val[self.cfg.train.val_attack]["summary"]
        self._keep_best(self.averager.model, epoch, va, averaged=True)
        return {"accepted": accepted, "val": {k: {"per_class": v["per_class"], "avg": v["summary"]["avg"],
                                                  "worst": v["summary"]["worst"]} for k, v in val.items()}}

    def _keep_best(self, model, epoch: int, summary: dict, averaged: bool = False) -> None:
        """Save ``best_<policy>.pt`` for each selection policy under which ``summary`` (validation robust)
        scores a new best (from epoch ``train.select_begin`` on), and ``epoch.pt`` after epoch ``train.select_epoch``
        (``train.select = epoch``); for the averaged model also ``last_avg.pt``."""
        weights = {"epoch": epoch + 1, **EPOCH_NUMBERING, **self._identity(), "model": model.state_dict(),
                   "spec": self.spec, "config": self.cfg.to_toml(),
                   "val_robust": {"avg": summary["avg"], "worst": summary["worst"]}}
        # train.select_begin: earlier epochs are never candidates (CFA's code keeps none before epochs / 2)
        scores = policy_scores(summary) if epoch >= self.cfg.train.select_begin else {}
        for policy, score in scores.items():
            key = policy + ("_avg" if averaged else "")  # as checkpoints' "best" holds them: pgd, ..., pgd_avg, ...
            if score > self.best.get(key, float("-inf")):
                self.best[key] = score
                save_atomic(weights, self.run.best(policy, averaged))
        if self.cfg.train.select == "epoch" and epoch + 1 == self.cfg.train.select_epoch:  # the fixed epoch's weights
            save_atomic(weights, self.run.checkpoint("epoch", averaged))
        if averaged:
            save_atomic(weights, self.run.checkpoint("last", averaged=True))

    def _checkpoint(self, epoch: int, summary: dict) -> None:
        self._keep_best(self.model, epoch, summary)
        save_atomic(self._state(epoch), self.run.last)
        self.run.interrupted.unlink(missing_ok=True)  # the epoch it held part of is whole in last.pt now

    def fit(self) -> Path:
        if self.start_epoch == 0 and not self.within and self.method.needs_initial_validation:
            self.method.before_training(self.state, self.validate())  # FRL: multipliers from the initial model
        with build.fastest_convolutions(self.dev), stopping.deferred(at_once=self._stopped_at_once), \
                cpu.training_convolutions(self.cfg.train.onednn, self.dev, self.cl, self.model, self.log):
            for epoch in range(self.start_epoch, self.cfg.train.epochs):
                self._stop_if_signalled()
                self.run_epoch(epoch)
                self.kept = (epoch + 1, 0, 0)
            self._stop_if_signalled()
        self.tracker.close()
        distributed.barrier()  # the final evaluation on every rank reads rank 0's checkpoints
        return self.out


def _rng_state(dev: torch.device) -> dict:
    """The global random streams a step draws from (attack starts, dropout): the CPU's, and the GPU's on CUDA."""
    return {"cpu": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state(dev)} if dev.type == "cuda" else {})}


def _tracker(cfg: Config, out: Path) -> tracking.Tracker:
    return tracking.open_tracker(cfg.train.track, out, config.flatten(config.tomllib.loads(cfg.to_toml())))


def final_evaluation(out: Path, cfg: Config, quiet: bool = False) -> dict:
    """Evaluate the checkpoint chosen by ``train.select`` with ``eval.attacks``; write and print it, then end
    with :mod:`fastfair.reports.summary`'s lines, on the terminal and in ``train.log``."""
    run = RunDir(out)
    # the run's own test set (data.test_per_class), said in the table's title rather than as an inherited cap
    common = dict(attacks=cfg.eval.attacks, split=cfg.eval.split, device=cfg.train.device, quiet=quiet,
                  per_class=cfg.data.test_per_class or None)
    result = evaluate_checkpoint(run.selected_checkpoint(cfg.train.select), **common)
    averaged = run.selected_checkpoint(cfg.train.select, averaged=True)  # EMA/FAWA model, when one was averaged in
    if averaged.is_file():
        result["average"] = evaluate_checkpoint(averaged, **common)
    if distributed.current().is_main:
        figure = _track_final(out, cfg, result) if cfg.train.track != "none" else None
        said = Progress(enabled=not quiet, log_file=run.train_log)
        said.print("")
        for line in summary.lines(result, result.get("average"), figure):
            said.print(line)
    return result


def _track_final(out: Path, cfg: Config, result: dict) -> Path:
    """The final evaluation to the tracker: its per-class scalars and the per-class figure of every attack
    (returns the figure's path)."""
    tracker, split, classes = _tracker(cfg, out), result["split"], result["classes"]
    step = cfg.train.epochs  # the last epoch's step: the evaluation belongs to the end of training
    tracker.log(tracking.result_scalars(split, result["results"], classes), step)
    png = Path(out) / "figures" / f"{Path(result['checkpoint']).stem}-{split}-per-class.png"
    png.parent.mkdir(exist_ok=True)
    figures.per_class_bars(classes, {n: (r["per_class"], None) for n, r in result["results"].items()},
                           f"{Path(result['checkpoint']).stem} (epoch {result['epoch']}), {split}: per-class accuracy"
                           + (f" ({result['subset']})" if result.get("subset") else ""),
                           png)
    tracker.image(f"{split}/per_class", png, step)
    tracker.close()
    return png
