"""ABSLD against zhaoshiji123/ABSLD: the epoch loop's soft labels, per-class error risks and temperatures over six
epochs through the first rate decay (made-up logits), and on the fixed images the attack step by step, the K-step
attack, the loss and its weight gradient, the error risks and the temperatures after the epoch. fastfair's method
comes from the preset that follows the code, with ``Inputs.teacher()`` as its teacher."""
import dataclasses

import torch

from torch.nn import functional as F

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, Tol, case, ce_sums_tol, differing,
                         differs, fixed_start, gamma, golden, head_bound, inputs, logit_tol, max_diff, rel_diff,
                         rounded, steps_from_code, unit, weight_grad, weight_grad_tol, worst_of)
from fastfair import config
from fastfair.training import optim
from fastfair.methods import METHODS
from fastfair.methods.absld import TEMPERATURES, soft_label_logits
from fastfair.training.class_state import ClassState

PRESET = "trix-rebuttal-t1-absld"  # the preset that follows the code
# q = z / tau_adv / tau_nat: two divisions on each side, in either order, each within u |q|: DIVISIONS u |q|
DIVISIONS = 4
BOUND = "max abs diff / its bound"

differs("ABSLD", "loss value: the code's log(q + 1e-5) in the teacher's entropy term adds a constant of the student "
                 "(the gradient is the same); fastfair's loss is below the code's by it (at most 1e-5)", "(no key)")
differs("ABSLD", "the code's two temperature vectors divide one tensor in place under two names, so both terms see "
                 "z_T / tau_adv / tau_nat (fastfair's default); separate: each term over its own temperature",
        "method.teacher_scaling")
differs("ABSLD", "a class temperature update where every class has the same error risk: the code divides 0 by 0 "
                 "(NaN temperatures); fastfair leaves the temperatures as they were", "(no key)")


def absld_method(teacher=None):
    """(ABSLD from the code-following preset with the conformance teacher, its 10-class ClassState), CPU."""
    cfg = config.resolve(PRESET, {"method.teacher": "the conformance teacher"}, [])
    m = METHODS.get("absld")(cfg)
    m.teacher = inputs().teacher() if teacher is None else teacher
    state = ClassState(10, "cpu")
    m.setup(state)
    return m, state


def set_temperatures(state, tau):
    for (vector, _), t in zip(TEMPERATURES, tau):
        state.set(vector, t)


def temperature_tol(updates) -> Tol:
    """Both sides' error of temperatures after the ``updates`` (each: temperatures before, the risks, the rate,
    the risks' error from :func:`ce_sums_tol`), by temperature_update's tau - rate (L - mean L) / max |L - mean L|:
    a risk error d moves the gap by at most 2 d and its max likewise, so the ratio (of size <= 1) by at most
    4 d / max|gap|, which the rate scales; the mean of C risks rounds within gamma(C) max|L| on each side (as a
    risk error of twice that); the division, product and difference round within u of max(|tau|, rate) each,
    three on each side. An epoch's error carries into the next (the clip to [low, high] does not grow it)."""
    err = 0.0
    for tau, risk, rate, risk_err in updates:
        risk = risk.double()
        gap = risk - risk.mean()
        d = risk_err + 2 * gamma(len(risk)) * float(risk.abs().max())
        err += rate * 4 * d / float(gap.abs().max()) + 2 * 3 * unit() * max(float(tau.abs().max()), rate)
    return Tol(err, "Σ epochs (rate·4 risk error / max|gap| + 6u·max(|tau|, rate))")


@case("absld-loop")
def temperatures():
    g = golden("absld_loop")
    ref = g.ref()
    m, state = absld_method(teacher=torch.nn.Identity())
    y, order = g.t("labels"), g.t("batch_order")
    start, batch = g.meta["loop"]["start_epochs"], g.meta["loop"]["batch_size"]
    risks, taus, soft, risk_tols, updates = [], [], [], [], []
    for e in range(len(g.t("tau_adv"))):
        logits = {k: g.t(f"{k}_logits")[e] for k in ("teacher", "nat", "adv")}
        q_adv, _ = soft_label_logits(logits["teacher"][order], state["absld_temp_adv"][y[order]],
                                     state["absld_temp_nat"][y[order]], m.cfg.method.teacher_scaling)
        soft.append(max_diff(q_adv, g.t("q_logits")[e]))
        for idx in order.split(batch):
            state.count({"adv": logits["adv"][idx], "nat": logits["nat"][idx]}, y[idx], torch.zeros(()))
        stats = state.read()
        risks.append(max(max_diff(stats["statistics"]["ce_sum_adv"], g.t("risk_adv")[e]),
                         max_diff(stats["statistics"]["ce_sum_nat"], g.t("risk_nat")[e])))
        risk_tol = worst_of([ce_sums_tol(logits["adv"], y), ce_sums_tol(logits["nat"], y)])
        risk_tols.append(risk_tol)
        # 0-based epoch start + e is the code's 1-based start + e + 1; the trainer hands the next epoch's lr
        lr_next = optim.schedule(m.cfg.train)(start + e + 1, 0.0)
        updates.append([(state[vector].clone(), g.t(key)[e], m.temperature_rate(lr_next), risk_tol.value)
                        for (vector, _), key in zip(TEMPERATURES, ("risk_adv", "risk_nat"))])
        m.end_epoch(state, start + e, {**stats, "lr_next": lr_next})
        taus.append(max(max_diff(state["absld_temp_adv"], g.t("tau_adv")[e]),
                        max_diff(state["absld_temp_nat"], g.t("tau_nat")[e])))
    epochs = f"{len(taus)} epochs, {start + 1}-{start + len(taus)}, the rate's decay after {start + 3}"
    return [
        Check("ABSLD", f"soft-label logits z_T / tau_adv[y] / tau_nat[y] handed to the attack ({epochs})", ref,
              max(soft), rounded(g.t("q_logits"), 4, "two divisions on each side")),
        Check("ABSLD", f"per-class error risks: sums of CE on x' and on x ({epochs})", ref, max(risks),
              worst_of(risk_tols)),
        Check("ABSLD", f"class temperatures tau_adv, tau_nat after each epoch's update ({epochs})", ref, max(taus),
              worst_of([temperature_tol(u) for u in zip(*updates)])),
    ]


