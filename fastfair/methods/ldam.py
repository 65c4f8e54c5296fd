"""LDAM (Cao et al. 2019, "Learning imbalanced datasets with label-distribution-aware margin loss").

The method's CE terms see s (z - Delta_y e_y): the true class's logit lowered by its margin Delta_y =
C / n_y^{1/4} (Cao et al., Eq. 13), with C such that the largest margin (the rarest class's) is
``ldam.max_m``, then scaled by s (their code, kaidic/LDAM-DRW ``LDAMLoss``: max_m 0.5, s 30). The
authors apply s to a normalised head (their ``NormedLinear``: z = cos theta); in fastfair that is
``model.head=cosine`` with ``model.head_scale=1``. With the plain linear head the run warns that s
multiplies raw logits; ``ldam.scale=1`` is then Eq. 13 as the paper writes it. The margin enters the
CE terms only (the ``ce_logits`` hook): TRADES' KL and every attack see the model's own logits. n_y
are the training split's images per class; a class without any gets margin 0 (no sample carries it).
The paper's deferred re-weighting (DRW) schedule is not part of this option.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.base import METHODS
from fastfair.methods.options import Option, register, train_counts
from fastfair.ops.losses import label_mask
from fastfair.schema import Key


def ldam_margins(counts, max_m: float) -> torch.Tensor:
    """Delta_j = C / n_j^{1/4}, C so that max_j Delta_j = max_m (Cao et al. 2019, Eq. 13); 0 where n_j = 0."""
    n = torch.as_tensor(counts, dtype=torch.float64)
    inv = torch.where(n > 0, n.clamp(min=1) ** -0.25, torch.zeros_like(n))
    return (inv * (max_m / inv.max())).float()


@register("ldam", "LDAM: the CE terms see s (z - Delta_y e_y), Delta_y = C / n_y^(1/4) (Cao et al. 2019, Eq. 13)")
class LDAM(Option):
    keys = {"enabled": Key(False, "LDAM margins on the method's CE terms (Cao et al. 2019, Eq. 13)"),
            "max_m": Key(0.5, "the largest margin Delta_j, the rarest class's (Cao et al.'s code: 0.5)"),
            "scale": Key(30.0, "s multiplying the margined logits of the CE terms (Cao et al.'s code: 30, on a "
                               "normalised head: model.head=cosine, model.head_scale=1)")}

    @classmethod
    def enabled(cls, cfg) -> bool:
        # max_m or scale set without ldam.enabled is on, so that check can say they do nothing
        return cfg.ldam.enabled or any(getattr(cfg.ldam, k) != key.default for k, key in cls.keys.items())

    @classmethod
    def check(cls, cfg) -> None:
        m = cfg.ldam
        if not m.enabled:
            raise UserError("ldam.max_m / ldam.scale act only with LDAM on: add --set ldam.enabled=true")
        if not m.max_m > 0 or not m.scale > 0:
            raise UserError(f"ldam.max_m={m.max_m}, ldam.scale={m.scale}: both must be above 0 (Cao et al.'s code: "
                            "0.5 and 30)")
        if not METHODS.get(cfg.method.name).uses_ce_logits:
            raise UserError(f"method {cfg.method.name}'s loss does not route its CE terms through the logits LDAM "
                            "margins; use it with pgd-at, trades or a method built on them, or drop ldam.enabled")

    def setup(self, state):
        self.counts = train_counts(state, "ldam")
        self.margin = ldam_margins(self.counts, self.own.max_m).to(state.device)

    def setup_warnings(self):
        out = []
        n = self.counts[self.counts > 0]
        if int(n.min()) == int(n.max()):
            out.append(f"ldam: every class has {int(n.min())} training images, so every margin is ldam.max_m="
                       f"{self.own.max_m}: a constant margin, not a label-distribution-aware one (LDAM acts on an "
                       "imbalanced training split)")
        if self.cfg.model.head != "cosine" and self.own.scale != 1.0:
            out.append(f"ldam.scale={self.own.scale} multiplies the raw logits of the {self.cfg.model.head} head; "
                       "Cao et al. scale cosine logits: --set model.head=cosine model.head_scale=1, or ldam.scale=1 "
                       "for Eq. 13 on raw logits")
        return out

    def ce_logits(self, model, z, y):
        """s (z - Delta_y e_y): the true class's logit lowered by its margin, then scaled (Cao et al., Eq. 13)."""
        return self.own.scale * (z - label_mask(y, z.shape[1]).to(z.dtype) * self.margin.to(z.dtype))
