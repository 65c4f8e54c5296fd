"""Standard (non-adversarial) training: CE(f(x), y)."""
from fastfair.methods.base import METHODS, SMOOTHING, Method


@METHODS.register("standard", "natural training, CE(f(x), y); label smoothing via method.smoothing")
class Standard(Method):
    """CE(f(x), y) with label smoothing (Szegedy et al. 2016); no adversarial examples, so no eps_k."""

    keys = SMOOTHING
    adversarial = False
    untuned = "natural training has no robustness knob; label smoothing is a generic trick (ME paper Table 1: 0.1 only)"

    def setup(self, state):
        self.setup_options(state)  # no eps/alpha: options that scale them fail with the reason

    def perturb(self, model, x, y, state):
        return x

    def loss(self, model, x, x_adv, y, state):
        z = model(x)
        return self.ops.row_loss(None, z, y, ce_adv=1.0, smoothing=self.cfg.method.smoothing), z
