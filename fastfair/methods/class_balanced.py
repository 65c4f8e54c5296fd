"""Class-balanced loss weights (Cui et al. 2019, "Class-balanced loss based on effective number of samples").

w_k = (1 - beta) / (1 - beta^{n_k}), the inverse of the effective number E_{n_k} = (1 - beta^{n_k}) / (1 - beta)
(Cui et al., Eq. 3 and Sec. 4), normalised so the weights of the classes present sum to their number (the
authors' code: ``per_cls_weights / sum * C``). n_k are the training split's images per class after
``data.classes`` / ``data.train_per_class`` / ``data.drop_classes``. A class without training images gets
weight 0 (no sample carries it). Each sample's loss row is weighted and the batch averaged over its N samples,
as every option weight in fastfair and Cui et al.'s own code (not torch's weighted CE, which divides by
sum_i w_{y_i}). Benz et al. 2021 (Sec. 2.2) name it among the long-tail remedies for the vulnerable classes.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.options import Option, register, train_counts
from fastfair.schema import Key

# weights closer than this to each other weight the loss as if unweighted: the run says so
EQUAL_WITHIN = 0.01


def class_balanced_weights(counts, beta: float) -> torch.Tensor:
    """w_k proportional to 1 / E_{n_k} = (1 - beta) / (1 - beta^{n_k}), summing to the number of classes with
    n_k > 0; 0 where n_k = 0 (Cui et al. 2019, Eq. 3 and Sec. 4)."""
    n = torch.as_tensor(counts, dtype=torch.float64)
    present = n > 0
    inverse = torch.where(present, (1.0 - beta) / -torch.expm1(n * torch.log(torch.tensor(beta, dtype=torch.float64))),
                          torch.zeros_like(n))
    return (inverse / inverse.sum() * present.sum()).float()


@register("class_balanced", "per-class loss weights from the effective number of samples, (1 - beta) / "
                            "(1 - beta^n_k) (Cui et al. 2019)")
class ClassBalanced(Option):
    keys = {"beta": Key(0.0, "beta of the effective number E_n = (1 - beta^n) / (1 - beta); weights 1 / E_n summing "
                             "to C (Cui et al. 2019, Eq. 3; they use 0.9 - 0.9999); 0: off")}
    factor = "loss_weight_cb"

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.class_balanced.beta != 0.0

    @classmethod
    def check(cls, cfg) -> None:
        beta = cfg.class_balanced.beta
        if not 0.0 < beta < 1.0:
            raise UserError(f"class_balanced.beta={beta} is out of range: it must be in (0, 1) (Cui et al. use 0.9, "
                            "0.99, 0.999, 0.9999), or 0 for off")

    def setup(self, state):
        self.counts = train_counts(state, "class_balanced")
        self.weights = class_balanced_weights(self.counts, self.own.beta)
        state.add_factor("loss_weight", self.factor, self.weights, owner=f"option {self.name}")

    def setup_warnings(self):
        w = self.weights[self.counts > 0]
        if w.max() > w.min() * (1 + EQUAL_WITHIN):
            return []
        n = self.counts[self.counts > 0]
        return [f"class_balanced.beta={self.own.beta}: the training split's class counts ({int(n.min())}-"
                f"{int(n.max())} images a class) give weights {float(w.min()):.4f}-{float(w.max()):.4f}, within "
                f"{EQUAL_WITHIN:.0%} of each other, so the loss is as good as unweighted; class-balanced weights "
                "act on an imbalanced training split (or a beta nearer 1)"]
