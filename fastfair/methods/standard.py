"""Standard (non-adversarial) training: CE(f(x), y)."""
from fastfair import ops
from fastfair.methods.base import METHODS, Method


@METHODS.register("standard", "natural training, CE(f(x), y); label smoothing via method.smoothing")
class Standard(Method):
    def perturb(self, model, x, y, state):
        return x

    def loss(self, model, x, x_adv, y, state):
        z = model(x)
        return ops.get().row_loss(None, z, y, ce_adv=1.0, smoothing=self.cfg.method.smoothing).mean(), z
