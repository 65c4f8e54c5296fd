"""Cost-sensitive training (Benz et al. 2021, Sec. 4): a per-class weight w_y on each sample's loss.

The weights are given (``cost_sensitive.weights``) or, with ``cost_sensitive.auto``, derived
after each epoch from the class train robust accuracy A_k. Benz et al. propose the idea
without a formula; fastfair's rule is w_k = (1 - A_k) / mean_j (1 - A_j): weights proportional
to the class's robust error, mean 1 so the loss scale stays that of the unweighted method.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.options import Option, register, train_robust_fraction
from fastfair.schema import Key


def weights_from_robust_accuracy(train_robust: torch.Tensor) -> torch.Tensor:
    """w_k = (1 - A_k) / mean_j (1 - A_j); all ones when every class is fully robust."""
    err = 1.0 - train_robust
    mean = err.mean()
    return torch.where(mean > 0, err / mean.clamp(min=1e-12), torch.ones_like(err))


@register("cost_sensitive", "per-class loss weights w_y, given or from class robust error (Benz et al. 2021)")
class CostSensitive(Option):
    keys = {"weights": Key([], "per-class loss weights w_y, one per class (Benz et al. 2021, Sec. 4)", list[float]),
            "auto": Key(False, "derive w_k from the train robust accuracy after each epoch (fastfair's rule, "
                               "docs/methods.md)")}
    factor = "loss_weight_cs"

    @classmethod
    def enabled(cls, cfg) -> bool:
        return bool(cfg.cost_sensitive.weights) or cfg.cost_sensitive.auto

    @classmethod
    def epoch_update(cls, cfg) -> str:
        return "cost_sensitive.auto's class weights (from the train robust accuracy)" \
            if cfg.cost_sensitive.auto else ""

    @classmethod
    def check(cls, cfg) -> None:
        if cfg.cost_sensitive.weights and cfg.cost_sensitive.auto:
            raise UserError("set either cost_sensitive.weights (given) or cost_sensitive.auto, not both")

    def setup(self, state):
        given = self.own.weights
        if given and len(given) != state.num_classes:
            raise UserError(f"cost_sensitive.weights needs {state.num_classes} values (one per class); "
                            f"got {len(given)}")
        state.add_factor("loss_weight", self.factor, given or 1.0, owner=f"option {self.name}")

    def end_epoch(self, state, epoch, stats):
        if self.own.auto:
            state.set(self.factor, weights_from_robust_accuracy(train_robust_fraction(stats, state)))
