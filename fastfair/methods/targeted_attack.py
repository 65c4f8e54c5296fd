"""Adversarial training with a targeted attack towards one chosen class (Benz et al. 2021, Sec. 3.3).

Benz et al. propose to "experiment with a targeted attack by choosing the vulnerable or important
class as the target class, which intuitively might make that class more robust": the training
examples of the other classes are pushed into class k's region, so the model learns to keep class
k's boundary where non-k images sit at eps. The proposal gives no equation; fastfair's reading:

* rows with y != k (each with probability ``fraction``) run the method's PGD descending
  CE(f(x'), k) (targeted PGD, Kurakin et al. 2017), in the same eps_y ball with the same step;
* rows with y == k keep the method's own untargeted attack: targeting their own label would
  *lower* their loss, so they would train on no adversarial example at all;
* for an attack objective other than CE (TRADES' KL, a CW margin) the targeted rows descend the
  same CE towards k in place of that objective (CE(f(x'), k) = KL(onehot_k || p(x')), the KL to the
  target's one-hot), as TRIX mixes targeted CE and untargeted KL rows in one PGD.

Everything goes through the one PGD engine (:func:`fastfair.attacks.pgd.descend`'s ``target`` and
``toward``), selected per row on the device, so no host sync. The validation and evaluation
attacks stay untargeted.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.base import METHODS, Method
from fastfair.methods.options import Option, register
from fastfair.schema import Key


def composes(method: type[Method]) -> bool:
    """Whether ``method`` attacks through :meth:`Method.perturb`, the path that passes an option's targets on."""
    return method.adversarial and method.perturb is Method.perturb


@register("targeted_attack", "training attack targeted towards class target for the other classes' images "
                             "(Benz et al. 2021, Sec. 3.3)")
class TargetedAttack(Option):
    keys = {
        "target": Key(-1, "class k (after data.classes) the training attack of the other classes' images descends "
                          "CE(f(x'), k) towards; -1 off (Benz et al. 2021, Sec. 3.3)"),
        "fraction": Key(1.0, "probability that an image of another class is attacked towards the target, drawn per "
                             "image and step; the rest keep the method's attack (fastfair's; Benz et al. give none)"),
    }

    @classmethod
    def enabled(cls, cfg) -> bool:
        t = cfg.targeted_attack
        return t.target != -1 or t.fraction != 1.0

    @classmethod
    def check(cls, cfg) -> None:
        t, name = cfg.targeted_attack, cfg.method.name
        if t.target == -1:
            raise UserError(f"targeted_attack.fraction={t.fraction} needs a target class: set targeted_attack.target")
        if t.target < 0:
            raise UserError(f"targeted_attack.target takes a class index from 0 (after data.classes); got {t.target}")
        if not 0 < t.fraction <= 1:
            raise UserError(f"targeted_attack.fraction is a probability in (0, 1]; got {t.fraction}")
        method = METHODS.get(name)
        if not composes(method):
            why = ("trains on no adversarial examples" if not method.adversarial else
                   "makes its training examples with its own attack (its perturb), which no option steers")
            ok = ", ".join(m for m in METHODS if composes(METHODS.get(m)))
            raise UserError(f"targeted_attack: method {name} {why}; use one of {ok}")

    def setup(self, state):
        if self.own.target >= state.num_classes:
            raise UserError(f"targeted_attack.target={self.own.target} is not a class of this run: classes are "
                            f"0..{state.num_classes - 1} (after data.classes)")

    def attack_targets(self, y, state):
        """(k for every row, y != k and U < fraction): the rows the engine steps towards k."""
        toward = y != self.own.target
        if self.own.fraction < 1.0:  # a config value, not a tensor: no sync
            toward = toward & (torch.rand(y.shape, device=y.device) < self.own.fraction)
        return torch.full_like(y, self.own.target), toward
