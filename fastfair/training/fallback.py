"""A fast way of running the training step, trusted only once it agreed with the plain way.

:class:`TwoWay` is a compiler whose functions each hold two compilations of themselves (the fast one, e.g. with
CUDA graphs, and the plain one) and run whichever is switched on, all together. :class:`CheckedStep` runs the
first :data:`CHECKS` steps at each batch shape both ways from the same state and random-number state: the plain
step first, then the fast one. Where the fast one raises (its compilation or recording failed), runs out of
memory, or its result is more than :data:`TOLERANCE` away from the plain one's, the run keeps the plain step's
result, says once why, and runs the plain way from then on. Otherwise the fast step's result stands, exactly what
an unchecked fast step would have left, so the check changes nothing the run computes; after it a step costs one
lookup of its batch shape (no host sync). Neither class knows how the fast way is made: the tests force every
failure on a CPU with a fast compiler that raises or returns wrong values.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

# Steps checked per batch shape: Inductor's CUDA graph trees run a region's first call without a graph (warm-up),
# record it on the second and replay from the third, so the third check is the first replay. A new batch shape
# (a resolution phase, the last batch of a loader without drop_last) compiles and records anew: checked again.
CHECKS = 3

# Per tensor the step changes (weights, BN statistics, momentum, per-class counters, random-number state):
# |fast - plain| / |plain - before| (L2 norms), at most TOLERANCE. The two ways run the same compiled kernels, so
# in exact arithmetic they agree bit for bit. What separates them on a GPU: cuDNN's and cuBLAS's nondeterministic
# reductions (atomics and split sums in weight gradients) change the last bits of fp32 sums, which bf16 autocast
# (8 significant bits) turns into whole ulps where a value sits near a rounding tie; the attack's sign steps then
# move every pixel whose input gradient lies within that noise of 0 by 2 alpha the other way, and the weight
# gradient follows those pixels. A far larger perturbation, bf16 against fp32 for the whole step, moves the
# update by 0.13 of itself after three steps on a CPU (tests/test_compiled_step.py, bound 0.25 there too). What
# the check is for, a graph that replays stale inputs, skips an update or reads freed memory, is off by the whole
# change (1 or more) or not finite. The momentum buffer's change is the step's gradient (less a tenth of the old
# momentum), so a wrong gradient shows at full size there even where momentum dominates the weights' change.
TOLERANCE = 0.25


class TwoWay:
    """A compiler (``fn -> compiled fn``) whose functions run ``fast(fn)`` or ``plain(fn)``, as :attr:`fast_on` says."""

    def __init__(self, fast: Callable[[Callable], Callable], plain: Callable[[Callable], Callable]):
        self.fast, self.plain = fast, plain
        self.fast_on = True

    def __call__(self, fn: Callable) -> Callable:
        ways = self.fast(fn), self.plain(fn)

        def run(*args, **kwargs):
            return ways[0 if self.fast_on else 1](*args, **kwargs)

        return run


class CheckedStep:
    """``step(x, y)`` (the whole training step: attack, loss, optimiser step, counters) run through ``ways``, its
    first :data:`CHECKS` calls per batch shape checked (module docstring).

    ``save()`` returns a copy of everything a step changes (nested dicts and lists of tensors and numbers, random-
    number state included) and ``load(saved)`` puts a copy of it back (``saved`` stays as it was: it is compared
    after the next step); ``say(problem)`` tells the user, once, why the run left the fast way."""

    def __init__(self, step: Callable, ways: TwoWay, save: Callable[[], Any], load: Callable[[Any], None],
                 say: Callable[[str], None], checks: int = CHECKS, tolerance: float = TOLERANCE):
        self.step, self.ways, self.save, self.load, self.say = step, ways, save, load, say
        self.checks, self.tolerance = checks, tolerance
        self.checked: dict[tuple, int] = {}  # batch shape and dtype -> steps checked

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        shape = (tuple(x.shape), x.dtype)
        if not self.ways.fast_on or self.checked.get(shape, 0) >= self.checks:
            return self.step(x, y)
        self.checked[shape] = self.checked.get(shape, 0) + 1
        before = self.save()
        self.ways.fast_on = False
        self.step(x, y)
        plain = self.save()
        self.load(before)  # the same state and random numbers again, for the fast way
        self.ways.fast_on = True
        try:
            self.step(x, y)
            problem = disagreement(before, plain, self.save(), self.tolerance)
        except torch.cuda.OutOfMemoryError as err:
            problem = f"ran out of memory ({_first_line(err)})"
        except Exception as err:  # noqa: BLE001 -- whatever failed, the plain way ran the same step without it
            problem = f"failed: {type(err).__name__}: {_first_line(err)}"
        if problem:
            self.ways.fast_on = False
            self.load(plain)
            self.say(problem)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:300]


def leaves(tree: Any, path: str = "") -> dict[str, Any]:
    """The tensors and numbers of nested dicts, lists and tuples, by their path (``optimizer.state.3.momentum``)."""
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in leaves(sub, f"{path}{key}.").items()}
    if isinstance(tree, (list, tuple)):
        return {k: v for i, sub in enumerate(tree) for k, v in leaves(sub, f"{path}{i}.").items()}
    return {path.rstrip("."): tree}


def disagreement(before: Any, plain: Any, fast: Any, tolerance: float) -> str | None:
    """Where ``fast`` (the state after the fast step) is more than ``tolerance`` of a change away from ``plain``
    (after the plain step), both run from ``before`` (:data:`TOLERANCE`); None where it is not."""
    start, want, got = leaves(before), leaves(plain), leaves(fast)
    if want.keys() != got.keys():
        return f"changed other state than the plain step ({sorted(want.keys() ^ got.keys())[:3]})"
    errors = {}
    for name, w in want.items():
        g = got[name]
        if not isinstance(w, torch.Tensor):
            if g != w:
                errors[name] = float("inf")
            continue
        w, g = w.double(), g.to(w.device).double()
        b = start.get(name)
        b = b.to(w.device).double() if isinstance(b, torch.Tensor) and b.shape == w.shape else torch.zeros_like(w)
        apart, change = (g - w).norm(), (w - b).norm()
        errors[name] = float(torch.where(change > 0, apart / change, torch.where(apart > 0, torch.inf, 0.0)))
    worst = max(errors, key=lambda k: errors[k] if errors[k] == errors[k] else float("inf"), default=None)
    if worst is None or errors[worst] <= tolerance:
        return None
    return (f"disagreed with the plain step: {worst} is {errors[worst]:.3g} of its change apart (tolerance "
            f"{tolerance})")
