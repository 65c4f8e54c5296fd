"""MART (Wang et al. 2020, ICLR): misclassification-aware adversarial training."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from fastfair import rules
from fastfair.methods.base import CODE_PGD10, METHODS, Method
from fastfair.ops.losses import label_mask, widened
from fastfair.schema import Key, Tune


def boosted_margin(z_adv: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """-log(1.0001 - max_{k != y} p_k(x')), the margin half of MART's BCE.

    Wang et al. 2020, Sec. 3.3; code's 1.0001.
    """
    p = F.softmax(widened(z_adv), dim=1)
    other = p.masked_fill(label_mask(y, p.shape[1]), -1.0).amax(dim=1)
    return -torch.log(1.0001 - other + 1e-12)


@METHODS.register("mart", "MART, BCE(p(x'), y) + beta KL(p(x) || p(x')) (1 - p_y(x)), beta 6 (Wang et al. 2020)")
class MART(Method):
    """BCE(p(x'), y) + beta KL(p(x)||p(x')) (1 - p_y(x)) per sample (Wang et al. 2020, Sec. 3.3, the MART objective)."""

    keys = {"kl_weight": Key(6.0, "MART beta: weight of the misclassification-aware KL term (Wang et al. 2020)",
                             tune=Tune(1.5, 24.0, "log", source="no ablation read here; x/4 .. 4x around the "
                                                                "paper's 6"), valid=rules.at_least(0))}
    # MART's code: CE-PGD from x + 0.001 N(0, I), model in eval mode while attacking.
    defaults = {"attack.objective": "ce", "attack.init": "normal", "attack.bn_mode": "eval", **CODE_PGD10,
                "method.kl_weight": 6.0}

    def loss(self, model, x, x_adv, y, state):
        z_nat, z_adv = model(x), model(x_adv)
        # 1 - p_y(x) keeps its gradient, as in MART's code (1.0000001 there; the 1e-7 is below fp32 noise here:
        # tests/conformance_mart_eval.py adds it, and the code's 1e-12 in its KL, to compare in float64).
        p_true = F.softmax(widened(z_nat), dim=1).gather(1, y[:, None]).squeeze(1)
        rows = self.ops.row_loss(z_nat, z_adv, y, ce_adv=1.0, kl=self.cfg.method.kl_weight * (1.0 - p_true))
        return rows + boosted_margin(z_adv, y), z_adv
