"""Cost-sensitive training (Benz et al. 2021, Sec. 3.3): a per-class weight w_y on each sample's loss.

Benz et al.'s two scenarios. Equal importance: the weights are given (``cost_sensitive.weights``)
or, with ``cost_sensitive.auto``, derived after each epoch from the class train robust accuracy
A_k; the paper proposes the idea without a formula, and fastfair's rule is w_k = (1 - A_k) /
mean_j (1 - A_j): weights proportional to the class's robust error, mean 1 so the loss scale stays
that of the unweighted method. One critical class: ``cost_sensitive.critical = k`` weights class k
by ``cost_sensitive.critical_weight`` and every other class by 1, unnormalised, so the other
classes' loss terms keep the baseline's scale and a comparison with the baseline shows what the
critical class gains and what the others lose (:func:`fastfair.evaluation.measures.critical_class_change`).
"""
from __future__ import annotations

import torch

from fastfair import rules
from fastfair.errors import UserError
from fastfair.methods.options import Option, register, train_robust_fraction
from fastfair.schema import Key

NO_CRITICAL = -1


def weights_from_robust_accuracy(train_robust: torch.Tensor) -> torch.Tensor:
    """w_k = (1 - A_k) / mean_j (1 - A_j); all ones when every class is fully robust."""
    err = 1.0 - train_robust
    mean = err.mean()
    return torch.where(mean > 0, err / mean.clamp(min=1e-12), torch.ones_like(err))


def critical_weights(num_classes: int, critical: int, weight: float) -> list[float]:
    """w_k = weight for the critical class k, 1 for every other (Benz et al. 2021, Sec. 3.3, second scenario)."""
    return [weight if c == critical else 1.0 for c in range(num_classes)]


@register("cost_sensitive", "per-class loss weights w_y: given, from class robust error, or one critical class "
                            "(Benz et al. 2021)")
class CostSensitive(Option):
    keys = {"weights": Key([], "per-class loss weights w_y, one per class (Benz et al. 2021, Sec. 3.3)", list[float],
                           valid=rules.each(rules.at_least(0))),
            "auto": Key(False, "derive w_k from the train robust accuracy after each epoch (fastfair's rule, "
                               "docs/methods.md)"),
            "critical": Key(NO_CRITICAL, "the critical class k (index among the run's classes) whose loss weighs "
                                         "critical_weight, every other class 1 (Benz et al. 2021, Sec. 3.3); -1: none"),
            "critical_weight": Key(2.0, "loss weight of the critical class (Benz et al. give no value; fastfair's "
                                        "default 2)")}
    factor = "loss_weight_cs"

    @classmethod
    def enabled(cls, cfg) -> bool:
        c = cfg.cost_sensitive
        # critical_weight alone is on, so that check can say it does nothing without critical
        return (bool(c.weights) or c.auto or c.critical != NO_CRITICAL
                or c.critical_weight != cls.keys["critical_weight"].default)

    @classmethod
    def epoch_update(cls, cfg) -> str:
        return "cost_sensitive.auto's class weights (from the train robust accuracy)" \
            if cfg.cost_sensitive.auto else ""

    @classmethod
    def check(cls, cfg) -> None:
        c = cfg.cost_sensitive
        if c.weights and c.auto:
            raise UserError("set either cost_sensitive.weights (given) or cost_sensitive.auto, not both")
        if c.critical == NO_CRITICAL:
            if c.critical_weight != cls.keys["critical_weight"].default:
                raise UserError(f"cost_sensitive.critical_weight={c.critical_weight} weights no class: name the "
                                "critical one with --set cost_sensitive.critical=K")
            return
        if c.weights or c.auto:
            raise UserError("cost_sensitive.critical is the one-critical-class scenario; drop cost_sensitive.weights / "
                            "cost_sensitive.auto (the equal-importance scenario) or the critical class")
        if c.critical < 0:
            raise UserError(f"cost_sensitive.critical={c.critical}: give a class index (0, 1, ...), or -1 for none")
        if not c.critical_weight > 0 or c.critical_weight == 1.0:
            raise UserError(f"cost_sensitive.critical_weight={c.critical_weight}: the critical class needs a weight "
                            "above 0 and other than 1 (1 weighs it as every other class), e.g. 2")

    def setup(self, state):
        given, k = self.own.weights, self.own.critical
        if given and len(given) != state.num_classes:
            raise UserError(f"cost_sensitive.weights needs {state.num_classes} values (one per class); "
                            f"got {len(given)}")
        if k >= state.num_classes:
            raise UserError(f"cost_sensitive.critical={k} is not a class of this run (0..{state.num_classes - 1})")
        if k != NO_CRITICAL:
            given = critical_weights(state.num_classes, k, self.own.critical_weight)
        state.add_factor("loss_weight", self.factor, given or 1.0, owner=f"option {self.name}")

    def end_epoch(self, state, epoch, stats):
        if self.own.auto:
            state.set(self.factor, weights_from_robust_accuracy(train_robust_fraction(stats, state)))
