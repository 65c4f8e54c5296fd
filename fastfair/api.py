"""fastfair from Python: per-class evaluation of any model, and training by preset, as the CLI does them.

:func:`evaluate` runs the attacks of ``fastfair eval`` on any ``nn.Module`` mapping images in [0, 1] to
logits (the convention of torchattacks and RobustBench), with the same seeds, fingerprints and JSON;
:func:`train` is ``fastfair train`` (same config layering, checks and run folder), and the CLI calls it.
"""
from __future__ import annotations

import contextlib
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

from fastfair import build, config as configs, stopping
from fastfair.checks import check_config, check_value
from fastfair.data.datasets import check_labels
from fastfair.errors import Interrupted, UserError, WriteError
from fastfair.evaluation import per_class, per_image
from fastfair.evaluation.result import Result
from fastfair.methods import METHODS
from fastfair.preset_files import preset_names
from fastfair.progress import Progress, note_in_log
from fastfair.rundir import RunDir, instead_of_model_flag
from fastfair.scaleout import distributed
from fastfair.known import flag_keys, said_as
from fastfair.suggest import hint


# ---- evaluation -------------------------------------------------------------------------------

class _Batches:
    """(x, y) float batches of a split held as tensors, on the model's device, in order."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, batch_size: int, device: torch.device):
        self.x, self.y, self.batch_size, self.device = x, y, batch_size, device

    def __len__(self) -> int:
        return -(-len(self.y) // self.batch_size)

    def __iter__(self):
        for i in range(0, len(self.y), self.batch_size):
            yield self.x[i:i + self.batch_size].to(self.device), self.y[i:i + self.batch_size].to(self.device)


def _tensors(data) -> tuple[torch.Tensor, torch.Tensor]:
    """(images, labels) on the CPU from a pair of tensors or from an iterable of (x, y) batches (a DataLoader);
    the labels as given, checked once the model's classes are known."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
    else:
        try:
            xs, ys = zip(*[(bx, by) for bx, by in data])
            x, y = torch.cat([t.detach().cpu() for t in xs]), torch.cat([t.detach().cpu() for t in ys])
        except (TypeError, ValueError):
            raise UserError("data must be (images, labels) tensors or an iterable of (images, labels) batches, such "
                            "as a DataLoader") from None
    x, y = x.detach().cpu(), y.detach().cpu()
    if not x.is_floating_point() or x.dim() != 4:
        raise UserError(f"images must be a float tensor (N, C, H, W) in [0, 1]; got {x.dtype} of shape "
                        f"{tuple(x.shape)}")
    if len(x) == 0:
        raise UserError("no images to evaluate")
    nonfinite = (~torch.isfinite(x.flatten(1))).any(1)
    if nonfinite.any():  # NaN compares False with any bound, so the range below would pass it
        first = nonfinite.nonzero().flatten()[:5].tolist()
        raise UserError(f"{int(nonfinite.sum())} of {len(x)} images hold NaN or inf pixels (first indices {first}); "
                        "images must be finite and in [0, 1]. Fix or drop these images")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0 or hi > 1:
        raise UserError(f"images must be in [0, 1] (eps is measured there); these span [{lo:.3g}, {hi:.3g}]. Put "
                        "the normalisation inside the model, as RobustBench's and fastfair's models do")
    return x.float(), y


def _outputs(model: torch.nn.Module, x: torch.Tensor, device: torch.device) -> int:
    with torch.no_grad():
        logits = model(x[:1].to(device))
    if logits.dim() != 2:
        raise UserError(f"the model must return logits of shape (N, classes); it returned {tuple(logits.shape)}")
    return logits.shape[1]


# keyword -> the config key of fastfair eval it is (fastfair eval reads them from the run's config or its flags):
# each value is checked by that key's rule, with the CLI's message (fastfair.checks.check_value)
EVALUATE_KEYS = {"eps": "eval.eps", "alpha": "eval.alpha", "cw_kappa": "eval.cw_kappa", "seed": "eval.seed",
                 "clip_start": "eval.clip_start", "batch_size": "data.eval_batch_size"}


