"""ME paper's single adversarial training (Sec. 2.1): adversarial examples for chosen classes only.

A per-class 0/1 factor on eps: the other classes' "adversarial" examples are the clean images
(PGD inside an eps = 0 ball returns x), so the same step trains them normally, with no sync.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.options import OPTIONS, Option


@OPTIONS.register("adv-classes", "adversarial examples only for method.adv_classes, clean training for the rest (ME paper Sec. 2.1)")
class AdvClasses(Option):
    eps_factor = "eps_adv_mask"

    @staticmethod
    def enabled(cfg) -> bool:
        return bool(cfg.method.adv_classes)

    def setup(self, state):
        classes = self.cfg.method.adv_classes
        if any(not 0 <= k < state.num_classes for k in classes):
            raise UserError(f"method.adv_classes takes class indices in 0..{state.num_classes - 1}; got {classes}")
        mask = torch.zeros(state.num_classes)
        mask[classes] = 1.0
        state.add_vector(self.eps_factor, mask)
