"""Every value of a run's config checked before any work starts: ranges and names.

``fastfair train`` and ``fastfair grid`` (for every run, before the first launches) call
:func:`check_config` right after resolving a config, and the Trainer again before it builds
anything; checks that need the data (batch size against the split, the validation split,
label ranges) run where the data is loaded (:mod:`fastfair.data.datasets`,
:func:`fastfair.build.training_splits`, which a grid also runs for every run before the first launches).
A rule is a row of :data:`RANGES` or :data:`NAMES`, so a new key gets its check in one line.

A key that names an epoch says so (:class:`~fastfair.schema.Epochs`: a row of :data:`EPOCHS` for the
core keys, ``Key(..., epochs=...)`` beside a method's or option's), and :func:`check_epochs` checks it
against ``train.epochs``: what it starts would never act in this run is an error naming the fix, or
a warning where a preset's or a default's value is only cut short by a shorter ``--epochs`` (a quick
look); what acts only in part (a milestone past the end) is a warning.
"""
from __future__ import annotations

import math
from typing import Any

from fastfair import build, config, rules, schema
from fastfair.attacks.names import parse_attack
from fastfair.config import value_of
from fastfair.attacks.pgd import BN_MODES, OBJECTIVES, STEPS
from fastfair.data import DATASETS, LOADERS
from fastfair.errors import UserError
from fastfair.evaluation.per_class import check_attack_names, check_substitute
from fastfair.methods import METHODS, OPTIONS
from fastfair.models import HEADS, MODELS, NORMS, uses_norm
from fastfair.ops import BACKENDS
from fastfair.ops.steps import INITS
from fastfair.reports.tracking import TRACKERS
from fastfair.rules import ABOVE_0, IMAGE_RANGE, Range, at_least, within
from fastfair.schema import Epochs, never_at_0
from fastfair.training import optim
from fastfair.training.averaging import AVERAGING
from fastfair.training.selection import SELECTION

AUTO_ON_OFF = ("auto", "on", "off")
_DISTINCT = Range(lambda v: all(c >= 0 for c in v) and len(set(v)) == len(v), "distinct class indices, each at least 0")

# key -> its rule (fastfair.rules); a key whose method does not attack skips attack.*
RANGES: dict[str, Range] = {
    "attack.eps": IMAGE_RANGE, "attack.alpha": IMAGE_RANGE, "attack.steps": STEPS,
    "eval.eps": IMAGE_RANGE, "eval.alpha": IMAGE_RANGE,
    "eval.cw_kappa": at_least(0, infinite=True),  # inf: the CW margin unclamped
    "train.epochs": at_least(1), "train.lr": ABOVE_0, "train.momentum": within(0, 1),
    "train.weight_decay": at_least(0), "train.lr_gamma": ABOVE_0,
    "train.lr_milestones": Range(lambda v: all(m >= 1 for m in v), "a list of epochs, each at least 1"),
    "train.adam_betas": Range(lambda v: len(v) == 2 and all(0 <= b < 1 for b in v),
                              "two values in [0, 1), beta1 and beta2 (Adam's [0.9, 0.999])"),
    "train.adam_eps": ABOVE_0, "train.lr_min": at_least(0), "train.lr_cycle_epochs": at_least(0),
    "train.lr_peak_epoch": at_least(0),
    "train.progress_every_s": ABOVE_0, "data.train_per_class": at_least(0), "data.test_per_class": at_least(0),
    "train.avg_decay": within(0, 1), "train.avg_threshold": within(0, 1), "train.avg_begin": at_least(0),
    "train.select_begin": at_least(0), "train.select_epoch": at_least(0),
    "data.batch_size": at_least(1), "data.eval_batch_size": at_least(1), "data.val_per_class": at_least(1),
    "data.crop_padding": at_least(0), "data.image_size": at_least(16), "data.workers": at_least(0),
    "model.width": at_least(0), "model.feature_dim": at_least(0), "model.head_scale": ABOVE_0,
    "data.classes": _DISTINCT, "data.drop_classes": _DISTINCT,
}