@case("absld-step")
def step():
    g = golden("absld")
    ref = g.ref()
    m, state = absld_method()
    set_temperatures(state, g.t("tau"))
    inp, n = inputs(), g.t("x_adv").shape[0]
    x, y = inp.x[:n], inp.y[:n]
    q_adv, q_nat = m.distil_from(x, y, state)
    # each side's teacher logits within head_bound of the exact ones, then divided by the temperatures (two roundings)
    tau = state["absld_temp_adv"][y] * state["absld_temp_nat"][y]
    q_bound = head_bound(inp.teacher(), x) / tau[:, None] + DIVISIONS * unit() * q_adv.abs()
    one = dataclasses.replace(m.attack, steps=1)
    worst, detail = steps_from_code(g, lambda: inp.model("train"), one, x, y, state["eps"], state["alpha"],
                                    m.cfg.attack.alpha, reference=q_adv)
    with fixed_start(m, g.t("x_start")):
        x_adv = m.perturb(inp.model("train"), x, y, state)
    model = inp.model("train")
    loss, logits = m.objective(model, x, g.t("x_adv"), y, state)
    # the code's loss adds sum q log(1 + 1e-5 / q) / C per row and term (its log(q + 1e-5)): no gradient
    a = m.cfg.method.adv_weight
    offset = sum(w * (q * (torch.log(q + 1e-5) - torch.log(q))).mean()
                 for w, q in ((a, q_adv.softmax(1)), (1 - a, q_nat.softmax(1))))
    state.count(logits, y, loss.detach())
    stats = state.read()
    taus_before = [state[vector].clone() for vector, _ in TEMPERATURES]
    lr_next = optim.schedule(m.cfg.train)(1, 0.0)
    m.end_epoch(state, 0, {**stats, "lr_next": lr_next})

    def exact_loss(net):
        return m.objective(net, x, g.t("x_adv"), y, state)[0]

    def risks(net):  # the statistics' per-class CE sums, of the exact logits
        named = m.objective(net, x, g.t("x_adv"), y, state)[1]
        return torch.cat([torch.zeros(10, dtype=torch.float64).index_add(
            0, y, F.cross_entropy(named[k], y, reduction="none")) for k in ("adv", "nat")])

    risk_tol = logit_tol(risks, model)
    tau_tol = worst_of([temperature_tol([(tau, g.t(key), m.temperature_rate(lr_next), risk_tol.value)])
                        for tau, key in zip(taus_before, ("risk_adv", "risk_nat"))])
    return [
        Check("ABSLD", "soft-label logits of the teacher's clean forward (both terms)", g.ref("soft labels"),
              max(float(((q - g.t(key)).double().abs() / q_bound).max())
                  for q, key in ((q_adv, "q_adv_logits"), (q_nat, "q_nat_logits"))),
              Tol(1.0, "per element: head_bound / tau + 4u|q|"), BOUND),
        Check("ABSLD", "one attack step (KL to the soft labels) from each of the code's x_k", ref, worst, ONE_STEP,
              STEPS, detail),
        Check("ABSLD", "K-step attack from the code's start", ref, differing(x_adv, g.t("x_adv")), K_STEP, FRACTION),
        Check("ABSLD", "loss on the code's x_adv, plus the code's 1e-5 constant", g.ref("loss"),
              max_diff(loss.detach() + offset, g.t("loss")), logit_tol(exact_loss, model),
              detail=f"the constant: {float(offset):.1e}"),
        Check("ABSLD", "weight gradient on the code's x_adv", g.ref("loss"),
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
        Check("ABSLD", "per-class error risks of the step's train-mode forwards", g.ref("risk"),
              max(max_diff(stats["statistics"]["ce_sum_adv"], g.t("risk_adv")),
                  max_diff(stats["statistics"]["ce_sum_nat"], g.t("risk_nat"))), risk_tol),
        Check("ABSLD", "class temperatures after the epoch's update", g.ref("temperatures"),
              max(max_diff(state["absld_temp_adv"], g.t("tau_after")[0]),
                  max_diff(state["absld_temp_nat"], g.t("tau_after")[1])), tau_tol),
    ]
