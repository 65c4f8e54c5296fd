"""TRADES (Zhang et al. 2019) and ME-TRADES (ME paper, Sec. 3.2.1), with a per-class KL weight.

The KL weight is the per-class vector ``state["kl_weight"]`` gathered by label: the scalar
``method.kl_weight`` for every class or a class-wise beta (``method.kl_weight_per_class``, Tian
et al. KDD 2021), times any factor an option adds (CFA's CCR, :mod:`.cfa`).
"""
import dataclasses

from fastfair import rules
from fastfair.errors import UserError
from fastfair.methods.base import METHODS, SMOOTHING, Method
from fastfair.schema import Key, Tune

TRADES_ATTACK = {"attack.objective": "kl", "attack.init": "normal", "attack.bn_mode": "eval",
                 "ccm.lambda_1": 0.3}  # CFA's lambda_1 for TRADES (Sec. 5.1)


@METHODS.register("trades", "TRADES, CE(f(x), y) + lambda KL(p(x) || p(x')), lambda 6 (Zhang et al. 2019)")
class TRADES(Method):
    """CE(f(x), y) + beta_y KL(p(x)||p(x')) - ent H(p(x)) (TRADES Eq. 5; Tian KDD Eq. 5; ME paper, L_ME-TRADES),
    divided by (1 + beta_y) with method.normalize (CFA Eq. 8)."""

    keys = {
        **SMOOTHING,
        "kl_weight": Key(6.0, "TRADES regulariser weight: beta in TRADES/CFA, lambda in the ME paper "
                              "(Zhang et al. 2019, Eq. 5)",
                         tune=Tune(1.0, 15.0, "log", source="ME paper Sec. 3.2.2: TRADES at lambda 1, 6, 12 (Fig. 9) "
                                                            "and 6 to 15 (Table 2, AA best at 6)"),
                         valid=rules.at_least(0)),
        "entropy_weight": Key(0.0, "ME-TRADES beta: weight of the entropy bonus H(p(x)) (ME paper, Sec. 3.2.1)",
                              valid=rules.at_least(0)),
        "kl_weight_per_class": Key([], "class-wise beta_k, one per class; empty: kl_weight for all "
                                       "(Tian et al. KDD 2021, Eq. 5)", list[float],
                                   valid=rules.each(rules.at_least(0))),
        "normalize": Key(False, "divide each row by (1 + beta_y) (CFA Eq. 8; CFA's code does it even without CCR)"),
    }
    defaults = {**TRADES_ATTACK, "method.kl_weight": 6.0, "method.entropy_weight": 0.0}
    uses_ce_logits = True

    def setup(self, state):
        m = self.cfg.method
        if m.kl_weight_per_class and len(m.kl_weight_per_class) != state.num_classes:
            raise UserError(f"method.kl_weight_per_class needs {state.num_classes} values (one per class); "
                            f"got {len(m.kl_weight_per_class)}")
        state.add_vector("kl_weight", m.kl_weight_per_class or m.kl_weight)
        super().setup(state)

    def ce_weight(self, state, y):
        """Per-sample weight of the natural CE term alone (1.0; DAFA's code weights only this term)."""
        return 1.0

    def loss(self, model, x, x_adv, y, state):
        m = self.cfg.method
        o = self.ops
        # Two forward passes, as in the TRADES code: BN sees natural and adversarial batches apart.
        z_nat, z_adv = model(x), model(x_adv)
        beta = state["kl_weight"][y]
        scale = 1.0 / (1.0 + beta) if m.normalize else 1.0
        ent = m.entropy_weight * scale if m.entropy_weight else 0.0
        ce = self.ce_weight(state, y) * scale
        z_ce = self.ce_logits(model, z_nat, y)
        if z_ce is z_nat:
            rows = o.row_loss(z_nat, z_adv, y, ce_nat=ce, kl=beta * scale, ent_nat=ent, smoothing=m.smoothing)
        else:  # HE: the margin enters the CE term only; the KL compares the unmargined s cos logits
            rows = (o.row_loss(z_ce, None, y, ce_nat=ce, smoothing=m.smoothing)
                    + o.row_loss(z_nat, z_adv, y, kl=beta * scale, ent_nat=ent))
        return rows, z_adv


@METHODS.register("me-trades", "maximum-entropy TRADES, TRADES - beta H(p(x)), beta 1, lambda 27 (ME paper, Table 2)")
class METRADES(TRADES):
    keys = {"kl_weight": dataclasses.replace(
                TRADES.keys["kl_weight"], tune=Tune(6.0, 30.0, "log", source="ME paper Table 2: ME-TRADES lambda 15 "
                                                                               "to 27, TRADES 6 to 15")),
            "entropy_weight": dataclasses.replace(
                TRADES.keys["entropy_weight"], tune=Tune(0.25, 4.0, "log", source="ME paper Table 2 keeps beta 1; "
                                                                                  "no ablation, x/4 .. 4x around it"))}
    defaults = {**TRADES_ATTACK, "method.kl_weight": 27.0, "method.entropy_weight": 1.0}