# key -> the names it may take (a registry, or a tuple of words)
NAMES: dict[str, Any] = {
    "data.dataset": DATASETS, "data.loader": LOADERS, "model.name": MODELS, "model.norm": NORMS,
    "model.head": HEADS, "train.averaging": AVERAGING, "train.select": SELECTION,
    "train.kernels": ("auto", *BACKENDS), "attack.objective": OBJECTIVES, "attack.init": INITS,
    "attack.bn_mode": BN_MODES, "train.amp": ("auto", "bf16", "off"), "train.compile": AUTO_ON_OFF,
    "train.cudagraphs": AUTO_ON_OFF, "train.cpp_wrapper": AUTO_ON_OFF, "train.onednn": AUTO_ON_OFF,
    "model.channels_last": AUTO_ON_OFF, "train.track": TRACKERS, "eval.split": ("test", "val"),
    "data.order": ("random", "quasi_random", "sequential"), "data.crop_mode": ("zeros", "reflect"),
    "train.optimizer": optim.OPTIMIZERS, "train.lr_schedule": optim.LR_SCHEDULES, "train.select_split": ("val", "test"),
}


# the core keys that name an epoch (a method's or option's declare it on their Key)
EPOCHS: dict[str, Epochs] = {
    "train.lr_milestones": Epochs("the learning-rate decay", switch="train.lr_schedule", first=never_at_0,
                                  active=lambda cfg: cfg.train.lr_schedule == "step"),
    # 0 (their default) draws them over train.epochs: never past the end
    "train.lr_peak_epoch": Epochs("onecycle's rise to train.lr", switch="train.lr_schedule", first=math.ceil,
                                  active=lambda cfg: cfg.train.lr_schedule == "onecycle", cut_short=True),
    "train.lr_cycle_epochs": Epochs("cyclic's first rise to train.lr", switch="train.lr_schedule",
                                    first=lambda n: math.ceil(n / 2),
                                    active=lambda cfg: cfg.train.lr_schedule == "cyclic", cut_short=True),
    "train.avg_begin": Epochs("EMA/FAWA weight averaging", switch="train.averaging",
                              active=lambda cfg: cfg.train.averaging != "none"),
    "train.select_begin": Epochs("the best_* checkpoints train.select evaluates", switch="train.select",
                                 active=lambda cfg: cfg.train.select not in ("last", "epoch"), needed=True),
    # the model after epoch n (from 1) is kept: n acts in epoch n
    "train.select_epoch": Epochs("the checkpoint train.select = epoch evaluates", switch="train.select",
                                 active=lambda cfg: cfg.train.select == "epoch", first=lambda n: n, needed=True),
}


def valid_range(key: str, method: str) -> Range | None:
    """The rule a value of ``key`` obeys in a run of ``method``: a core key's row of :data:`RANGES`, a method's or an
    option's ``Key(valid=...)`` declared beside its code (None: any value of its type)."""
    section, _, name = key.partition(".")
    if section == "method":
        declared = METHODS.get(method).keys_all().get(name)
    elif section in OPTIONS:
        declared = OPTIONS.get(section).keys.get(name)
    else:
        return RANGES.get(key)
    return declared.valid if declared is not None else None


def check_value(key: str, value: Any) -> Any:
    """A core config key's value given from Python (``fastfair.evaluate(eps=...)``) checked as a config's is: read
    as the key's type, then its row of :data:`RANGES` or :data:`NAMES`, with the same message; eps and alpha
    also take one value per class. Returns the value as the config would hold it."""
    section, _, name = key.partition(".")
    rule = RANGES.get(key) or NAMES.get(key)
    return rules.check(key, value, schema.field_types(config.CORE[section])[name], rule, per_class=rule is IMAGE_RANGE)


