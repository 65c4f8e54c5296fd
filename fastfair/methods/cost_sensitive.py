"""Cost-sensitive training (Benz et al. 2021, Sec. 4): a per-class weight w_y on each sample's loss.

The weights are given (``method.class_weights``) or, with ``method.class_weights_auto``,
derived after each epoch from the class train robust accuracy A_k. Benz et al. propose the idea
without a formula; fastfair's rule is w_k = (1 - A_k) / mean_j (1 - A_j): weights proportional
to the class's robust error, mean 1 so the loss scale stays that of the unweighted method.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.options import OPTIONS, Option, train_robust_fraction


def weights_from_robust_accuracy(train_robust: torch.Tensor) -> torch.Tensor:
    """w_k = (1 - A_k) / mean_j (1 - A_j); all ones when every class is fully robust."""
    err = 1.0 - train_robust
    mean = err.mean()
    return torch.where(mean > 0, err / mean.clamp(min=1e-12), torch.ones_like(err))


@OPTIONS.register("cost-sensitive", "per-class loss weights w_y, given or from class robust error (Benz et al. 2021)")
class CostSensitive(Option):
    @staticmethod
    def enabled(cfg) -> bool:
        return bool(cfg.method.class_weights) or cfg.method.class_weights_auto

    def setup(self, state):
        m = self.cfg.method
        if m.class_weights and m.class_weights_auto:
            raise UserError("set either method.class_weights (given) or method.class_weights_auto, not both")
        if m.class_weights and len(m.class_weights) != state.num_classes:
            raise UserError(f"method.class_weights needs {state.num_classes} values (one per class); "
                            f"got {len(m.class_weights)}")
        state.add_vector("loss_weight", m.class_weights or 1.0)

    def end_epoch(self, state, epoch, stats):
        if self.cfg.method.class_weights_auto:
            state.set("loss_weight", weights_from_robust_accuracy(train_robust_fraction(stats, state)))
