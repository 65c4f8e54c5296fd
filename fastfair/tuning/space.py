"""Search spaces of ``fastfair tune``: each method's knobs, over the ranges its paper's ablation swept.

A tunable key declares its range beside its default (``Key(..., tune=Tune(...))``, :mod:`fastfair.schema`); a
method none of whose keys is a knob says why (``Method.untuned``). A space maps full keys (``method.kl_weight``,
``ccm.lambda_1``) to :class:`~fastfair.schema.Tune`. A contender is a method and the fairness flags it runs with
(``trades`` + ``ccm``, ``ccr``, ``fawa``): the enabled options' knobs join the method's. A TOML file
(``[space."method.kl_weight"]`` with ``low``, ``high``, ``scale`` or ``choices``) overrides or adds ranges; every
range is checked against its key's type here, before any trial runs.
"""
from __future__ import annotations

import math
import typing
from pathlib import Path
from typing import Any, Sequence

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

from fastfair import schema
from fastfair.checks import RANGES
from fastfair.config import CORE
from fastfair.errors import UserError
from fastfair.methods import METHODS, OPTIONS
from fastfair.rundir import read_toml
from fastfair.schema import Tune
from fastfair.suggest import hint

SCALES = ("linear", "log", "int", "choice")
FIELDS = ("low", "high", "scale", "choices", "source")
# The weight-averaging flags (--ema, --fawa) switch on no option section; what they read are these train keys, which a
# space file may search (CFA sweeps neither decay nor threshold, so they get no default range)
AVERAGING_KEYS = {"ema": ("train.avg_decay",), "fawa": ("train.avg_decay", "train.avg_threshold")}
# the train flags a contender may add after '+', as the config keys they set (fastfair train --ccm ...)
FLAGS = {"ccm": {"ccm.enabled": True}, "ccr": {"ccr.enabled": True}, "ema": {"train.averaging": "ema"},
         "fawa": {"train.averaging": "fawa"}}
FORM = ('a space file holds tables such as [space."method.kl_weight"] low = 1 high = 20 scale = "log" '
        '(or choices = [...])')


class _Readable(typing.NamedTuple):
    tune: Tune | None  # the declared range, None where the key declares none
    type: Any
    valid: Any  # the rule every value obeys (fastfair.checks.valid_range), None for any value of its type
    default: Any  # the value a run of this contender starts from (the method's defaults applied)


def _readable(method: str, options: Sequence[str]) -> dict[str, _Readable]:
    """Every key the method and the enabled options read, by full key."""
    cls = METHODS.get(method)
    types = schema.field_types(cls.section())
    out = {f"method.{k}": _Readable(key.tune, types[k], key.valid, cls.defaults.get(f"method.{k}", key.default))
           for k, key in cls.keys_all().items()}
    # an option the method's own defaults switch on (FAIR-TAT's CCM) is read without its flag
    on = [o for o in OPTIONS if cls.defaults.get(f"{o}.enabled") is True and o not in options]
    for name in [*options, *on]:
        if name in OPTIONS:
            option = OPTIONS.get(name)
            types = schema.field_types(option.section())
            out.update({f"{name}.{k}": _Readable(key.tune, types[k], key.valid,
                                                 cls.defaults.get(f"{name}.{k}", key.default))
                        for k, key in option.keys.items()})
        elif name in AVERAGING_KEYS:
            train, types = CORE["train"](), schema.field_types(CORE["train"])
            out.update({key: _Readable(None, types[key[6:]], RANGES.get(key), getattr(train, key[6:]))
                        for key in AVERAGING_KEYS[name]})
        else:
            raise UserError(f"unknown option {name!r} in the contender {_label(method, options)}."
                            f"{hint(name, _flags())} Options: {', '.join(_flags())}")
    return out


def _flags() -> list[str]:
    return sorted([*OPTIONS, *AVERAGING_KEYS])


def _label(method: str, options: Sequence[str]) -> str:
    return "+".join([method, *options])


def _declared(method: str, options: Sequence[str]) -> dict[str, Tune]:
    """The declared ranges of the method's knobs (:meth:`~fastfair.methods.base.Method.tunes`) and the options'."""
    knobs = {f"method.{k}": tune for k, tune in METHODS.get(method).tunes().items()}
    return {key: knobs[key] if key.startswith("method.") else r.tune for key, r in _readable(method, options).items()
            if (knobs.get(key) if key.startswith("method.") else r.tune) is not None}


