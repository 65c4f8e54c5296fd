"""FAAL against TrustAI/FAAL: DAW's KL-ball class weights (cvxpy) and ft_prn.py's fine-tuning step
(attack steps, softmax margins, class weights, loss and weight gradient) for --loss AT and TRADES."""
import dataclasses

import torch

from conformance import (FRACTION, K_TOL, REL, STEPS, Check, case, differing, differs, fixed_start, golden, inputs,
                         max_diff, method, one_steps, rel_diff, weight_grad)
from fastfair.methods.faal import batch_weights, kl_ball_weights, softmax_margin

K = 10

# Choices the code does not have, off by default (tests/test_faal.py tests them against other references)
for _what, _key in (("the other ball, KL(w, u) <= rho with w first (the code's is KL(u, w), u first)",
                     'method.divergence = "forward"'),
                    ("classes scored by the method's loss rows, not the softmax margin", 'method.class_loss = "loss"'),
                    ("class means over the classes in the batch, not n_k x mean over all K",
                     'method.aggregate = "mean"')):
    differs("FAAL", _what, _key)


def faal_method(name):
    s = golden("faal").meta["settings"]
    return method(name, f"attack.eps={s['epsilon']}", f"attack.alpha={s['alpha']}", f"attack.steps={s['steps']}",
                  f"method.rho={s['scale']}")


@case("faal-solver")
def solver():
    g = golden("faal")
    ref = g.ref("solver")
    counts, scores, rhos = g.t("solver_counts").double(), g.t("solver_scores"), g.t("solver_rho").tolist()
    p, returned = g.t("solver_p"), g.t("solver_weights")
    worst = worst32 = 0.0
    for i, rho in enumerate(rhos):
        # the code's objective sum_i p[y_i] c[y_i] = sum_k p_k n_k c_k: the scores of aggregate = "sum"
        w = kl_ball_weights(counts[i] * scores[i].double(), rho)
        worst, worst32 = max(worst, max_diff(w, p[i])), max(worst32, max_diff(w, returned[i]))
    n = len(rhos)
    # ECOS solves to ~1e-8; fastfair's bracket of the scalar ends 60 / 23^6 ~ 4e-7 wide in log space, and its
    # weights are float32: ~1e-7 on weights of up to about 0.5
    return [
        Check("FAAL", f"KL(u, w) <= rho class weights, {n} made-up score vectors, rho in "
                      f"{{{', '.join(f'{r:g}' for r in sorted(set(rhos)))}}}", ref, worst, 1e-6),
        Check("FAAL", "the same vs the float32 weights solve_weight returns", ref, worst32, 1e-6),
    ]


def finetune(name, prefix):
    g, inp = golden("faal"), inputs()
    ref = g.ref()
    label = {"at": "FAAL-AT", "trades": "FAAL-TRADES"}[prefix]
    n = g.meta["settings"]["batch"]
    x, y = inp.x[:n], inp.y[:n]
    its, grads = g.t(f"{prefix}_iterates"), g.t(f"{prefix}_step_grads")
    kept = its.shape[1]  # images kept step by step (the attack's BN is in eval mode: each on its own)
    x_adv = g.t(f"{prefix}_x_adv")
    m, state = faal_method(name)
    worst, detail = one_steps(lambda: inp.model("train"), dataclasses.replace(m.attack, steps=1), x, y,
                              state["eps"], state["alpha"], m.cfg.attack.alpha, its, grads)
    with fixed_start(m, its[0]):
        x_k = m.perturb(inp.model("train"), x[:kept], y[:kept], state)
    with torch.no_grad():
        margin = softmax_margin(inp.model("train")(x_adv), y)  # the training forward on x' (train-mode BN)
    rho = m.cfg.method.rho
    w, _ = batch_weights(margin, y, K, rho, "reverse", "sum")
    model = inp.model("train")
    loss, _ = m.objective(model, x, x_adv, y, state)
    return [
        Check(label, "one attack step from each of the code's x_k", ref, worst, 0,
              STEPS, detail),
        Check(label, "K-step attack from the code's start", ref, differing(x_k, its[-1]),
              K_TOL, FRACTION),
        # softmax probabilities in float32: rounding ~1e-7
        Check(label, "softmax margin (the code's cw) on the code's x_adv", ref,
              max_diff(margin, g.t(f"{prefix}_margin")), 1e-6),
        Check(label, f"class weights of the batch (rho {rho}, 2 classes absent)", ref,
              max_diff(w, g.t(f"{prefix}_weights")), 1e-6),
        # float32 loss of a few units: rounding ~1e-6
        Check(label, "weighted fine-tuning loss on the code's x_adv", ref,
              max_diff(loss.detach(), g.t(f"{prefix}_loss")), 1e-5),
        Check(label, "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t(f"{prefix}_weight_grad")), 1e-5, REL),
    ]


@case("faal-at")
def faal_at():
    return finetune("faal-at", "at")


@case("faal-trades")
def faal_trades():
    return finetune("faal-trades", "trades")
