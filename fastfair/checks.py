"""Every value of a run's config checked before any work starts: ranges and names.

``fastfair train`` and ``fastfair grid`` (for every run, before the first launches) call
:func:`check_config` right after resolving a config, and the Trainer again before it builds
anything; checks that need the data (batch size against the split, the validation split,
label ranges) run where the data is loaded (:mod:`fastfair.data.datasets`, the Trainer).
A rule is a row of :data:`RANGES` or :data:`NAMES`, so a new key gets its check in one line.
"""
from __future__ import annotations

from typing import Any, Callable

from fastfair.attacks.names import parse_attack
from fastfair.attacks.pgd import BN_MODES, OBJECTIVES
from fastfair.data import DATASETS, LOADERS
from fastfair.errors import UserError
from fastfair.evaluation.per_class import check_attack_names
from fastfair.methods import METHODS
from fastfair.models import HEADS, MODELS, NORMS
from fastfair.ops import BACKENDS
from fastfair.ops.steps import INITS
from fastfair.reports.tracking import TRACKERS
from fastfair.suggest import hint
from fastfair.training.averaging import AVERAGING
from fastfair.training.selection import SELECTION

AUTO_ON_OFF = ("auto", "on", "off")


def _within(lo: float, hi: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: lo <= v <= hi), f"within [{lo:g}, {hi:g}]"


def _at_least(lo: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v >= lo), f"at least {lo:g}"


_POSITIVE = ((lambda v: v > 0), "above 0")
_IMAGE_RANGE = ((lambda v: 0 <= v <= 1), "within [0, 1] (images are in [0, 1]: 8/255 is 0.0314)")

# key -> (test, what a good value is); a key whose method does not attack skips attack.*
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "attack.eps": _IMAGE_RANGE, "attack.alpha": _IMAGE_RANGE, "attack.steps": _at_least(1),
    "eval.eps": _IMAGE_RANGE, "eval.alpha": _IMAGE_RANGE, "eval.cw_kappa": _at_least(0),
    "train.epochs": _at_least(1), "train.lr": _POSITIVE, "train.momentum": _within(0, 1),
    "train.weight_decay": _at_least(0), "train.lr_gamma": _POSITIVE,
    "train.lr_milestones": ((lambda v: all(m >= 1 for m in v)), "a list of epochs, each at least 1"),
    "train.progress_every_s": _POSITIVE, "data.train_per_class": _at_least(0), "data.test_per_class": _at_least(0),
    "train.avg_decay": _within(0, 1), "train.avg_threshold": _within(0, 1), "train.avg_begin": _at_least(0),
    "train.select_begin": _at_least(0),
    "data.batch_size": _at_least(1), "data.eval_batch_size": _at_least(1), "data.val_per_class": _at_least(1),
    "data.crop_padding": _at_least(0), "model.width": _at_least(0), "model.head_scale": _POSITIVE,
    "data.classes": ((lambda v: all(c >= 0 for c in v) and len(set(v)) == len(v)),
                     "distinct class indices, each at least 0"),
}

# key -> the names it may take (a registry, or a tuple of words)
NAMES: dict[str, Any] = {
    "data.dataset": DATASETS, "data.loader": LOADERS, "model.name": MODELS, "model.norm": NORMS,
    "model.head": HEADS, "train.averaging": AVERAGING, "train.select": SELECTION,
    "train.kernels": ("auto", *BACKENDS), "attack.objective": OBJECTIVES, "attack.init": INITS,
    "attack.bn_mode": BN_MODES, "train.amp": ("auto", "bf16", "off"), "train.compile": AUTO_ON_OFF,
    "model.channels_last": AUTO_ON_OFF, "train.track": TRACKERS, "eval.split": ("test", "val"),
    "data.order": ("random", "quasi_random", "sequential"), "data.crop_mode": ("zeros", "reflect"),
}


def _value(cfg, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(cfg.sections[section], name)


def check_config(cfg) -> None:
    """Raise a UserError naming the key and a good value for the first value out of range or unknown."""
    method = METHODS.get(cfg.method.name)
    attacks = method.adversarial
    for key, (ok, good) in RANGES.items():
        if key.startswith("attack.") and not attacks:
            continue  # standard training runs no attack: its attack.* keys are unused
        value = _value(cfg, key)
        if not ok(value):
            raise UserError(f"{key}={value!r} is out of range: it must be {good}; fix it with --set {key}=...")
    for key, names in NAMES.items():
        value = _value(cfg, key)
        if value not in names:
            raise UserError(f"{key}={value!r} is not one of {', '.join(sorted(names))}.{hint(str(value), names)}")
    try:
        parse_attack(cfg.train.val_attack)
    except UserError as err:
        raise UserError(f"train.val_attack: {err}") from None
    if (cfg.data.train_per_class or cfg.data.test_per_class) and cfg.data.loader != "device":
        raise UserError(f"data.train_per_class / data.test_per_class (a quick run) need the device loader; "
                        f"data.loader={cfg.data.loader!r} reads whole .beton files. Drop --loader {cfg.data.loader}")
    if cfg.train.select != "last" and cfg.train.select_begin >= cfg.train.epochs:
        raise UserError(f"train.select_begin={cfg.train.select_begin} leaves no epoch of {cfg.train.epochs} to select "
                        f"from (0-based); lower it below train.epochs")
    method.check(cfg)
    if not cfg.eval.attacks:
        raise UserError("eval.attacks is empty; name at least one, for example eval.attacks=['clean', 'pgd20']")
    try:
        check_attack_names(cfg.eval.attacks)
    except UserError as err:
        raise UserError(f"eval.attacks: {err}") from None
