"""TRADES against yaodongyu/TRADES's trades_loss: attack steps, K-step result, loss and weight gradient."""
import dataclasses

import torch

from conformance import (REL, Check, case, fixed_start, golden, inputs, max_diff, method, rel_diff, step_flips,
                         weight_grad)
from fastfair.attacks.pgd import attack_mode, descend


def trades_method():
    s = golden("trades").meta["settings"]
    return method("trades", f"attack.eps={s['epsilon']}", f"attack.alpha={s['step_size']}",
                  f"attack.steps={s['perturb_steps']}", f"method.kl_weight={s['beta']}")


@case("trades")
def trades():
    g, inp = golden("trades"), inputs()
    ref = g.ref()
    m, state = trades_method()
    its, grads = g.t("iterates"), g.t("step_grads")
    alpha = m.cfg.attack.alpha
    one = dataclasses.replace(m.attack, steps=1)
    worst = flips = 0
    model = inp.model("train")
    for k in range(len(grads)):  # one step from the authors' own point x_k
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            ours = descend(one, model, inp.x, inp.y, state["eps"], state["alpha"], its[k])
        n, unexplained = step_flips(ours, its[k + 1], grads[k], alpha)
        flips, worst = flips + n, max(worst, unexplained)
    with fixed_start(m, its[0]):
        x_adv = m.perturb(model, inp.x, inp.y, state)
    model = inp.model("train")
    loss, _ = m.objective(model, inp.x, its[-1], inp.y, state)
    return [
        Check("TRADES", "one attack step from each of the code's x_k", ref, worst, 0,
              "elements not explained by float32 sign noise", f"{flips} noise flips in {len(grads)} steps"),
        Check("TRADES", "K-step attack from the code's start", ref,
              float((x_adv - its[-1]).abs().gt(1e-6).double().mean()), 1e-2, "fraction of elements differing"),
        Check("TRADES", "loss on the code's x_adv", ref, max_diff(loss.detach(), g.t("loss")), 1e-5),
        Check("TRADES", "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), 1e-5, REL),
    ]
