"""ME paper's single adversarial training (Sec. 2.1): adversarial examples for chosen classes only.

A per-class 0/1 factor on eps: the other classes' "adversarial" examples are the clean images
(PGD inside an eps = 0 ball returns x), so the same step trains them normally, with no sync.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.options import Option, register
from fastfair.schema import Key


@register("adv_classes", "adversarial examples only for adv_classes.classes, clean training for the rest "
                         "(ME paper Sec. 2.1)")
class AdvClasses(Option):
    keys = {"classes": Key([], "class indices (after data.classes) that get adversarial examples (ME paper, Sec. 2.1)",
                           list[int])}

    @classmethod
    def enabled(cls, cfg) -> bool:
        return bool(cfg.adv_classes.classes)

    def setup(self, state):
        classes = self.own.classes
        if any(not 0 <= k < state.num_classes for k in classes):
            raise UserError(f"adv_classes.classes takes class indices in 0..{state.num_classes - 1}; got {classes}")
        mask = torch.zeros(state.num_classes)
        mask[classes] = 1.0
        state.add_factor("eps", "eps_adv_mask", mask, owner=f"option {self.name}")
