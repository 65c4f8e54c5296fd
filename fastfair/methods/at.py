"""PGD-AT (Madry et al. 2018) and ME-AT (ME paper, Sec. 3.2.1): CE(f(x'), y) - beta H(p(x'))."""
import dataclasses

from fastfair import rules
from fastfair.methods.base import METHODS, SMOOTHING, Method
from fastfair.schema import Key, Tune

AT_ATTACK = {"attack.objective": "ce", "attack.init": "uniform", "attack.bn_mode": "train",
             "ccm.lambda_1": 0.5}  # CFA's lambda_1 for AT (Sec. 5.1)


@METHODS.register("pgd-at", "PGD adversarial training, CE(f(x'), y) (Madry et al. 2018)")
class PGDAT(Method):
    """CE(f(x'), y) - entropy_weight * H(p(x')) (Madry et al. 2018, Eq. 2.1; ME paper, L_ME-AT)."""

    keys = {**SMOOTHING,
            "entropy_weight": Key(0.0, "ME-AT beta: weight of the entropy bonus H(p(x')) (ME paper, Sec. 3.2.1)",
                                  valid=rules.at_least(0))}
    defaults = {**AT_ATTACK, "method.entropy_weight": 0.0}
    uses_ce_logits = True
    untuned = ("its loss has no knob of its own: the entropy bonus and label smoothing make it ME-AT (tune me-at) and "
               "PGD-AT + LS, and attack.* is the threat model every contender shares")

    def loss(self, model, x, x_adv, y, state):
        m = self.cfg.method
        z_adv = model(x_adv)
        rows = self.ops.row_loss(None, self.ce_logits(model, z_adv, y), y, ce_adv=1.0, ent_adv=m.entropy_weight,
                                 smoothing=m.smoothing)
        return rows, z_adv


@METHODS.register("me-at", "maximum-entropy PGD-AT, CE(f(x'), y) - beta H(p(x')), beta 0.5 (ME paper, Table 3)")
class MEAT(PGDAT):
    keys = {"entropy_weight": dataclasses.replace(
        PGDAT.keys["entropy_weight"], tune=Tune(0.25, 2.0, "log", source="ME paper Table 3: beta 0.5 and 1; "
                                                                          "log [0.25, 2] around them"))}
    defaults = {**AT_ATTACK, "method.entropy_weight": 0.5}
