"""DAFA against rucy74/DAFA: class weights (utils.py), the warm-up of train.py's loop through fastfair's
softmax_by_class statistic, and dafa-trades / dafa-at (losses.py trades_loss / madry_loss): attack
steps, K-step result, loss, weight gradient, for each paper-vs-code key."""
import dataclasses
import math

import torch

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, Tol, case, differing, differs, fixed_start,
                         gamma, golden, inputs, kl_grad, logit_tol, max_diff, method, rel_diff, rounded, routing_ties,
                         softmax_tol, step_flips, unit, weight_grad, weight_grad_tol)
from fastfair.attacks.pgd import attack_mode, descend
from fastfair.methods.dafa import SIMILARITY, descend_twice


def similarity_weights_tol(logits, y, lam: float, ref, roundings: int) -> Tol:
    """Both sides' rounding error of DAFA's W (Lee et al. 2024, Alg. 2) from the class similarity of
    ``logits`` (a list of (N, C), each an epoch's; the worst) with labels ``y``, against ``ref``: each softmax
    element within p (gamma(C) + 3u + 2u max|z|) of its exact value (the exponent z - max rounds within u of
    its size, the exponential, division and C-term sum as :func:`softmax_tol`); a class's mean of n_c of them
    within gamma(n_c) of it more: the similarity error d. W = 1 + lambda sum over the C - 1 other classes of +-
    a product of two similarities (each <= 1), so W moves by at most lambda 2 (C - 1) d; sqrt(2) for ours and
    the reference; then ``roundings`` roundings within u of |W| (stored in the state's dtype, W eps / eps ...)."""
    worst = 0.0
    for z in logits:
        z = z.double()
        classes = z.shape[1]
        p = z.softmax(1)
        err = p * (gamma(classes) + 3 * unit() + 2 * unit() * z.abs().amax(1, keepdim=True))
        for c in y.unique():
            rows = y == c
            d = gamma(int(rows.sum())) * p[rows].mean(0) + err[rows].mean(0)
            worst = max(worst, float(d.max()) * lam * 2 * (classes - 1))
    return Tol(math.sqrt(2) * worst + rounded(ref, roundings, "").value,
               f"√2 lambda 2 (C-1)·similarity error + {roundings}u·max|W|")


def stored_weights(ref, lam: float) -> Tol:
    """W = 1 + lambda sum_j +-p_i(j) p_j(j) from the same similarity on both sides, summed in another order
    (vectorised here, a Python loop in the code): on each side a C-term sum within gamma(C) of its sum of |terms|,
    at most 1 + lambda (a row of p sums to 1, p_j(j) <= 1), each product within u of it (Higham & Mary 2019,
    Thm 3.1); sqrt(2) for both sides, then one rounding to the state's dtype, within u of |W|."""
    classes = ref.shape[-1]
    return Tol(math.sqrt(2) * (gamma(classes) + unit()) * (1 + lam) + rounded(ref, 1, "").value,
               "√2 (gamma(C) + u)(1 + lambda) + u·max|W|: W's C-term sum on each side, stored")


differs("DAFA", "exact tie p_i(i) == p_j(j): the code subtracts as the easier class, the paper's Algorithm 2 "
                "skips the pair (presets: code)", "method.tie_subtracts")
differs("DAFA", "dafa-trades: the code weights only the natural CE term by W_y; `row` weights the whole TRADES row "
                "(Algorithm 1 does not split it; presets: code)", "method.weight_terms")
differs("DAFA", "dafa-at: the code's attack takes a second unscaled step per iteration onto the uniform eps ball; "
                "false: the paper's eps_k = W_k eps bounds x' (presets: code)", "method.second_step")
differs("DAFA", "floor W at 0 (neither paper nor code; off in presets)", "method.clamp_negative")


def paper_ref(g, quantity: str) -> str:
    """The reference of a quantity the generator evaluated from the paper (``Golden.ref`` names the file's code)."""
    return g.meta["sources"][quantity]["reference"]


def set_weights(m, state, w) -> None:
    """The class weights ``w`` in ``state`` as DAFA's end_epoch sets them (W, and every factor W scales)."""
    state.set("dafa_weight", w)
    for _, factor in m.weighted_factors():
        state.set(factor, w)


def end_epoch_weights(sim: torch.Tensor, lam: float, *sets: str) -> torch.Tensor:
    """W fastfair sets after a 1-epoch warm-up whose training adversarial softmax had class similarity ``sim``."""
    m, state = method("dafa-trades", f"method.dafa_lambda={lam}", "method.warmup=1", *sets)
    m.end_epoch(state, 0, {"statistics": {SIMILARITY: sim}})
    return state["dafa_weight"].clone()