# a stop signal during an evaluation: Interrupted, as train raises it (AutoAttack's progress is written whole)
@stopping.says("this evaluation returned no result; with out=, AutoAttack's per-image progress is kept beside it and "
               "the same call resumes it")
def evaluate(model: torch.nn.Module | str | Path, data, *, attacks: str | Sequence[str] = ("clean", "pgd20", "cw20"),
             eps: float | Sequence[float] | None = None, alpha: float | Sequence[float] = 2 / 255,
             classes: Sequence[str] | None = None, batch_size: int = 256, seed: int = 0, bf16: bool = False,
             aa_backend: str = "auto", cw_kappa: float = 50.0, clip_start: bool = True,
             out: str | Path | None = None, source: dict | None = None, progress: bool = True,
             substitute: torch.nn.Module | str | Path | None = None) -> Result:
    """Per-class accuracy of ``model`` (images in [0, 1] -> logits) under each attack, as ``fastfair eval``.

    ``attacks``: names as ``fastfair eval --attacks`` takes them (clean, fgsm, pgdK, pgdKxR, cwK, tpgdK@tT,
    tpgdK@grid, cwinf, nattack, transfer:NAME, NAME/N, corrupt:NAME@S, aa), a list or one comma-separated string.
    ``eps``/``alpha``: one radius/step or one per class, in [0, 1] as images are (8/255, not 8): the config's
    eval.eps and eval.alpha, refused as ``fastfair train --set eval.eps=8`` is (:data:`EVALUATE_KEYS`), and ``eps``
    as ``fastfair eval --eps`` (one per class of the model, not with aa, some attack reading it); None: eval.eps's
    default, 8/255.
    ``data``: (x, y) tensors, x float (N, C, H, W) in [0, 1] and y integer labels, or an iterable of batches.
    ``out``: a JSON path; an earlier file of the same weights, data and settings keeps its other attacks, another
    is moved to ``previous/`` beside it. ``source``: what to record about where the model came from.
    ``progress``: what ``fastfair eval`` shows (a bar on a terminal, a line every 30 s elsewhere, AutoAttack's
    sub-attacks as they end); False for none. The model's train/eval mode is restored.
    ``substitute``: the model (or a fastfair run folder / checkpoint) ``transfer:NAME`` attacks are made on.
    ``model`` may also be a fastfair run folder or checkpoint file, as ``fastfair eval`` takes (on CUDA where there
    is one). A stop signal (Ctrl-C, SIGTERM, SIGUSR1) raises :class:`~fastfair.errors.Interrupted`, as train does."""

    wanted = per_class.attack_names(attacks)
    per_class.check_substitute(wanted, substitute is not None)
    aa_backend = per_class.aa_backend_for(wanted, aa_backend)
    given = {"eps": configs.EvalConfig.eps if eps is None else eps, "alpha": alpha, "cw_kappa": cw_kappa, "seed": seed,
             "clip_start": clip_start, "batch_size": batch_size}
    radius = eps
    eps, alpha, cw_kappa, seed, clip_start, batch_size = (check_value(EVALUATE_KEYS[k], v) for k, v in given.items())
    if radius is not None:  # as fastfair eval --eps: its count once the model's classes are known
        radius = per_class.check_eps(eps, wanted, None, "eps")
    x, y = _tensors(data)
    model = _model(model)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    training = model.training
    try:
        model.eval()
        c = _outputs(model, x, device)
        classes = [str(i) for i in range(c)] if classes is None else [str(n) for n in classes]
        if len(classes) != c:
            raise UserError(f"{len(classes)} class names for a model with {c} outputs")
        if radius is not None:  # one per class of this model's
            per_class.check_eps(radius, wanted, c, "eps")
        check_labels("y", y.numpy(), len(x), c)
        y = y.long()
        if substitute is not None and not isinstance(substitute, torch.nn.Module):
            substitute = build.substitute_model(substitute, device, model, x[:1].to(device))[0]
        elif substitute is not None:
            sub_c = _outputs(substitute, x, device)
            if sub_c != c:
                raise UserError(f"the substitute has {sub_c} outputs and the model {c}; give one trained on the same "
                                "classes")
        settings = per_class.settings_of(eps=eps, alpha=alpha, cw_kappa=cw_kappa, amp=bf16, seed=seed,
                                         clip_start=clip_start, substitute=substitute)
        fp = per_class.fingerprint(model, (x, y), settings)
        out = Path(out) if out is not None else None
        batches = _Batches(x, y, batch_size, device)
        prog = Progress(enabled=progress)
        with prog.task(f"eval {','.join(wanted)}", len(batches) * per_class.progress_units(wanted, c),
                       unit="pass") as advance:
            results = per_class.evaluate(model, batches, wanted, eps=settings["eps"], alpha=settings["alpha"],
                                         classes=classes, cw_kappa=cw_kappa,
                                         amp_dtype=torch.bfloat16 if bf16 else None, progress=advance,
                                         state_prefix=out.with_suffix("") if out else None, aa_backend=aa_backend,
                                         seed=seed, log=prog.print, clip_start=clip_start, substitute=substitute)
        results = per_image.with_intervals(results)
    finally:
        model.train(training)
    record = {"model": type(model).__name__, **({"source": source} if source else {}), "classes": classes,
              "images": len(y), **per_class.absent_record(results, classes), **settings, "fingerprint": fp,
              "intervals": per_image.METHOD}
    if out is None:
        record["results"] = results
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        per_class.write_record(record, results, out, lambda tag: out.parent / "previous" / f"{out.stem}-{tag}.json")
        record["path"] = str(out)
    return Result(record)


