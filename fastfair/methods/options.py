"""Class-wise options that combine with any method: CCM, CCR, cost-sensitive weights, HE, ...

An option is not a method. It has its own config section (``[ccm]``, named as registered) with
the keys it declares, decides from that section whether the run switches it on, and
contributes only through what it declares: factors on per-class vectors (``eps``,
``kl_weight``, ``loss_weight``; :meth:`ClassState.add_factor`), a hook on the logits of the CE
terms (HE), the training loader's class draw (resampling), the training attack's targets
(targeted_attack), and the per-class statistics it reads at the epoch end. It never reads another
option's or the method's section. Two hooks reach past the per-sample rows: a batch-level term
added to the objective (the inter-class cosine regulariser) and the warnings an option can give
only once it has seen the training split's class counts (class-balanced weights, LDAM).
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from fastfair import schema
from fastfair.errors import UserError
from fastfair.registry import Registry
from fastfair.schema import Key
from fastfair.training.class_state import ClassState

if TYPE_CHECKING:
    from fastfair.config import Config
    from fastfair.methods.base import Method

OPTIONS: Registry[type["Option"]] = Registry("method option")


class Option:
    """One switchable add-on; the hooks mirror :class:`~fastfair.methods.base.Method`'s."""

    name: ClassVar[str]  # its section, as registered
    keys: ClassVar[dict[str, Key]] = {}
    defaults: ClassVar[dict[str, Any]] = {}  # keys of other sections its paper sets when it is on
    statistics: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Config, method: Method):
        self.cfg, self.method = cfg, method
        self.own = getattr(cfg, self.name)

    @classmethod
    @functools.cache
    def section(cls) -> type:
        return schema.section(cls.name, cls.keys)

    @classmethod
    def enabled(cls, cfg: Config) -> bool:
        """Whether the run switches it on; by default its ``enabled`` key."""
        return getattr(cfg, cls.name).enabled

    @classmethod
    def epoch_update(cls, cfg: Config) -> str:
        """What ``end_epoch`` sets for the epochs after it ('' for nothing): a one-epoch run trains without it."""
        return ""

    @classmethod
    def check(cls, cfg: Config) -> None:
        """Reject a bad value before any long work starts (UserError naming the fix)."""

    def setup(self, state: ClassState) -> None:
        """Add this option's factors and statistics (after the method declared its vectors)."""

    def begin_epoch(self, model, epoch: int) -> None:
        """Called before the epoch's first step (outside the step: may read the model once); again when an interrupted
        epoch resumes (Method.begin_epoch)."""

    def use_loader(self, loader, state: ClassState) -> None:
        """Called once with the training loader after :meth:`setup`, before any epoch (resampling: the class draw)."""

    def attack_targets(self, y: torch.Tensor, state: ClassState) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(target, toward) that make the training attack targeted on the rows where ``toward`` holds
        (:func:`~fastfair.attacks.pgd.descend`), or None; inside the step, so no host sync."""
        return None

    def after_step(self, model) -> None:
        """Called after each optimiser step, outside the step's graph (HE: renormalise the class weights)."""

    def ce_logits(self, model, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The logits the method's CE terms see (identity unless the option changes them)."""
        return z

    def objective_term(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor | None:
        """A batch-level scalar added to the method's objective, from the logits the step counts (None: none)."""
        return None

    def setup_warnings(self) -> list[str]:
        """What the run should say once about this option, known after :meth:`setup` (the class counts)."""
        return []

    def end_epoch(self, state: ClassState, epoch: int, stats: dict) -> None:
        """Update factors for epoch ``epoch + 1`` from the epoch's counters, statistics and validation."""


def register(name: str, doc: str):
    """Register an option under ``name``, which is also its config section."""
    def deco(cls: type[Option]) -> type[Option]:
        cls.name = name
        return OPTIONS.register(name, doc)(cls)

    return deco


def train_counts(state: ClassState, who: str) -> torch.Tensor:
    """The training split's images per class (CPU, long); a UserError where the state was made without them."""
    if state.train_counts is None:
        raise UserError(f"{who} reads the training split's class counts, which `fastfair train` passes on; in a loop "
                        "of your own, pass them: fastfair.method(..., train_counts=[n_0, n_1, ...])")
    return state.train_counts


def train_robust_fraction(stats: dict, state: ClassState) -> torch.Tensor:
    """A_k of the finished epoch as a (C,) device tensor in [0, 1] (CFA Sec. 4.1: train robust accuracy), in torch's
    default dtype as the state's vectors are."""
    return torch.tensor(stats["train_acc_per_class"], dtype=torch.get_default_dtype(), device=state.device) / 100.0
