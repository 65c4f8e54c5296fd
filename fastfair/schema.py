"""Config keys declared beside the code that reads them, and the checks every value passes.

A method or option declares its keys as ``{name: Key(default, doc)}``; :func:`section` turns
such a declaration into a dataclass, so a section of the run's config is a plain object with
typed fields (``cfg.ccm.lambda_1``) whatever module declared it. :func:`coerce` checks one
value against a field's type: the one place a bad ``--set`` value becomes a ``UserError``.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping

from fastfair.errors import UserError
from fastfair.suggest import hint, normal

# Which layer set a key (fastfair.config docstring): a value a default or the preset chose that a shorter --epochs
# cuts short is a quick look (a warning), a value the user set is meant (fastfair.checks.check_epochs).
DEFAULTS, PRESET, USER = 0, 1, 2


@dataclass(frozen=True)
class Epochs:
    """What a key naming an epoch starts and how it counts, so :func:`fastfair.checks.check_epochs` can say
    before any work when the run ends before it acts.

    Epochs are numbered from 1, as fastfair prints and writes them. Such a key counts the epochs
    *before* it acts: ``n`` acts from epoch ``n + 1`` on (``first`` says otherwise). A list (milestones)
    holds one such value per step.
    """

    what: str  # what the key starts, as a message names it ("CCM's calibrated eps_k")
    switch: str = ""  # the key that switches ``what`` on; a user who set it meant it, even on a shortened run
    active: Callable[[Any], bool] = lambda cfg: True  # whether ``what`` is on in this run
    first: Callable[[int], float] = lambda n: n + 1  # the epoch in which the value ``n`` first acts (inf: never)
    cut_short: bool = False  # past the end, ``what`` still acts, only not to its end: a warning
    needed: bool = False  # past the end, the run cannot finish: an error, even on a shortened run


def never_at_0(n: int) -> float:
    """``Epochs.first`` of a key whose 0 never fires (a learning-rate milestone, DAFA's warm-up)."""
    return n + 1 if n >= 1 else math.inf


@dataclass(frozen=True)
class Tune:
    """The range ``fastfair tune`` searches a key over (:mod:`fastfair.tuning.space` checks it against the key's type).

    ``scale``: linear | log (a float drawn uniformly, or uniformly in its log) | int (an integer in [low, high]) |
    choice (one of ``choices``). ``source`` names the paper's ablation the range comes from, or says there is none
    and how the range was set around the paper's value.
    """

    low: float | int | None = None
    high: float | int | None = None
    scale: str = "linear"
    choices: tuple = ()
    source: str = ""

    @property
    def span(self) -> str:
        """``log [1, 20]``, ``int [0, 3]``, ``choice [a, b]``."""
        if self.scale == "choice":
            return f"choice [{', '.join(str(v) for v in self.choices)}]"
        return f"{self.scale} [{self.low:g}, {self.high:g}]"


@dataclass(frozen=True)
class Key:
    """One config key: its default, a one-line doc naming its paper, and its type (inferred from a scalar default);
    ``epochs`` when it names an epoch (:class:`Epochs`); ``tune`` when ``fastfair tune`` searches it (:class:`Tune`);
    ``valid``: the rule every value obeys (a :class:`fastfair.rules.Range`), checked wherever a value arrives
    (``--set``, a config file, the Python API: :func:`fastfair.checks.check_config`; a tune range's bounds and
    choices: :func:`fastfair.tuning.space.checked`)."""

    default: Any
    doc: str
    type: Any = None
    epochs: Epochs | None = None
    tune: Tune | None = None
    valid: Any = None

    @property
    def annotation(self) -> Any:
        if self.type is not None:
            return self.type
        if isinstance(self.default, list):
            raise TypeError(f"Key({self.default!r}, {self.doc!r}) needs type=list[...]")
        return type(self.default)


def section(name: str, keys: dict[str, Key]) -> type:
    """A dataclass with one field per key (defaults copied, so list defaults are never shared)."""
    fields = [(k, key.annotation, dataclasses.field(default_factory=lambda d=key.default: copy.deepcopy(d),
                                                     metadata={"doc": key.doc}))
              for k, key in keys.items()]
    return dataclasses.make_dataclass(f"{name.title().replace('-', '').replace('_', '')}Section", fields)


def field_types(section_obj_or_cls) -> dict[str, Any]:
    cls = section_obj_or_cls if isinstance(section_obj_or_cls, type) else type(section_obj_or_cls)
    return dict(_type_hints(cls))


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    # resolving the string annotations is most of resolving a config (85 % of the site's reproduce page, of
    # `fastfair reproduce --list`); a section class never changes once made
    return typing.get_type_hints(cls)


def field_docs(cls) -> dict[str, str]:
    return {f.name: f.metadata.get("doc", "") for f in dataclasses.fields(cls)}


def _list_example(key: str, value: Any, item: Any) -> str:
    """How to type ``key``'s list, made of the words the user gave: a list of strings needs its double quotes, which
    the shell removes unless the whole value is in single quotes."""
    if item is not str:
        return f"Type it as --set {key}=[1,2]"
    words = [w.strip(" '\"") for w in str(value).strip("[] ").split(",") if w.strip(" '\"")] or ["a", "b"]
    listed = ",".join(f'"{w}"' for w in words)
    return f"Strings in a list keep their double quotes inside single quotes: --set {key}='[{listed}]'"


def coerce(key: str, value: Any, typ: Any) -> Any:
    """Check ``value`` against the field type; ints are accepted for floats."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        for t in typing.get_args(typ):
            try:
                return coerce(key, value, t)
            except UserError:
                pass
        raise UserError(f"{key}: {value!r} is not a {typ}")
    if origin is list:
        (item,) = typing.get_args(typ)
        if not isinstance(value, list):
            raise UserError(f"{key} takes a list; got {value!r}. {_list_example(key, value, item)}")
        return [coerce(key, v, item) for v in value]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and not isinstance(value, bool):
        raise UserError(f"{key} takes true or false; got {value!r}")
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UserError(f"{key} takes an integer; got {value!r}")
    if not isinstance(value, typ):
        raise UserError(f"{key} takes a {typ.__name__}; got {value!r}")
    return value


# -- names of keys: a bare key's section, an unknown key's hint ----------------------------------------------
# Both read a config's sections as {section: its key names} (fastfair.config's Config, or the CLI's copy of them in
# fastfair/known.json, so that a mistyped key is refused before torch loads), with the same words either way.

def qualified(fields: Mapping[str, Collection[str]], key: str, synonyms: Mapping[str, str]) -> str:
    """``a.b`` stays; a bare ``b`` is accepted when exactly one section has it (``synonyms``: what other code bases
    call a key, fastfair.config.SYNONYMS)."""
    if "." in key:
        return key
    owners = [s for s, names in fields.items() if key in names]
    other = next((v for k, v in synonyms.items() if normal(k) == normal(key)), None)
    if len(owners) == 1 and other and other != f"{owners[0]}.{key}":  # other code's `key` is another key here (beta)
        raise UserError(f"{key!r} is ambiguous: write {owners[0]}.{key} for that key. Did you mean {other}?")
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    if len(owners) > 1:
        raise UserError(f"{key!r} is ambiguous; write one of {', '.join(f'{s}.{key}' for s in owners)}")
    return key


def unknown_key_hint(fields: Mapping[str, Collection[str]], key: str, method: str,
                     method_keys: Mapping[str, Collection[str]], renamed: Mapping[str, Collection[str]],
                     synonyms: Mapping[str, str]) -> str:
    """What an unknown ``key`` of a config of ``method`` gets after its error: its new name, the methods that have
    it, or a close name (``method_keys``: every method's own keys, in registry order; ``renamed``, ``synonyms``:
    fastfair.config.RENAMED and SYNONYMS)."""
    if key in renamed:
        return f" It was renamed to {' and '.join(renamed[key])}."
    section, _, name = key.partition(".")
    if section == "method":
        owners = [m for m, keys in method_keys.items() if name in keys]
        if owners:
            return (f" Method {method} has no key {name!r} (its keys: {', '.join(method_keys[method]) or 'none'}); "
                    f"methods with it: {', '.join(owners)}.")
    every = [f"{s}.{k}" for s, names in fields.items() for k in names]
    elsewhere = [k for k in every if normal(k.rpartition(".")[2]) == normal(name or section)]
    # the right name in another section or spelling (train.batch_size, batch-size -> data.batch_size), unless a
    # dotted synonym says what the name means in this section (train.eps: Adam's epsilon, not an attack budget)
    if elsewhere and normal(key) not in map(normal, synonyms):
        return f" Did you mean {' or '.join(elsewhere)}?"
    every_method_key = {f"method.{k}" for keys in method_keys.values() for k in keys}
    return hint(key, set(every) | every_method_key, synonyms)