def _model(model) -> torch.nn.Module:
    """The module :func:`evaluate` was given, or the model of the fastfair run or checkpoint it names."""
    if isinstance(model, torch.nn.Module):
        return model
    if isinstance(model, (str, Path)):
        with instead_of_model_flag("for a model file fastfair did not write, build its nn.Module, load the weights "
                                   "and pass the module"):
            return build.checkpoint_model(model, build.device_named("auto"))[0]
    raise UserError(f"model must be a torch.nn.Module mapping images in [0, 1] to logits, or the path of a fastfair "
                    f"run or checkpoint; got {type(model).__name__}")


@stopping.says("nothing was loaded; call it again")
def load_result(path: str | Path) -> Result:
    """A result JSON written by ``fastfair eval`` or :func:`evaluate` (``RUN/eval/*.json``)."""
    return Result.load(path)


# ---- a method in your own training loop ----------------------------------------------------------

@stopping.says("no method was made; call it again")
def method(name: str, *, num_classes: int, dataset: str = "cifar10", device: str | torch.device = "cpu",
           config: str | None = None, sets: dict[str, Any] | None = None, train_counts=None):
    """(a training method resolved as ``fastfair train`` would, its per-class state) for a loop of your own.

    Per step: ``x_adv = m.perturb(model, x, y, state)``, then ``loss, logits = m.objective(model, x, x_adv, y,
    state)`` (per-class weights applied); ``state["eps"]`` etc. are the per-class vectors (docs/api.md).
    ``train_counts``: images per class of your training set, which class_balanced and ldam read."""

    from fastfair.training import teacher
    from fastfair.training.class_state import ClassState

    cfg = configs.resolve(config, {"method.name": name, "data.dataset": dataset}, sets or {})
    check_config(cfg)  # the values train would refuse (its epoch warnings do not apply to your loop)
    dev = device if isinstance(device, torch.device) else build.device_named(device)  # as --device is read
    m = METHODS.get(cfg.method.name)(cfg)
    state = ClassState(num_classes, dev, train_counts=train_counts)
    teacher.attach(m, num_classes, dev)  # a distilling method's teacher (method.teacher)
    m.setup(state)
    return m, state


# ---- training -----------------------------------------------------------------------------------