def check_config(cfg) -> list[str]:
    """Raise a UserError naming the key and a good value for the first value out of range or unknown;
    return the warnings the run should print (:func:`check_epochs`)."""
    method = METHODS.get(cfg.method.name)
    attacks = method.adversarial
    for key, rule in RANGES.items():
        if key.startswith("attack.") and not attacks:
            continue  # standard training runs no attack: its attack.* keys are unused
        rules.check_range(key, value_of(cfg, key), rule)
    for key, names in NAMES.items():
        rules.check_name(key, value_of(cfg, key), names)
    # the method's keys and every option's (one switched off holds its defaults, in range, unless a value was set)
    declared = [f"method.{k}" for k in method.keys_all()] + [f"{o}.{k}" for o in OPTIONS for k in OPTIONS.get(o).keys]
    for key in declared:
        rule = valid_range(key, cfg.method.name)
        if rule is not None:
            rules.check_range(key, value_of(cfg, key), rule)
    build.check_device_name(cfg.train.device)
    try:
        val = parse_attack(cfg.train.val_attack)
    except UserError as err:
        raise UserError(f"train.val_attack: {err}") from None
    if val.transfer or val.per_class:
        raise UserError(f"train.val_attack={cfg.train.val_attack!r}: validation attacks the model itself on the whole "
                        "validation split; transfer: and NAME/N are for eval.attacks")
    if (cfg.data.train_per_class or cfg.data.test_per_class) and cfg.data.loader == "ffcv":
        raise UserError("data.train_per_class / data.test_per_class (a quick run) need the device or folder loader; "
                        "data.loader='ffcv' reads whole .beton files. Drop --loader ffcv")
    _check_select_epoch(cfg.train)
    unread = _check_schedule(cfg) + _check_select_split(cfg)
    _check_phases(cfg.data)
    method.check(cfg)
    try:
        check_attack_names(cfg.eval.attacks)
    except UserError as err:
        raise UserError(f"eval.attacks: {err}") from None
    check_substitute(cfg.eval.attacks, bool(cfg.eval.substitute), "eval.substitute")
    # the default norm is silent on a model without one; a norm asked for by name that no layer takes is said
    unused = ([f"model.norm={cfg.model.norm} does nothing: {cfg.model.name} has no normalisation layer"]
              if cfg.model.norm != "bn" and not uses_norm(cfg.model.name) else [])
    return unread + method.warnings(cfg) + check_epochs(cfg) + unused


def _check_select_epoch(t) -> None:
    """``train.select = epoch`` names its epoch, and ``train.select_epoch`` goes with that policy alone."""
    if t.select == "epoch" and t.select_epoch < 1:
        raise UserError("train.select=epoch keeps the model after one epoch: name it with train.select_epoch (from 1; "
                        "Tian et al. ICLR keep the 75th: --set train.select_epoch=75)")
    if t.select != "epoch" and t.select_epoch:
        raise UserError(f"train.select_epoch = {t.select_epoch} is read by train.select=epoch only, so it would do "
                        f"nothing with train.select={t.select}; drop it, or set train.select=epoch")


def _check_select_split(cfg) -> list[str]:
    """``train.select_split = test`` scores on the test set, so no validation split is held out: refused with the
    ffcv loader (its validation images are its own .beton file), and a chosen ``data.val_per_class`` is said to do
    nothing."""
    if cfg.train.select_split != "test":
        return []
    if cfg.data.loader == "ffcv":
        raise UserError("train.select_split=test scores checkpoints on the test set, and data.loader=ffcv reads its "
                        "validation images from their own .beton file; use --loader device (or folder)")
    if cfg.layers.get("data.val_per_class", config.DEFAULTS) > config.DEFAULTS:
        return [f"data.val_per_class = {cfg.data.val_per_class} does nothing with train.select_split=test: no "
                "validation split is held out, every training image is trained on"]
    return []


def _check_schedule(cfg) -> list[str]:
    """The optimiser's and the schedule's keys (:func:`_check_unread`); a peak above the low point; the piecewise
    schedule's points: two or more, epochs in order, rates at least 0."""
    warnings, t = _check_unread(cfg), cfg.train
    if t.lr_schedule in ("cosine", "cyclic", "onecycle") and t.lr <= t.lr_min:
        raise UserError(f"train.lr_schedule={t.lr_schedule} runs between train.lr_min = {t.lr_min:g} and its peak "
                        f"train.lr = {t.lr:g}, so it would have no peak; set train.lr above train.lr_min")
    if t.lr_schedule != "piecewise":
        return warnings
    if len(t.lr_epochs) != len(t.lr_values) or len(t.lr_epochs) < 2:
        raise UserError(f"train.lr_epochs and train.lr_values are the points of the piecewise schedule: two or "
                        f"more epochs and as many rates (Wong et al.: [0, 1, 6] and [0, 0.4, 0.04]); got "
                        f"{t.lr_epochs} and {t.lr_values}")
    if any(b < a for a, b in zip(t.lr_epochs, t.lr_epochs[1:])) or min(t.lr_epochs) < 0 or min(t.lr_values) < 0:
        raise UserError(f"train.lr_epochs must be epochs from 0 in increasing order and train.lr_values rates at "
                        f"least 0; got {t.lr_epochs} and {t.lr_values}")
    return warnings


