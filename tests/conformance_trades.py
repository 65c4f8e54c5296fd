"""TRADES against yaodongyu/TRADES's trades_loss: attack steps, K-step result, loss and weight gradient."""
import dataclasses

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, case, differing, fixed_start, golden, inputs,
                         logit_tol, max_diff, method, rel_diff, steps_from_code, weight_grad, weight_grad_tol)


def code_loss_checks(label: str, name: str, *sets: str, constants=None):
    """The checks of a TRADES-style authors' training loss (golden ``name``, fastfair method ``name`` with the
    code's eps, step, steps and beta, then ``sets``): one step from each of the code's x_k, the K-step result from
    its start, the loss and weight gradient on its x_adv (tolerances: logit_tol, weight_grad_tol). ``constants``:
    (model, x, x_adv, y) -> the code's loss minus fastfair's from constants only the code has, added to
    fastfair's loss before both comparisons (float64 resolves them). Also returns (method, state, x, y) for a
    case's own checks."""
    g, inp = golden(name), inputs()
    s = g.meta["settings"]
    m, state = method(name, f"attack.eps={s['epsilon']}", f"attack.alpha={s['step_size']}",
                      f"attack.steps={s['perturb_steps']}", f"method.kl_weight={s['beta']}", *sets)
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    ref = g.ref()
    worst, detail = steps_from_code(g, lambda: inp.model("train"), dataclasses.replace(m.attack, steps=1), x, y,
                                    state["eps"], state["alpha"], m.cfg.attack.alpha)
    with fixed_start(m, g.t("start")):  # the trainer's model is in train mode; the attack switches its BN mode
        x_adv = m.perturb(inp.model("train"), x, y, state)
    model = inp.model("train")
    loss, _ = m.objective(model, x, g.t("x_adv"), y, state)
    if constants is not None:
        loss = loss + constants(model, x, g.t("x_adv"), y)

    def exact_loss(net):
        return m.objective(net, x, g.t("x_adv"), y, state)[0]

    checks = [
        Check(label, "one attack step from each of the code's x_k", ref, worst, ONE_STEP, STEPS, detail),
        Check(label, "K-step attack from the code's start", ref, differing(x_adv, g.t("x_adv")), K_STEP, FRACTION),
        Check(label, "loss on the code's x_adv", ref, max_diff(loss.detach(), g.t("loss")),
              logit_tol(exact_loss, model)),
        Check(label, "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
    ]
    return checks, (m, state, x, y)


@case("trades")
def trades():
    return code_loss_checks("TRADES", "trades")[0]
