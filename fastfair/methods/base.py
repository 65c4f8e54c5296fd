"""The Method interface: how one training step makes its examples and its per-sample loss rows.

A method declares its config keys (``keys``, the ``[method]`` section), the keys of other
sections its paper's code sets (``defaults``: attack objective, init, BN mode), and implements
``perturb`` and ``loss``. ``loss`` returns per-sample rows; :meth:`Method.objective` is the one
place that weights them by class (``state["loss_weight"][y]``) and averages, so every method
honours the options that weight classes. ``setup`` declares per-class vectors in the
:class:`~fastfair.training.class_state.ClassState`; ``begin_epoch``/``end_epoch`` update them
once per epoch. The enabled :mod:`options <fastfair.methods.options>` ride along on the same
hooks. Nothing in ``perturb``/``loss`` may sync with the host.
"""
from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable, ClassVar

import torch
from torch import nn

from fastfair import rules
from fastfair import ops, schema
from fastfair.attacks.pgd import PGD, descend
from fastfair.methods.options import OPTIONS
from fastfair.registry import Registry
from fastfair.schema import Key
from fastfair.training.class_state import ClassState, counted

if TYPE_CHECKING:
    from fastfair.config import Config

METHODS: Registry[type["Method"]] = Registry("method")
# The attack of the TRADES code (yaodongyu/TRADES: --epsilon 0.031 --step-size 0.007 --num-steps 10), which the codes
# of MART, WAT, DAFA, TRIX and BAT keep (their golden settings, tests/golden/*.json): a method following one of them
# carries it in its defaults, so `--method X` alone attacks as its code does, not at the global 8/255 and 2/255
CODE_PGD10 = {"attack.eps": 0.031, "attack.alpha": 0.007, "attack.steps": 10}

SMOOTHING = {
    "smoothing": Key(0.0, "label smoothing alpha of the CE terms (Szegedy et al. 2016; ME paper Table 1: 0.1)",
                     valid=rules.within(0, 1, below_hi=True)),
}


