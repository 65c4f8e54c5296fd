"""BAT: Balance Adversarial Training (Sun, Xu, Yao, Liang, Wu, Liang, Liu & Liu, AAAI 2023, arXiv 2209.07534).

Each step makes two adversarial batches whose generation stops per sample, so that a class whose images are easy
to attack is not pushed far past its decision boundary (the paper's source-class fairness), and it pulls both
batches' predictions towards the uniform distribution, so that no class is the favoured target of the attacks
(its target-class fairness). Only the paper's abstract could be read when this module was written; the rule below
is the authors' code (``silvercherry/Improving-Robust-Fairness-via-Balance-Adversarial-Training`` at 9bcee67:
``train.py``, ``train_mode/stop_to_lastclean.py``, ``train_mode/stop_to_firstadv.py``), which the conformance cases
check it against, so each formula cites the code's file and line.

Both attacks are TRADES-PGD (sum_i KL(p(x) || p(x')), BN in eval mode) from x + 0.001 N(0, I) clipped to [0, 1],
each with its own start, checking every iterate's prediction before stepping from it:

* the last clean example x_lc: a sample stops at its first misclassified check and returns to the iterate before
  it, the last one it had right (the start itself when that is already wrong);
* the first adversarial example x_fa: FAT's rule with tau = 1 (a misclassified check spends the one budget, the
  next misclassified one stops the sample there).

A sample that never stops takes all K steps. The loss rows, with u the uniform distribution over the C classes:

    CE(f(x_lc), y) + beta KL(p(x) || p(x_fa)) + w (KL(p(x_lc) || u) + KL(p(x_fa) || u))

beta 6, w 1, the three forwards in train mode in the code's order (x_lc, x_fa, then x).
"""
from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

from fastfair.errors import UserError
from fastfair.methods.base import CODE_PGD10, METHODS, Method
from fastfair.methods.fat import EarlyStop
from fastfair.schema import Key, Tune


class LastClean(EarlyStop):
    """With tau 0: stop sample i at its first misclassified check and return it to the iterate before (BAT code,
    ``train_mode/stop_to_lastclean.py`` lines 44-60: the rows it outputs are ``tmp_adv``, the previous iterate)."""

    back: ClassVar[bool] = True  # fastfair.attacks.pgd.steps_back


@METHODS.register("bat", "balance AT: CE on the last clean example, TRADES KL on the first adversarial one, both "
                         "pulled to uniform (Sun et al. 2023, AAAI; rule from the code at silvercherry/Improving-"
                         "Robust-Fairness-via-Balance-Adversarial-Training)")
class BAT(Method):
    """CE(f(x_lc), y) + beta KL(p(x) || p(x_fa)) + w (KL(p(x_lc) || u) + KL(p(x_fa) || u)) (BAT code, train.py
    lines 74-86, ``BAT_loss``)."""

    keys = {
        "kl_weight": Key(6.0, "BAT beta: weight of KL(p(x) || p(x_fa)) (code --beta 6.0, train.py line 38)",
                         tune=Tune(1.5, 24.0, "log", source="no ablation read here; x/4 .. 4x around the code's 6")),
        "uniform_weight": Key(1.0, "BAT: weight w of KL(p || uniform) on the last clean and on the first adversarial "
                                   "example (code: 1, train.py line 85)",
                              tune=Tune(0.25, 4.0, "log", source="no ablation read here; x/4 .. 4x around the "
                                                                 "code's 1")),
        "tau": Key(1, "BAT first adversarial example: misclassified checks a sample passes before it stops (FAT's "
                      "tau; code: 1, train.py line 106)"),
    }
    defaults = {"attack.objective": "kl", "attack.init": "normal_clipped", "attack.bn_mode": "eval", **CODE_PGD10}

    @classmethod
    def check(cls, cfg):
        m = cfg.method
        if m.tau < 0:
            raise UserError(f"method.tau counts misclassified checks a sample passes; it cannot be negative, got "
                            f"{m.tau}")
        if m.kl_weight < 0 or m.uniform_weight < 0:
            raise UserError(f"method.kl_weight and method.uniform_weight weigh divergences; they cannot be negative, "
                            f"got {m.kl_weight} and {m.uniform_weight}")

    def __init__(self, cfg, *args, **kw):
        self.check(cfg)
        super().__init__(cfg, *args, **kw)
        self.attack = dataclasses.replace(self.attack, stop=EarlyStop(cfg.method.tau))
        self.last_clean_attack = dataclasses.replace(self.attack, stop=LastClean(tau=0))
        self.x_last_clean = None  # this step's, set by perturb

    def perturb(self, model, x, y, state):
        """x_fa, keeping x_lc for :meth:`loss` (the code makes x_lc first, each from its own random start)."""
        eps, alpha, targets = state["eps"], state["alpha"], self.attack_targets(y, state)
        self.x_last_clean = self.last_clean_attack(model, x, y, eps, alpha, *targets)
        return self.attack(model, x, y, eps, alpha, *targets)

    def loss(self, model, x, x_adv, y, state):
        if self.x_last_clean is None:
            raise UserError("bat: call perturb on the batch before its loss: the loss reads the batch's last clean "
                            "examples, which perturb makes")
        m = self.cfg.method
        # the code's order of the three train-mode forwards (BN running statistics)
        z_lc, z_fa, z_nat = model(self.x_last_clean), model(x_adv), model(x)
        # KL(p || u) = log C - H(p): the entropies carry the gradient, the constant the code's loss value
        rows = (self.ops.row_loss(z_lc, z_fa, y, ce_nat=1.0, ent_nat=m.uniform_weight, ent_adv=m.uniform_weight)
                + self.ops.row_loss(z_nat, z_fa, y, kl=m.kl_weight)
                + 2.0 * m.uniform_weight * math.log(state.num_classes))
        return rows, z_fa
