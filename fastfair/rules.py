"""The rule a user value obeys and the one message that refuses it: a range, or a set of names.

:mod:`fastfair.checks` holds the table of config keys and their rules; code that takes the same value from
Python (``fastfair.PGD``'s steps and objective, ``fastfair.per_class``'s radii) applies the same rule here, so
``--set attack.steps=0`` and ``fastfair.PGD(steps=0)`` are refused by one test with one message. This module
imports nothing of fastfair's beyond the error and the suggestions, so the attacks can use it without a cycle.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from fastfair import schema
from fastfair.errors import UserError
from fastfair.suggest import hint


@dataclass(frozen=True)
class Range:
    """``ok(value)``: whether a value is good; ``good``: what a good value is, as the message says it."""

    ok: Callable[[Any], bool]
    good: str


def within(lo: float, hi: float, below_hi: bool = False) -> Range:
    """[lo, hi], or [lo, hi) with ``below_hi``."""
    if below_hi:
        return Range(lambda v: lo <= v < hi, f"within [{lo:g}, {hi:g})")
    return Range(lambda v: lo <= v <= hi, f"within [{lo:g}, {hi:g}]")


def each(rule: Range) -> Range:
    """``rule`` for every value of a list (one per class)."""
    return Range(lambda v: all(rule.ok(x) for x in v), f"a list of values, each {rule.good}")


def at_least(lo: float, infinite: bool = False) -> Range:
    """``lo`` or more, and finite unless ``infinite`` says what inf means for the key: ``--set train.lr=inf`` reads
    as a number and would pass ``lr >= lo``, then train nothing but NaN (issue 58)."""
    if infinite:
        return Range(lambda v: v >= lo, f"at least {lo:g}")
    return Range(lambda v: lo <= v < math.inf, f"at least {lo:g} and finite")


ABOVE_0 = Range(lambda v: 0 < v < math.inf, "above 0 and finite")
# a radius or step: one value, or (from Python) one per class
IMAGE_RANGE = Range(lambda v: all(0 <= x <= 1 for x in (v if isinstance(v, list) else [v])),
                    "within [0, 1] (images are in [0, 1]: 8/255 is 0.0314)")


def check_range(key: str, value: Any, rule: Range) -> None:
    if not rule.ok(value):
        raise UserError(f"{key}={value!r} is out of range: it must be {rule.good}")


def check_name(key: str, value: Any, names: Iterable[str]) -> None:
    if value not in names:
        raise UserError(f"{key}={value!r} is not one of {', '.join(sorted(names))}.{hint(str(value), names)}")


def check(key: str, value: Any, typ: Any, rule: Range | Iterable[str] | None = None, per_class: bool = False) -> Any:
    """``value`` read as ``key``'s type ``typ`` (as ``--set`` reads it; with ``per_class``, a list of them is one per
    class), refused unless ``rule`` (a :class:`Range`, or the names it may take) holds; returns the value read."""
    if per_class and isinstance(value, (list, tuple)):
        value = [schema.coerce(key, v, typ) for v in value]
    else:
        value = schema.coerce(key, value, typ)
    if isinstance(rule, Range):
        check_range(key, value, rule)
    elif rule is not None:
        check_name(key, value, rule)
    return value
