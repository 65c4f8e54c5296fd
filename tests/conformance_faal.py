"""FAAL against TrustAI/FAAL: DAW's KL-ball class weights (cvxpy) and ft_prn.py's fine-tuning step
(attack steps, softmax margins, class weights, loss and weight gradient) for --loss AT and TRADES."""
import dataclasses
import math

import torch

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, Tol, case, differing, differs,
                         fixed_start, gamma, golden, inputs, logit_tol, max_diff, method, one_steps, rel_diff,
                         softmax_tol, unit, weight_grad, weight_grad_tol)
from fastfair.methods.faal import FAAL, batch_weights, kl_ball_weights, softmax_margin

K = 10
ECOS = 1e-8  # cvxpy's ECOS default absolute and relative tolerances (abstol, reltol, feastol)
BRACKET = 60 / 23 ** 6  # the width, in log space, at which fastfair's bracketing of the dual scalar stops


def solver_tol(ref, rounded: bool) -> Tol:
    """KL-ball weights of fastfair's solver against the code's cvxpy (ECOS): ECOS's own accuracy, plus fastfair's
    bracket on the dual scalar: the root and the scalar returned both lie in the final bracket, so they differ by
    at most its log-space width, and a weight moves relatively by that times its log-derivative in the scalar,
    taken as at most 2 (not derived: the one factor here that is assumed); plus one rounding within u of the
    weight where a side rounds it to the precision (``rounded``). Both solvers stop at their own tolerance, not
    at rounding: the bound is the same ~8e-7 in float64 as in float32 (the code's ECOS and fastfair's bracket
    solve in float64 in either run)."""
    top = float(torch.as_tensor(ref).double().abs().max())
    value = ECOS + (2 * BRACKET + (unit() if rounded else 0.0)) * top
    return Tol(value, "ECOS 1e-8 + (2·60/23^6" + (" + u" if rounded else "") + ")·max|w|")


def batch_weights_tol(margin, y, rho, margin_err: float) -> Tol:
    """Both sides' error of the batch's class weights: each class's float32 sum of its rows' margins errs by
    n_k margin_err + gamma(n_k) sum|margins| (Higham & Mary 2019, Thm 3.1), carried to first order through the
    weights' derivative w.r.t. the class sums (float64 central differences of fastfair's solver), sqrt(2) for
    the two sides, plus the solvers' own accuracy (:func:`solver_tol`)."""
    v = margin.double()
    sums = torch.zeros(K, dtype=torch.float64).index_add(0, y, v)
    counts = torch.zeros(K, dtype=torch.float64).index_add(0, y, torch.ones_like(v))
    abs_sums = torch.zeros(K, dtype=torch.float64).index_add(0, y, v.abs())
    err = counts * margin_err + torch.tensor([gamma(max(int(c), 1)) for c in counts], dtype=torch.float64) * abs_sums
    h = 1e-4
    carried = torch.zeros(K, dtype=torch.float64)
    for k in range(K):
        step = torch.zeros(K, dtype=torch.float64)
        step[k] = h
        d = (kl_ball_weights(sums + step, rho) - kl_ball_weights(sums - step, rho)).double() / (2 * h)
        carried += d.abs() * err[k]
    w = kl_ball_weights(sums, rho)
    value = math.sqrt(2) * float(carried.max()) + solver_tol(w, True).value
    return Tol(value, "√2 Σ_k |dw/dc_k|·(n_k margin error + gamma(n_k)·Σ|margins|) + solver")


def code_weights(m, model, x, x_adv, y, state, w, w_code) -> torch.Tensor:
    """What fastfair's loss would be with the code's class weights: the loss is linear in them,
    (1/N) sum_i K w_{y_i} row_i (ft_prn.py: ``(loss_ce * weights[y]).sum() * valid_num / len(y)``), so their
    difference (checked on its own, within the solvers' tolerance, far above float64's rounding) moves it by
    exactly (1/N) sum_i K (w - w_code)_{y_i} row_i, here taken out, with its gradient: the loss and weight
    gradient checks then bound rounding alone."""
    rows, _ = super(FAAL, m).loss(model, x, x_adv, y, state)  # the rows before FAAL's weighting
    return (K * (w - w_code).to(rows.dtype)[y] * rows).mean()


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
    return [
        Check("FAAL", f"KL(u, w) <= rho class weights, {n} made-up score vectors, rho in "
                      f"{{{', '.join(f'{r:g}' for r in sorted(set(rhos)))}}}", ref, worst, solver_tol(p, False)),
        Check("FAAL", "the same vs the weights solve_weight returns (.float() of them)", ref, worst32,
              solver_tol(returned, True)),
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
    # a margin is a difference of two probabilities: twice the softmax's bound
    margin_tol = Tol(2 * softmax_tol(model, x_adv).value, "2 × softmax_tol (a difference of two probabilities)")

    def exact_loss(net):
        return m.objective(net, x, x_adv, y, state)[0]

    loss = loss - code_weights(m, model, x, x_adv, y, state, w, g.t(f"{prefix}_weights"))
    return [
        Check(label, "one attack step from each of the code's x_k", ref, worst, ONE_STEP,
              STEPS, detail),
        Check(label, "K-step attack from the code's start", ref, differing(x_k, its[-1]),
              K_STEP, FRACTION),
        Check(label, "softmax margin (the code's cw) on the code's x_adv", ref,
              max_diff(margin, g.t(f"{prefix}_margin")), margin_tol),
        Check(label, f"class weights of the batch (rho {rho}, 2 classes absent)", ref,
              max_diff(w, g.t(f"{prefix}_weights")),
              batch_weights_tol(g.t(f"{prefix}_margin"), y, rho, margin_tol.value / math.sqrt(2))),
        Check(label, "weighted fine-tuning loss on the code's x_adv, at the code's class weights", ref,
              max_diff(loss.detach(), g.t(f"{prefix}_loss")), logit_tol(exact_loss, model)),
        Check(label, "weight gradient on the code's x_adv, at the code's class weights", ref,
              rel_diff(weight_grad(model, loss), g.t(f"{prefix}_weight_grad")), weight_grad_tol(exact_loss, model),
              REL),
    ]


@case("faal-at")
def faal_at():
    return finetune("faal-at", "at")


@case("faal-trades")
def faal_trades():
    return finetune("faal-trades", "trades")