@case("dafa-weights")
def weights():
    g = golden("dafa_weights")
    sims, lams = g.t("similarities"), g.t("lambdas").tolist()
    code, paper = g.t("code_weights"), g.t("paper_weights")

    def worst(ref, *sets):
        return max(max_diff(end_epoch_weights(s, lam, *sets), ref[i, k])
                   for i, s in enumerate(sims) for k, lam in enumerate(lams))

    return [
        Check("DAFA", f"class weights W from {len(sims)} made-up similarity matrices (one with exact diagonal ties) "
                      f"x lambda {lams}, tie_subtracts = true (code)", g.ref(),
              worst(code, "method.tie_subtracts=true"), stored_weights(code, max(lams))),
        Check("DAFA", "the same with tie_subtracts = false (paper; equal to the code's where no tie)",
              paper_ref(g, "paper_weights"), worst(paper, "method.tie_subtracts=false"),
              stored_weights(paper, max(lams))),
        Check("DAFA", "the same with clamp_negative = true: the code's W floored at 0 (lambda 3 makes some negative)",
              g.ref(), worst(code.clamp(min=0), "method.clamp_negative=true"),
              stored_weights(code, max(lams))),
    ]


def _run_loop(m, state, y, logits, order, batch):
    """The class weights ``m`` trains each epoch with (W, eps_k / eps, alpha_k / alpha), feeding the made-up
    logits to ClassState.count batch by batch in the code's order and calling end_epoch after each epoch."""
    used = []
    for epoch in range(logits.shape[0]):
        used.append(torch.stack([state["dafa_weight"], state["eps"] / state.bases["eps"],
                                 state["alpha"] / state.bases["alpha"]]))
        for idx in order.split(batch):
            state.count(logits[epoch][idx], y[idx], torch.zeros(()))
        m.end_epoch(state, epoch, state.read())
    return used


def loop_check(method_name: str, golden_name: str, who: str) -> Check:
    g = golden(golden_name)
    loop = g.meta["loop"]
    m, state = method(method_name, f"method.warmup={loop['dafa_warmup']}", f"method.dafa_lambda={loop['dafa_lambda']}",
                      f"train.epochs={loop['epochs']}")
    used = _run_loop(m, state, g.t("labels"), g.t("logits"), g.t("batch_order"), loop["batch_size"])
    ref = g.t("weights_used")
    diff = max(max_diff(u, ref[e].expand_as(u)) for e, u in enumerate(used))
    # W, then W eps / eps and W alpha / alpha: the float32 W, its product and the quotient
    tol = similarity_weights_tol(g.t("logits"), g.t("labels"), loop["dafa_lambda"], ref, 3)
    return Check(who, f"{method_name}: W, eps_k / eps and alpha_k / alpha in each of {loop['epochs']} epochs (warm-up "
                      f"{loop['dafa_warmup']}), from made-up training softmax through the softmax_by_class statistic",
                 g.ref("weights_used"), diff, tol)


@case("dafa-loop")
def warm_up():
    return [loop_check("dafa-trades", "dafa_loop", "DAFA"), loop_check("dafa-at", "dafa_loop", "DAFA")]


def attack_method(name: str, golden_name: str, *sets: str):
    g = golden(golden_name)
    s = g.meta["settings"]
    beta = () if name == "dafa-at" else (f"method.kl_weight={s['beta']}",)
    m, state = method(name, f"attack.eps={s['epsilon']}", f"attack.alpha={s['pgd_step_size']}",
                      f"attack.steps={s['pgd_num_steps']}", *beta, *sets)
    set_weights(m, state, torch.tensor(g.meta["class_weights"]))
    return m, state


def step_check(who, quantity, ref, g, take_step, model, one) -> Check:
    """One step of ``take_step(x, y, x_k)`` from each of the code's x_k of the golden's step rows, ``model`` in the
    BN mode of the attack ``one`` deciding which elements a float32 routing tie may step either way
    (:func:`routing_ties`) and, for the kl objective, which gradient elements lie within float32 error of 0
    (:func:`kl_grad`)."""
    inp = inputs()
    pick, rows = g.t("pick"), g.t("step_rows")
    x, y = inp.x[pick][rows], inp.y[pick][rows]
    its, grads = g.t("step_iterates"), g.t("step_grads")
    w = torch.tensor(g.meta["class_weights"])[y]
    alpha = w * g.meta["settings"]["pgd_step_size"]
    worst = flips = 0
    for k in range(len(grads)):
        ours = take_step(x, y, its[k])
        with attack_mode(model, one.bn_mode):
            routed = routing_ties(model, its[k])
            grad = kl_grad(model, x, its[k], grads[k]) if one.objective == "kl" else grads[k]
        n, unexplained = step_flips(ours, its[k + 1], grad, alpha, routed)
        flips, worst = flips + n, max(worst, unexplained)
    return Check(who, quantity, ref, worst, ONE_STEP, STEPS,
                 f"{flips} noise flips in {len(grads)} steps of {len(rows)} rows")