def train(config: str | None = None, *, out: str | Path | None = None, resume: bool = False, progress: bool = True,
          sets: dict[str, Any] | None = None, **flags: Any) -> Path:
    """``fastfair train`` from Python; returns the run directory.

    ``config``: a preset name or TOML file; ``flags``: the long flags of ``fastfair train`` by their Python
    names (``method="me-trades", epochs=2, quick=20``); ``sets``: any config key, ``{"train.lr": 0.05}``.
    ``progress``: what ``fastfair train`` shows (progress, epoch lines, the per-class table); False is its
    ``--quiet``."""
    keys = flag_keys(**flags)
    return run_training(config, keys, sets or {}, out, resume=resume, quiet=not progress,
                        flag_names=said_as(keys, cli=False), cli=False)


def run_training(preset: str | None, flags: dict[str, Any], sets: list[str] | dict[str, Any],
                 out: str | Path | None, *, resume: bool, quiet: bool,
                 flag_names: dict[str, str] | None = None, cli: bool = True) -> Path:
    """Resolve and check the config, then train and evaluate in ``out``; the one path of the CLI and of Python.
    ``flag_names``: how each key of ``flags`` was given (:func:`said_as`); ``cli``: whether from the command line
    (a message then names flags, else keywords)."""
    if preset and preset in METHODS and not _is_preset(preset):
        method = f"--method {preset}" if cli else f"method={preset!r}".replace("'", '"')
        raise UserError(f"{preset!r} is a training method, not a preset or config file: did you mean {method}? "
                        "(presets: fastfair presets)")

    saved = RunDir(out).config if out else None
    if resume:
        if not saved or not saved.is_file():
            raise UserError("--resume needs --out RUN_DIR of an earlier run (it holds config.toml and checkpoints/)")
        # flags and --set go over the saved config; the Trainer refuses changes outside config.RESUMABLE
        cfg = configs.resolve(preset, flags, sets, base=configs.load_saved(saved), flag_names=flag_names)
    else:
        cfg = configs.resolve(preset, flags, sets, flag_names=flag_names)
    check_config(cfg)  # before the run folder is made
    run = Path(out or f"runs/{cfg.method.name}-{cfg.data.dataset}")
    fit(cfg, run, resume, quiet)
    return run


def _is_preset(name: str) -> bool:
    """Whether ``name`` is a TOML file or a shipped preset (``fastfair presets``)."""
    return Path(name).is_file() or name.removesuffix(".toml") in preset_names()


def fit(cfg, out: Path, resume: bool, quiet: bool) -> None:
    """Train under the run folder's lock, then evaluate; a stop signal (Ctrl-C, SIGTERM, SIGUSR1) saves at a step
    boundary, releases the lock and says in one line what was kept and how to go on."""
    # imported here, not above: a command refused while its config resolves need not load the trainer (seconds)
    from fastfair.training.trainer import Trainer, final_evaluation

    trainer = None
    training, complete = True, False
    try:
        with stopping.handled():  # Python callers too; under the CLI its handler is in place already
            distributed.init(cfg)  # under torchrun: join the process group (fastfair/distributed.py)
            # one writer per run folder; torchrun's other ranks write nothing
            with RunDir(out).lock() if distributed.current().is_main else contextlib.nullcontext():
                trainer = Trainer(cfg, out, resume=resume, quiet=quiet)
                trainer.fit()
                training = False
                final_evaluation(out, cfg, quiet=quiet)
                complete = True
                distributed.say_complete()
            # torchrun: no rank leaves the process group (finally: shutdown) while rank 0 still writes the results
            distributed.barrier()
    except WriteError as err:  # the run is as it was before the write: whole files, resumable once it has a config
        if not RunDir(out).config.is_file():
            raise
        said = err.continue_with(distributed.command(f"train --out {out} --resume"))
        if distributed.current().is_main:  # the run's log tells how it ended, as the console did
            with contextlib.suppress(WriteError):  # the disk may have no room for the line either
                note_in_log(RunDir(out).train_log, f"fastfair: error: {said}")
        raise said from None
    except KeyboardInterrupt as err:
        signum = stopping.signum_of(err)
        if complete:  # the run and its final result are whole: the signal stopped nothing (issue 58, item 9)
            if distributed.current().is_main:
                name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
                print(f"fastfair: {name} came after the run was complete (its final result is written); nothing was "
                      "stopped", file=sys.stderr)
            return
        said = _stopped_line(out, cfg, trainer.kept if trainer else None, training, stopping.said_by(signum))
        main = distributed.current().is_main
        if main:  # the run's log tells how it ended, as the console did
            note_in_log(RunDir(out).train_log, f"fastfair: {said}")
        raise Interrupted(said if main else "", signum) from None
    finally:
        trainer = None  # it holds the DDP wrapper, and that the process group: let shutdown free both
        distributed.shutdown()