def _check_unread(cfg) -> list[str]:
    """A train key set beside an optimiser or schedule that does not read it (:data:`optim.READ_BY`) would do
    nothing. An error where it was chosen as late as the choice (``--set train.optimizer=adam --set
    train.momentum=0.8``, points without ``train.lr_schedule=piecewise``); a warning where a later layer chose
    around it (a preset's milestones under ``--set train.lr_schedule=cosine``), a method's default set it, or one
    preset set both: a saved run resumes with all its keys as a preset's, and a run warned when it started must
    resume."""
    refused, warned = [], {}
    for key, choice in optim.unread(cfg.train):
        said, chosen = f"train.{key} = {getattr(cfg.train, key)}", f"train.{choice}={getattr(cfg.train, choice)}"
        by = cfg.layers.get(f"train.{key}", config.DEFAULTS)
        choice_by = cfg.layers.get(f"train.{choice}", config.DEFAULTS)
        if by > config.DEFAULTS and by >= choice_by and not by == choice_by == config.PRESET:
            readers = optim.READ_BY[key][1]
            refused.append(f"{said} is read by train.{choice}={' or '.join(readers)} only, so it would do nothing "
                           f"with {chosen}; drop it, or set train.{choice}={readers[0]}")
        else:
            warned.setdefault(chosen, []).append(f"{said} ({_LAYERS[by]}'s)")
    if refused:
        raise UserError("; ".join(refused))
    return [f"{chosen} does not read {_and(said)}: {'it does' if len(said) == 1 else 'they do'} nothing in this run"
            for chosen, said in warned.items()]


def _check_phases(d) -> None:
    """data.phase_*: as many sizes and batch sizes as phases, the first from epoch 0, the folder loader."""
    lists = (d.phase_epochs, d.phase_image_sizes, d.phase_batch_sizes)
    if not any(lists):
        return
    if d.loader != "folder":
        raise UserError(f"data.phase_* (resolution phases) need the folder loader (the imagenet data set); "
                        f"data.loader={d.loader!r} keeps one image size")
    if len(set(map(len, lists))) > 1 or d.phase_epochs[:1] != [0]:
        raise UserError(f"data.phase_epochs, data.phase_image_sizes and data.phase_batch_sizes give one value per "
                        f"phase, the first phase from epoch 0 (Wong et al.: [0, 6, 12], [128, 224, 288], "
                        f"[512, 224, 128]); got {d.phase_epochs}, {d.phase_image_sizes}, {d.phase_batch_sizes}")
    if any(b <= a for a, b in zip(d.phase_epochs, d.phase_epochs[1:])) or min(d.phase_image_sizes) < 16 \
            or min(d.phase_batch_sizes) < 1:
        raise UserError(f"data.phase_epochs must increase, data.phase_image_sizes be at least 16 and "
                        f"data.phase_batch_sizes at least 1; got {d.phase_epochs}, {d.phase_image_sizes}, "
                        f"{d.phase_batch_sizes}")


def epoch_keys(cfg=None) -> dict[str, Epochs]:
    """The keys naming an epoch: the core ones, the run's method's and its enabled options' (every method's and
    option's without ``cfg``)."""
    methods = [METHODS.get(cfg.method.name)] if cfg else [METHODS.get(m) for m in METHODS]
    options = cfg.enabled_options() if cfg else list(OPTIONS)
    keys = dict(EPOCHS)
    for method in methods:
        keys.update({f"method.{k}": key.epochs for k, key in method.keys_all().items() if key.epochs})
    for name in options:
        keys.update({f"{name}.{k}": key.epochs for k, key in OPTIONS.get(name).keys.items() if key.epochs})
    return keys