def default_space(method: str, options: Sequence[str] = ()) -> dict[str, Tune]:
    """The declared ranges of the method's and the enabled options' knobs; a UserError saying why where none has one."""
    space = _declared(method, options)
    if not space:
        raise UserError(_no_space(method, options))
    return space


def fixed_keys(method: str, options: Sequence[str] = ()) -> list[str]:
    """The keys the contender reads that no declared range searches (the options' ``enabled`` switches left out: the
    contender's flags set them): what makes a paper's run another variant of the method (label smoothing, a code's
    loss normalisation) rather than another point of its space."""
    searched = _declared(method, options)
    return [key for key in _readable(method, options) if key not in searched and not key.endswith(".enabled")]


def _no_space(method: str, options: Sequence[str]) -> str:
    why = METHODS.get(method).why_untuned() or "none of its keys declares a range"
    return (f"{_label(method, options)} has no default search space: {why}; add an option with knobs (+ccm, +ccr) "
            f"or pass --space FILE.toml naming the keys to search")


def load_space(path: str | Path, method: str, options: Sequence[str] = ()) -> dict[str, Tune]:
    """The default space with the ranges of a TOML file over it (a key the file gives only ``high`` keeps its
    default ``low`` and scale); every refusal is one UserError naming the file, the key and the fix."""
    path = Path(path)
    try:
        data = tomllib.loads(read_toml(path))  # a copy fastfair wrote (STUDY/space.toml) has its checksum checked
    except OSError as err:
        raise UserError(f"cannot read the space file {path}: {err.strerror or err}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as err:
        raise UserError(f"{path} is not TOML ({err}); {FORM}") from None
    extra = sorted(set(data) - {"space"})
    if extra or not isinstance(data.get("space", {}), dict):
        raise UserError(f"{path}: unknown table {(extra or ['space'])[0]!r}; {FORM}")
    readable = _readable(method, options)
    space = _declared(method, options)
    for key, entry in data.get("space", {}).items():
        where = f"{path}: {key}"
        if key not in readable:
            raise UserError(f"{where}: {_why_not_read(key, method, options)}")
        if not isinstance(entry, dict):
            raise UserError(f'{where} must be a table: [space."{key}"] low = ... high = ... (or choices = [...])')
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            raise UserError(f"{where}: unknown field {unknown[0]!r}; a range has {', '.join(FIELDS)}")
        if "choices" in entry:
            if not isinstance(entry["choices"], list):
                raise UserError(f"{where}: choices takes a list, for example choices = [1, 2]")
            # low and high kept, so that checked() refuses them beside choices rather than dropping the range
            tune = Tune(entry.get("low"), entry.get("high"), choices=tuple(entry["choices"]),
                        scale=entry.get("scale", "choice"))
        else:
            base = space.get(key) or Tune()
            base = Tune() if base.scale == "choice" else base
            tune = Tune(entry.get("low", base.low), entry.get("high", base.high), entry.get("scale", base.scale))
        source = entry.get("source", f"space file {path}")
        space[key] = checked(where, Tune(tune.low, tune.high, tune.scale, tune.choices, str(source)),
                             readable[key].type, readable[key].valid)
    if not space:
        raise UserError(_no_space(method, options))
    return space


def _why_not_read(key: str, method: str, options: Sequence[str]) -> str:
    """Why a space key is refused: no such key anywhere, or a key this contender does not read."""
    section, _, name = key.partition(".")
    known = ({f"method.{k}" for m in METHODS for k in METHODS.get(m).keys_all()}
             | {f"{o}.{k}" for o in OPTIONS for k in OPTIONS.get(o).keys}
             | {f"{s}.{k}" for s, cls in CORE.items() for k in schema.field_types(cls)})
    reads = ", ".join(sorted(_readable(method, options)))
    if key not in known:
        return (f"unknown key.{hint(key, known)} Name a key as section.key; {_label(method, options)} reads "
                f"{reads}")
    if section in OPTIONS or any(key in keys for keys in AVERAGING_KEYS.values()):
        return (f"{_label(method, options)} does not read it: enable its option (contender "
                f"{_label(method, [*options, _owner(key)])}) or drop the key")
    if section == "method":
        owners = ", ".join(m for m in METHODS if name in METHODS.get(m).keys_all())
        return f"a key of {owners}, which {method} does not read; it reads {reads}"
    return (f"not a knob of {_label(method, options)}: every trial keeps the study's data, model, attack, schedule "
            f"and evaluation (set it with --set); a space names keys it reads: {reads}")


def _owner(key: str) -> str:
    section = key.partition(".")[0]
    return section if section in OPTIONS else next(f for f, keys in AVERAGING_KEYS.items() if key in keys)


def checked(where: str, tune: Tune, typ: Any, valid=None) -> Tune:
    """``tune`` with its bounds in the key's type and, each of them and each choice, within the key's rule ``valid``
    (:func:`fastfair.checks.valid_range`: a trial's value is checked as ``--set`` checks it), or a UserError naming
    the fix (``where``: the file and key)."""
    if tune.scale not in SCALES:
        raise UserError(f"{where}: unknown scale {tune.scale!r}; scale is one of {', '.join(SCALES)}")
    if typing.get_origin(typ) is list:
        raise UserError(f"{where} takes a list, which tune does not search: search one number per key")
    if tune.scale == "choice":
        if tune.low is not None or tune.high is not None:
            raise UserError(f"{where}: give choices = [...] or low and high, not both")
        if len(set(map(repr, tune.choices))) < 2:
            raise UserError(f"{where}: choices needs at least 2 different values; got {list(tune.choices)} "
                            "(to fix a key, --set it on the command)")
        try:
            choices = tuple(schema.coerce(where, v, typ) for v in tune.choices)
        except UserError as err:
            raise UserError(f"{err} (in choices)") from None
        _within(where, [("a choice", v) for v in choices], valid)
        return Tune(choices=choices, scale="choice", source=tune.source)
    if tune.choices:
        raise UserError(f'{where}: choices go with scale = "choice" (or leave scale out)')
    if typ is bool or typ is str:
        raise UserError(f"{where} takes {'true or false' if typ is bool else 'a name'}: search it with choices = [...]")
    bounds = (tune.low, tune.high)
    if any(b is None for b in bounds):
        raise UserError(f"{where}: a {tune.scale} range needs low and high")
    if any(isinstance(b, bool) or not isinstance(b, (int, float)) or not math.isfinite(b) for b in bounds):
        raise UserError(f"{where}: low and high take finite numbers; got {tune.low!r} and {tune.high!r}")
    if typ is int and tune.scale != "int":
        raise UserError(f'{where} takes an integer: use scale = "int" (or choices = [...])')
    if tune.scale == "int" and not all(isinstance(b, int) for b in bounds):
        raise UserError(f'{where}: scale = "int" takes integer bounds; got {tune.low!r} and {tune.high!r}')
    if tune.scale == "int" and typ is not int:
        raise UserError(f'{where} takes a float: use scale = "linear" or "log"')
    if tune.low >= tune.high:
        raise UserError(f"{where}: low {tune.low!r} must be below high {tune.high!r}")
    if tune.scale == "log" and tune.low <= 0:
        raise UserError(f'{where}: scale = "log" needs low > 0; got {tune.low!r} (or use scale = "linear")')
    _within(where, [("low", tune.low), ("high", tune.high)], valid)
    cast = int if typ is int else float
    return Tune(cast(tune.low), cast(tune.high), tune.scale, (), tune.source)


def _within(where: str, named: list[tuple[str, Any]], valid) -> None:
    """Every (name, value) of a range within the key's rule, as each trial's value will be checked: otherwise the
    trials on that side would fail (or worse, train: a negative TRADES weight)."""
    bad = [(what, v) for what, v in named if valid is not None and not valid.ok(v)]
    if bad:
        what, v = bad[0]
        raise UserError(f"{where}: {what} {v!r} is out of the key's range: it must be {valid.good}")


def suggest(trial, space: dict[str, Tune]) -> dict[str, Any]:
    """One value per key, drawn by the Optuna trial under the key's full name."""
    out: dict[str, Any] = {}
    for key, tune in space.items():
        if tune.scale == "choice":
            out[key] = trial.suggest_categorical(key, list(tune.choices))
        elif tune.scale == "int":
            out[key] = trial.suggest_int(key, tune.low, tune.high)
        else:
            out[key] = trial.suggest_float(key, tune.low, tune.high, log=tune.scale == "log")
    return out


def describe(space: dict[str, Tune]) -> list[str]:
    """One line per key: the key, its range and where the range comes from."""
    width = max((len(k) for k in space), default=0)
    spans = {k: t.span for k, t in space.items()}
    span_width = max((len(s) for s in spans.values()), default=0)
    return [f"{key:<{width}}  {spans[key]:<{span_width}}  {tune.source}".rstrip() for key, tune in space.items()]
