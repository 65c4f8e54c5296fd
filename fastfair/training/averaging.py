"""Weight averaging across epochs: plain EMA and CFA's fairness-aware FAWA (Wei et al. 2023, Sec. 4.3).

Once per epoch, after validation: avg <- d avg + (1 - d) w over every floating-point tensor of
the state dict (BN running statistics included, as in CFA's code; integer counters are copied).
The first accepted epoch copies the weights. FAWA accepts an epoch only when the worst-class
robust accuracy of the *trained* model on the validation split reaches the threshold; EMA
accepts every epoch from ``train.avg_begin``. The trainer validates and checkpoints the
averaged model next to the trained one (``best_<policy>_avg.pt`` for each selection policy, ``last_avg.pt``).
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from fastfair.config import Config
from fastfair.registry import Registry

AVERAGING: Registry = Registry("weight averaging")


class WeightAverage:
    """Per-epoch exponential moving average of a model's weights, with an optional fairness gate."""

    def __init__(self, model: nn.Module, decay: float, begin: int, threshold: float | None):
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.decay, self.begin, self.threshold = decay, begin, threshold
        self.started = False

    def accepts(self, epoch: int, worst_val_robust: float) -> bool:
        """Whether epoch ``epoch`` is averaged in (FAWA: worst-class val robust accuracy in [0, 1] >= threshold)."""
        return epoch >= self.begin and (self.threshold is None or worst_val_robust >= self.threshold)

    @torch.no_grad()
    def update(self, model: nn.Module, epoch: int, worst_val_robust: float) -> bool:
        """avg <- d avg + (1 - d) w when the epoch is accepted (CFA Sec. 4.3); returns whether it was."""
        if not self.accepts(epoch, worst_val_robust):
            return False
        src = model.state_dict()
        for name, t in self.model.state_dict().items():
            if self.started and t.is_floating_point():
                t.mul_(self.decay).add_(src[name].to(t.dtype), alpha=1.0 - self.decay)
            else:
                t.copy_(src[name])
        self.started = True
        return True

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "started": self.started}

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.started = bool(state["started"])


AVERAGING.register("none", "no weight averaging")(lambda model, t: None)
AVERAGING.register("ema", "EMA of the weights once per epoch from train.avg_begin (CFA's EMA baseline)")(
    lambda model, t: WeightAverage(model, t.avg_decay, t.avg_begin, None))
AVERAGING.register("fawa", "FAWA: EMA that skips epochs whose worst-class val robust acc < train.avg_threshold (CFA)")(
    lambda model, t: WeightAverage(model, t.avg_decay, t.avg_begin, t.avg_threshold))


def build(cfg: Config, model: nn.Module) -> WeightAverage | None:
    return AVERAGING.get(cfg.train.averaging)(model, cfg.train)
