"""TRADES (Zhang et al. 2019) and ME-TRADES (ME paper, Sec. 3.2.1)."""
from .. import ops
from .base import METHODS, Method

TRADES_ATTACK = {"attack.objective": "kl", "attack.init": "normal", "attack.bn_mode": "eval"}


@METHODS.register("trades", "TRADES, CE(f(x), y) + lambda KL(p(x) || p(x')), lambda 6 (Zhang et al. 2019)")
class TRADES(Method):
    """CE(f(x), y) + lambda KL(p(x)||p(x')) - beta H(p(x)) (TRADES Eq. 5; ME paper, L_ME-TRADES)."""

    defaults = {**TRADES_ATTACK, "method.kl_weight": 6.0, "method.entropy_weight": 0.0}

    def loss(self, model, x, x_adv, y, state):
        m = self.cfg.method
        # Two forward passes, as in the TRADES code: BN sees natural and adversarial batches apart.
        z_nat, z_adv = model(x), model(x_adv)
        rows = ops.get().row_loss(z_nat, z_adv, y, ce_nat=1.0, kl=m.kl_weight, ent_nat=m.entropy_weight,
                                  smoothing=m.smoothing)
        return rows.mean(), z_adv


@METHODS.register("me-trades", "maximum-entropy TRADES, TRADES - beta H(p(x)), beta 1, lambda 27 (ME paper, Table 2)")
class METRADES(TRADES):
    defaults = {**TRADES_ATTACK, "method.kl_weight": 27.0, "method.entropy_weight": 1.0}
