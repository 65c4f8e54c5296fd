"""An inter-class cosine-similarity regulariser: fastfair's reading of Benz et al. 2021, Sec. 3.3.

Benz et al. measure how alike two classes look to the model as the cosine similarity of their mean
logit vectors (Sec. 3.2) and propose "a regularizer term to decrease the inter-class cosine
similarity" (Sec. 3.3) without a formula. fastfair's term, added once per batch to the method's
objective:

    R = lambda * mean_{j != k, both in the batch} cos(mu_j, mu_k),  mu_k = mean of z_i over the batch's class k,

on the logits the step counts (the adversarial ones for an adversarial method, the clean ones for
standard training), the same quantity Benz et al. measure on a test set. Classes absent from the
batch are masked out; a batch with fewer than two classes adds 0. The gradient flows through the
mean vectors into the model; everything stays on the device (no host sync).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastfair.errors import UserError
from fastfair.methods.options import Option, register
from fastfair.ops.losses import label_mask
from fastfair.schema import Key


def mean_inter_class_cosine(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """mean_{j != k present} cos(mu_j, mu_k) of the per-class mean rows mu_k of ``z`` (fastfair's reading of Benz
    et al. 2021, Sec. 3.2-3.3); 0 with fewer than two classes present."""
    onehot = label_mask(y, num_classes).to(z.dtype)  # (N, C)
    count = onehot.sum(0)
    means = (onehot.T @ z) / count.clamp(min=1)[:, None]  # (C, C'): mu_k, zero for an absent class
    unit = F.normalize(means, dim=1)
    present = (count > 0).to(z.dtype)
    pairs = present[:, None] * present[None, :] * (1 - torch.eye(num_classes, dtype=z.dtype, device=z.device))
    return ((unit @ unit.T) * pairs).sum() / pairs.sum().clamp(min=1)


@register("cosine_reg", "lambda * mean inter-class cosine similarity of the batch's per-class mean logits (fastfair's "
                        "reading of Benz et al. 2021, Sec. 3.3)")
class CosineReg(Option):
    keys = {"weight": Key(0.0, "lambda of the inter-class cosine regulariser on the step's logits (fastfair's reading "
                               "of Benz et al. 2021, Sec. 3.3; docs/methods.md); 0: off")}

    @classmethod
    def enabled(cls, cfg) -> bool:
        return cfg.cosine_reg.weight != 0.0

    @classmethod
    def check(cls, cfg) -> None:
        if not cfg.cosine_reg.weight > 0:
            raise UserError(f"cosine_reg.weight={cfg.cosine_reg.weight}: lambda must be above 0 (a negative one would "
                            "raise the similarity), or 0 for off")

    def objective_term(self, logits, y):
        """lambda * mean inter-class cosine of the per-class mean logits, in fp32 (Benz et al. 2021, Sec. 3.3)."""
        return self.own.weight * mean_inter_class_cosine(logits.float(), y, logits.shape[1])