class Method:
    keys: ClassVar[dict[str, Key]] = {}  # this class's own keys; subclasses add theirs (keys_all)
    defaults: ClassVar[dict[str, Any]] = {}
    statistics: ClassVar[tuple[str, ...]] = ()  # per-class statistics its end_epoch reads (class_state.STATISTICS)
    needs_initial_validation: ClassVar[bool] = False  # FRL: update from validation before the first epoch
    uses_ce_logits: ClassVar[bool] = False  # its CE terms go through ce_logits (where HE subtracts its margin)
    adversarial: ClassVar[bool] = True  # trains on attacked examples, so the attack.* keys must be valid
    # distils a teacher (method.teacher): the trainer loads it into ``self.teacher`` before setup
    distils: ClassVar[bool] = False
    # why `fastfair tune` has no default search space for it (fastfair.tuning.space), where none of its keys is a knob;
    # read from the class itself, never inherited: a subclass of an untuned method may add a knob (ME-AT, FAT)
    untuned: ClassVar[str] = ""

    def __init__(self, cfg: Config, backend: ops.Ops = ops.REFERENCE, descent: Callable = descend,
                 compile_: Callable[[Callable], Callable] | None = None):
        """``backend``: the ops the loss and attack run on; ``descent``: the attack's K steps, eager
        (:func:`~fastfair.attacks.pgd.descend`) or compiled into one graph by the trainer; ``compile_``: the
        trainer's compiler where it compiles the attack, for a method's own forwards outside the attack and
        the loss (the model it is handed is then the bare module, which would run them op by op)."""
        self.cfg, self.ops = cfg, backend
        self.compile = compile_ or (lambda fn: fn)
        a = cfg.attack
        # a method that attacks nothing leaves attack.* unchecked (fastfair.checks) and builds no attack
        self.attack = PGD(steps=a.steps, objective=a.objective, init=a.init, bn_mode=a.bn_mode, ops=backend,
                          descend=descent) if self.adversarial else None
        self.options = [OPTIONS.get(n)(cfg, self) for n in cfg.enabled_options()]

    @classmethod
    def keys_all(cls) -> dict[str, Key]:
        """The method's keys, its base classes' first."""
        out: dict[str, Key] = {}
        for klass in reversed(cls.__mro__):
            out.update(vars(klass).get("keys", {}))
        return out

    @classmethod
    def why_untuned(cls) -> str:
        """Why ``fastfair tune`` has no default space for it: its own ``untuned``, never a base class's."""
        return vars(cls).get("untuned", "")

    @classmethod
    def tunes(cls) -> dict[str, schema.Tune]:
        """The declared ranges of its knobs by key; none where it says why (PGD-AT's entropy weight is ME-AT's)."""
        if cls.why_untuned():
            return {}
        return {k: key.tune for k, key in cls.keys_all().items() if key.tune is not None}

    @classmethod
    @functools.cache
    def section(cls) -> type:
        """The dataclass of this method's ``[method]`` section: ``name`` and its keys."""
        return schema.section(f"method-{cls.__name__}", {"name": Key("", "the method (fastfair methods)"),
                                                         **cls.keys_all()})

    @classmethod
    def check(cls, cfg: Config) -> None:
        """Raise a UserError for settings this method cannot run (``check_config`` calls it before any work)."""

    @classmethod
    def warnings(cls, cfg: Config) -> list[str]:
        """What the run should say once about settings this method reads otherwise (``check_config`` returns them)."""
        return []

    @classmethod
    def epoch_update(cls, cfg: Config) -> str:
        """What ``end_epoch`` sets for the epochs after it ('' for nothing): a one-epoch run trains without it."""
        return ""

    def setup(self, state: ClassState) -> None:
        """Declare the per-class vectors this method reads (eps_k and alpha_k), then the options'."""
        state.add_vector("eps", self.cfg.attack.eps)
        state.add_vector("alpha", self.cfg.attack.alpha)
        self.setup_options(state)

    def setup_options(self, state: ClassState) -> None:
        for name in self.statistics:
            state.add_statistic(name)
        for option in self.options:
            for name in option.statistics:
                state.add_statistic(name)
            option.setup(state)

    def setup_warnings(self) -> list[str]:
        """The options' warnings known after :meth:`setup` (the trainer prints them with the config's)."""
        return [line for option in self.options for line in option.setup_warnings()]

    def begin_epoch(self, model: nn.Module, epoch: int) -> None:
        """Before the epoch's first step. It runs again when an interrupted epoch resumes, on the weights saved
        mid-epoch, which are then restored: what it sets outside the model's state must follow from (config, epoch)."""
        for option in self.options:
            option.begin_epoch(model, epoch)

    def after_step(self, model: nn.Module) -> None:
        """After each optimiser step (the trainer calls it with the bare model): the options' hooks."""
        for option in self.options:
            option.after_step(model)

    def use_loader(self, loader, state: ClassState) -> None:
        """Once, with the training loader, before any epoch: the options' hooks (resampling's class draw)."""
        for option in self.options:
            option.use_loader(loader, state)

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, state: ClassState) -> torch.Tensor:
        return self.attack(model, x, y, state["eps"], state["alpha"], *self.attack_targets(y, state))

    def attack_targets(self, y: torch.Tensor, state: ClassState) -> tuple[torch.Tensor, ...]:
        """(target, toward) of an option that makes the training attack targeted (targeted_attack), else ()."""
        for option in self.options:
            targets = option.attack_targets(y, state)
            if targets is not None:
                return targets
        return ()

    def loss(self, model: nn.Module, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
             state: ClassState) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-sample loss rows (N,), logits whose per-class accuracy is counted as train robust accuracy, or a
        dict of named logits holding them as "adv" beside others a statistic reads: ABSLD's "nat")."""
        raise NotImplementedError

    def objective(self, model: nn.Module, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor,
                  state: ClassState) -> tuple[torch.Tensor, torch.Tensor]:
        """(mean_i w_{y_i} loss_i + the options' batch-level terms, logits): per-class loss weights, ones unless an
        option sets them.

        Benz et al. 2021.
        """
        rows, logits = self.loss(model, x, x_adv, y, state)
        out = (rows * state["loss_weight"][y]).mean()
        for option in self.options:  # batch-level terms (the inter-class cosine regulariser)
            term = option.objective_term(counted(logits), y)
            out = out if term is None else out + term
        return out, logits

    def ce_logits(self, model: nn.Module, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Logits the CE terms see, after every option's hook (HE: s (cos_y - m), Pang et al. 2020, Eq. 6)."""
        for option in self.options:
            z = option.ce_logits(model, z, y)
        return z

    def end_epoch(self, state: ClassState, epoch: int, stats: dict) -> None:
        """Update per-class factors from the epoch's counters, statistics and validation (``stats``, read once)."""
        for option in self.options:
            option.end_epoch(state, epoch, stats)

    def validation_pass(self, model: nn.Module, loader, state: ClassState, epoch: int) -> dict:
        """Per-class statistics of the method's own over the validation split, once per epoch after
        the validation; ``end_epoch`` reads them as ``stats["val_method"]``. Default: none.

        Runs outside the training step, so it may sum on the device and read the sums once (WAT:
        per-class validation TRADES loss)."""
        return {}

    def before_training(self, state: ClassState, val: dict) -> None:
        """Called once before the first epoch with a validation of the initial model.

        Only when ``needs_initial_validation``.
        """