def _stopped_line(out: Path, cfg, kept: tuple[int, int, int] | None, training: bool, by: str) -> str:
    """What a stopped run kept and how to go on; ``kept`` (epochs, steps of the next, its steps) as the trainer
    saved them, None when it stopped before training began."""
    # plain torchrun's launcher, stopped too, then prints a traceback (SIGTERM to it) or a failure report (to a
    # rank) and exits 1, whatever its ranks do (docs/reliability.md): said here, so it is not taken for a crash;
    # fastfair-torchrun ends in this line alone
    plain = distributed.under_torchrun() and distributed.launcher() == "torchrun"
    launcher = ("torchrun's own report after this line (exit code 1) is how it ends on a signal (fastfair-torchrun "
                "ends here); " if plain else "")
    if not training:
        return (f"interrupted{by} during the final evaluation; training is complete; {launcher}evaluate with: "
                f"fastfair eval {out}")
    epochs, step, steps = kept or (_epochs_saved(out), 0, 0)
    go_on = f"{launcher}continue with: {distributed.command(f'train --out {out} --resume')}"
    if epochs >= cfg.train.epochs:
        return f"interrupted{by} after the last epoch ({epochs} saved; the final evaluation is left); {go_on}"
    saved = str(epochs)  # epochs, as the Ctrl-C line has always said
    if step:  # and the steps of the next, stopped at a step boundary
        saved = (f"{epochs} epoch{'s' * (epochs != 1)} and " if epochs else "") + f"{step} of {steps} steps"
    return f"interrupted{by} in epoch {epochs + 1} of {cfg.train.epochs} ({saved} saved); {go_on}"


def _epochs_saved(out: Path) -> int:
    try:
        return len(RunDir(out).read_metrics())
    except (UserError, OSError):  # a torn last line: resume repairs it
        return 0


# ---- tuning ----------------------------------------------------------------------------------------

TUNE_OPTIONS = ("out", "data_dir", "sets", "quick", "trials", "epochs_budget", "time_budget", "space", "storage",
                "seed", "rule", "at_avg", "workers", "gpus", "prune_after", "prune")


@stopping.says("the study's trial stopped with it and resumes in its run folder; call it again to go on")
def tune(methods: str | Sequence[str] | None = None, *, study: str | Path | None = None, config: str | None = None,
         progress: bool = True, **options: Any) -> Path:
    """``fastfair tune`` from Python (docs/tune.md): make (``methods``) or continue (``study``) a study, work its
    trials, evaluate the final fronts on the test set once and write the comparison; returns the study folder.

    ``methods``: contenders, ``"trades,trades+ccm+ccr+fawa"`` or a list; ``options``: the long options of
    ``fastfair tune`` by their Python names (``trials=8, data_dir=..., sets=["train.epochs=5"], workers=2``).
    ``progress``: a line per trial (False is ``--quiet``)."""
    unknown = [k for k in options if k not in TUNE_OPTIONS]
    if unknown:
        raise UserError(f"fastfair.tune() has no option {unknown[0]!r}.{hint(unknown[0], TUNE_OPTIONS)} Options: "
                        f"{', '.join(TUNE_OPTIONS)}")
    from fastfair.tuning import study as studies

    if methods is not None and not isinstance(methods, str):
        methods = ",".join(methods)
    return studies.tune(None if study is None else str(study), methods=methods, config_name=config,
                        quiet=not progress, **options)