def check_epochs(cfg) -> list[str]:
    """Raise one UserError naming every key whose epoch lies past ``train.epochs`` so that what it starts would
    never act, unless nobody meant it (:func:`_meant`: a default, or a quick look); return the warnings: those,
    and what acts only in part (a milestone past the end, a schedule cut short)."""
    epochs, warnings, never = cfg.train.epochs, [], []
    for key, use in epoch_keys(cfg).items():
        value = value_of(cfg, key)
        values = value if isinstance(value, list) else [value]
        past = [n for n in values if use.first(n) > epochs]
        if not use.active(cfg) or not past:
            continue
        first = min(use.first(n) for n in past)
        if len(past) < len(values):
            warnings.append(f"{key} = {value}: {', '.join(map(str, past))} {'is' if len(past) == 1 else 'are'} past "
                            f"train.epochs = {epochs}, so this run leaves out {use.what} there")
        elif use.cut_short:
            warnings.append(f"{key} = {value} is past train.epochs = {epochs}: {use.what} would end in epoch {first}, "
                            f"so this run stops it part-way")
        else:
            good = last_acting(use, epochs)
            setting = None if good is None else f"--set {key}={[good] if isinstance(value, list) else good}"
            said = f"{key} = {value} ({use.what} from epoch {first})"
            if use.needed or _meant(cfg, key, use):
                never.append((said, setting, first))
            else:
                by = cfg.layers.get("train.epochs", config.DEFAULTS)
                cut = (f", cut short by train.epochs from {_LAYERS[by]}"
                       if by > config.DEFAULTS and not _saved(cfg, "train.epochs") else "")
                warnings.append(f"{said} is past train.epochs = {epochs}, so this run goes without it "
                                f"({_whose(cfg, key, use)}'s value{cut}; to see it act: "
                                f"{setting or 'more epochs'})")
    if epochs == 1:  # what only the end of an epoch sets acts from epoch 2 on
        parts = [METHODS.get(cfg.method.name), *(OPTIONS.get(n) for n in cfg.enabled_options())]
        warnings += [f"{what}: set at the end of each epoch, they act from epoch 2 on, so this one-epoch run trains "
                     "without them (--epochs 2 or more to see them act)"
                     for what in (part.epoch_update(cfg) for part in parts) if what]
    if never:
        one = len(never) == 1
        more = max(first for _, _, first in never)
        fix = f"train for {more} epochs or more (--epochs {more})"
        settings = [setting for _, setting, _ in never if setting]
        if len(settings) == len(never):
            fix = f"set {' '.join(settings)} (or lower), or {fix}"
        raise UserError(f"{_and(said for said, _, _ in never)} {'is' if one else 'are'} past train.epochs = {epochs}, "
                        f"so this run would go without {'it' if one else 'them'}; {fix}")
    return warnings


def last_acting(use: Epochs, epochs: int) -> int | None:
    """The largest value of a key that still acts within ``epochs`` (None when none does)."""
    return next((n for n in range(epochs, -1, -1) if use.first(n) <= epochs), None)


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


_LAYERS = {config.DEFAULTS: "a default", config.PRESET: "the preset", config.USER: "the command line"}


def _chosen(cfg, key: str, use: Epochs) -> int:
    """The layer that chose the key's value or switched on what it starts, whichever came later."""
    return max(cfg.layers.get(key, config.DEFAULTS), cfg.layers.get(use.switch, config.DEFAULTS))


def _meant(cfg, key: str, use: Epochs) -> bool:
    """Whether the preset or the user chose the key or its switch with ``train.epochs`` already known (in the
    same layer or a later one): then a value the run never reaches is a mistake. Otherwise a default, or a
    preset's value that a shorter ``--epochs`` cuts short (a quick look: ``--config cfa-... --epochs 3``), or
    a resumed run's saved values, which its start checked (``--resume`` continues what it accepted)."""
    if _saved(cfg, key, use) and _saved(cfg, "train.epochs"):
        return False
    chosen = _chosen(cfg, key, use)
    return chosen > config.DEFAULTS and chosen >= cfg.layers.get("train.epochs", config.DEFAULTS)


def _saved(cfg, key: str, use: Epochs | None = None) -> bool:
    """Whether the key (and its switch) hold a resumed run's saved values, which this command did not change."""
    return all(cfg.origins.get(k) == config.SAVED for k in (key, use.switch if use else "") if k)


def _whose(cfg, key: str, use: Epochs | None = None) -> str:
    """Who chose the key (and its switch), as a warning names it: a layer, or the saved run a resume continues."""
    if _saved(cfg, key, use):
        return "the saved run"
    return _LAYERS[_chosen(cfg, key, use) if use else cfg.layers.get(key, config.DEFAULTS)]
