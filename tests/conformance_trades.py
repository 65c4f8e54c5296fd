"""TRADES against yaodongyu/TRADES's trades_loss: attack steps, K-step result, loss and weight gradient."""
import dataclasses

from conformance import (FRACTION, K_TOL, REL, STEPS, Check, case, differing, fixed_start, golden, inputs, max_diff,
                         method, rel_diff, steps_from_code, weight_grad)


def trades_method():
    s = golden("trades").meta["settings"]
    return method("trades", f"attack.eps={s['epsilon']}", f"attack.alpha={s['step_size']}",
                  f"attack.steps={s['perturb_steps']}", f"method.kl_weight={s['beta']}")


@case("trades")
def trades():
    g, inp = golden("trades"), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    ref = g.ref()
    m, state = trades_method()
    worst, detail = steps_from_code(g, lambda: inp.model("train"), dataclasses.replace(m.attack, steps=1), x, y,
                                    state["eps"], state["alpha"], m.cfg.attack.alpha)
    with fixed_start(m, g.t("start")):
        x_adv = m.perturb(inp.model("train"), x, y, state)
    model = inp.model("train")
    loss, _ = m.objective(model, x, g.t("x_adv"), y, state)
    return [
        Check("TRADES", "one attack step from each of the code's x_k", ref, worst, 0, STEPS, detail),
        Check("TRADES", "K-step attack from the code's start", ref, differing(x_adv, g.t("x_adv")), K_TOL, FRACTION),
        # float32 sums of 16 rows in another order
        Check("TRADES", "loss on the code's x_adv", ref, max_diff(loss.detach(), g.t("loss")), 1e-5),
        Check("TRADES", "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), 1e-5, REL),
    ]