def loss_checks(who, label, m, state, g, ref) -> list[Check]:
    inp = inputs()
    pick = g.t("pick")
    x, y, x_adv = inp.x[pick], inp.y[pick], g.t("x_adv")
    model = inp.model("train")
    loss, logits = m.objective(model, x, x_adv, y, state)

    def exact_loss(net):
        return m.objective(net, x, x_adv, y, state)[0]

    return [
        Check(who, f"{label}: loss on the code's x_adv (non-uniform W)", ref, max_diff(loss.detach(), g.t("loss")),
              logit_tol(exact_loss, model)),
        Check(who, f"{label}: weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
        Check(who, f"{label}: softmax the class similarity reads (the loss's train-mode forward of x_adv)", ref,
              max_diff(logits.detach().softmax(1), g.t("stored_probs")), softmax_tol(model, x_adv)),
    ]


def k_step(m, g) -> float:
    """Fraction of elements where fastfair's K-step attack from the code's x_0 differs from the code's x_adv."""
    inp = inputs()
    pick = g.t("pick")
    m, state = m
    with fixed_start(m, g.t("x_start")):
        x_adv = m.perturb(inp.model("train"), inp.x[pick], inp.y[pick], state)
    return differing(x_adv, g.t("x_adv"))


@case("dafa-trades")
def dafa_trades():
    g = golden("dafa_trades")
    ref = g.ref()
    m, state = attack_method("dafa-trades", "dafa_trades", "method.weight_terms=ce")
    one = dataclasses.replace(m.attack, steps=1)
    model = inputs().model("train")

    def take_step(x, y, x_k):
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            return descend(one, model, x, y, state["eps"], state["alpha"], x_k)

    row_m, row_state = attack_method("dafa-trades", "dafa_trades", "method.weight_terms=row")
    inp, pick = inputs(), g.t("pick")
    row_loss, _ = row_m.objective(inp.model("train"), inp.x[pick], g.t("x_adv"), inp.y[pick], row_state)

    def row_exact(net):
        return row_m.objective(net, inp.x[pick], g.t("x_adv"), inp.y[pick], row_state)[0]

    return [
        step_check("DAFA", "dafa-trades: one attack step (eps_y, alpha_y = W_y eps, W_y alpha) from each of the "
                           "code's x_k", ref, g, take_step, model, one),
        Check("DAFA", "dafa-trades: K-step attack from the code's start", ref, k_step((m, state), g), K_STEP,
              FRACTION),
        *loss_checks("DAFA", "dafa-trades weight_terms = ce (code)", m, state, g, ref),
        Check("DAFA", "dafa-trades weight_terms = row: loss on the code's x_adv", paper_ref(g, "row_loss_paper"),
              max_diff(row_loss.detach(), g.t("row_loss_paper")), logit_tol(row_exact, inp.model("train"))),
    ]


@case("dafa-at")
def dafa_at():
    g = golden("dafa_at")
    ref = g.ref()
    m, state = attack_method("dafa-at", "dafa_at", "method.second_step=true")
    one = dataclasses.replace(m.attack, steps=1)
    model = inputs().model("train")

    def take_step(x, y, x_k):
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            return descend_twice(one, model, x, y, state["eps"], state["alpha"], state.bases["eps"],
                                 state.bases["alpha"], x_k)

    paper_m, paper_state = attack_method("dafa-at", "dafa_at", "method.second_step=false")
    inp, pick = inputs(), g.t("pick")
    with fixed_start(paper_m, g.t("x_start")):
        x_paper = paper_m.perturb(inp.model("train"), inp.x[pick], inp.y[pick], paper_state)
    eps_y = paper_state["eps"][inp.y[pick]].view(-1, 1, 1, 1)
    return [
        step_check("DAFA", "dafa-at second_step = true (code): one attack step (scaled step onto eps_y, then unscaled "
                           "onto eps) from each of the code's x_k", ref, g, take_step, model, one),
        Check("DAFA", "dafa-at: K-step attack from the code's start", ref, k_step((m, state), g), K_STEP,
              FRACTION),
        *loss_checks("DAFA", "dafa-at", m, state, g, ref),
        Check("DAFA", "dafa-at second_step = false (paper): x' from the code's start stays within eps_y = W_y eps",
              paper_ref(g, "eps_bound_paper"), max(0.0, float(((x_paper - inp.x[pick]).abs() - eps_y).max())),
              # x +- eps_y rounds within u (1 + eps_y), the difference x' - x within u eps_y
              Tol(unit() * (1 + 2 * float(eps_y.max())), "u (1 + 2 eps_y): the projection's bound and the difference"),
              "max excess over eps_y"),
    ]
