"""BAT against silvercherry/Improving-Robust-Fairness-via-Balance-Adversarial-Training: each of its two early-stopped
attacks step by step, its stop rule and the point a stopped row keeps (fastfair's engine walked over the code's own
steps), the K-step attacks from the code's starts, and the loss and its weight gradient on the code's examples.
fastfair's method comes from the preset that follows the code."""
import contextlib
import dataclasses

import torch

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, case, differing, differs, exact, golden,
                         inputs, kl_grad, logit_tol, max_diff, rel_diff, routing_ties, step_flips, weight_grad,
                         weight_grad_tol)
from conformance_fat import code_grad, decode
from fastfair import config
from fastfair.attacks.pgd import attack_mode, descend
from fastfair.methods import METHODS
from fastfair.training.class_state import ClassState

PRESET = "trix-rebuttal-t1-bat"  # the preset that follows the code
# golden trace name -> (the method's attribute holding that attack, what it makes)
ATTACKS = {"lastclean": ("last_clean_attack", "last clean example"),
           "firstadv": ("attack", "first adversarial example")}

differs("BAT", "row order: the code returns each attack's stopped rows first (the first adversarial example's then "
               "shuffled) and trains on them in that order; fastfair keeps the batch's order (the loss is a mean, BN "
               "statistics do not depend on the order)", "(no key)")


def bat_method():
    """(BAT from the code-following preset, its 10-class ClassState), CPU."""
    m = METHODS.get("bat")(config.resolve(PRESET))
    state = ClassState(10, "cpu")
    m.setup(state)
    return m, state


@contextlib.contextmanager
def served(m, name, start, steps=None):
    """Within the block, attack ``name`` of ``m`` starts from ``start``; with ``steps`` (the code's iterates) each
    of its PGD steps gives the code's next iterate for the rows the code moved and NaN for the others."""
    attr = ATTACKS[name][0]
    attack = getattr(m, attr)
    count = []

    def step(x_adv, grad, x, y, eps_c, alpha_c):
        k = len(count)
        count.append(k)
        return torch.where(steps["moved"][k].view(-1, 1, 1, 1), steps["its"][k + 1], torch.nan)

    ops = dataclasses.replace(attack.ops, random_start=lambda x, y, eps_c, kind: start.clone(),
                              **({"pgd_step": step} if steps else {}))
    setattr(m, attr, dataclasses.replace(attack, ops=ops))
    try:
        yield getattr(m, attr)
    finally:
        setattr(m, attr, attack)


def attack_checks(g, m, state, name, x, y):
    """One step from each of the code's x_k (the rows it moved), the engine's stops over the code's steps, K steps."""
    ref, what = g.ref(name), ATTACKS[name][1]
    attack = getattr(m, ATTACKS[name][0])
    alpha = m.cfg.attack.alpha
    its, moved, codes = decode(g.arrays, name, x, alpha), g.t(f"{name}.moved"), g.t(f"{name}.codes")
    one = dataclasses.replace(attack, steps=1, stop=None)
    worst = flips = 0
    for k in range(len(codes)):
        model = inputs().model("eval")
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            ours = descend(one, model, x, y, state["eps"], state["alpha"], its[k])
            routed = routing_ties(model, its[k])
            grad = code_grad(codes[k])
            if one.objective == "kl":
                grad = kl_grad(model, x, its[k], grad)
        ours = torch.where(moved[k].view(-1, 1, 1, 1), ours, its[k + 1])  # the rows the code stopped: the rule's
        n, unexplained = step_flips(ours, its[k + 1], grad, alpha, routed)
        flips, worst = flips + n, max(worst, unexplained)
    with served(m, name, its[0], {"its": its, "moved": moved}) as walked:
        stops = walked(inputs().model("eval"), x, y, state["eps"], state["alpha"])
    return [
        Check("BAT", f"{what}: one attack step from each of the code's x_k (the rows it moves)", ref, worst, ONE_STEP,
              STEPS,
              f"{flips} noise flips in {len(codes)} steps"),
        Check("BAT", f"{what}: the rows each check stops and the point each keeps (fastfair's engine over the "
                     "code's steps)", ref, max_diff(stops, its[-1]), exact("the code's own iterates, kept or not")),
    ]


@case("bat")
def bat():
    g, inp = golden("bat"), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    m, state = bat_method()
    out = []
    for name in ATTACKS:
        out += attack_checks(g, m, state, name, x, y)
    alpha = m.cfg.attack.alpha
    code = {name: decode(g.arrays, name, x, alpha) for name in ATTACKS}
    with served(m, "lastclean", code["lastclean"][0]), served(m, "firstadv", code["firstadv"][0]):
        x_fa = m.perturb(inp.model("train"), x, y, state)
    x_lc = m.x_last_clean
    out.append(Check("BAT", "K-step attacks from the code's starts (last clean and first adversarial examples)",
                     g.ref(), max(differing(x_lc, code["lastclean"][-1]), differing(x_fa, code["firstadv"][-1])),
                     K_STEP, FRACTION))
    m.x_last_clean = code["lastclean"][-1]
    model = inp.model("train")
    loss, _ = m.objective(model, x, code["firstadv"][-1], y, state)

    def exact_loss(net):
        return m.objective(net, x, code["firstadv"][-1], y, state)[0]

    ref = g.ref("loss")
    return out + [
        Check("BAT", "loss on the code's last clean and first adversarial examples", ref,
              max_diff(loss.detach(), g.t("loss")), logit_tol(exact_loss, model)),
        Check("BAT", "weight gradient on the code's examples", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
    ]
