"""Methods without public code against their papers' equations, evaluated in float64 by
``tests/golden/gen_paper.py`` (ME-AT, ME-TRADES, label smoothing, class-wise beta, HE and its LIS /
CMP schedules, Temperature-PGD, cost-sensitive weights, CV and MCD).

The references are float64 from the same weights and images; fastfair computes in float64 (the check) and in
float32 (the smoke check), and the tolerances are both sides' rounding in the precision (``sides=2``, which in
float32 also covers the float64 reference's, 2^-29 of fastfair's): loss rows through
:func:`conformance.logit_tol`, gradients through :func:`conformance.weight_grad_tol`, per-class
arithmetic on ten numbers by its roundings, and a step direction to zero elements unexplained by the
sign noise of :func:`conformance.step_flips`.
"""
import dataclasses

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from conformance import (ONE_STEP, REL, STEPS, U64, Check, Tol, case, gamma, golden, head_bound, inputs,
                         logit_tol, max_diff, method, rel_diff, relative, routing_ties, step_flips, unit, weight_grad,
                         weight_grad_tol)
from fastfair.attacks.names import parse_attack
from fastfair.attacks.pgd import attack_mode, descend
from fastfair.evaluation import measures
from fastfair.methods.he import cmp_scale, cmp_target
from fastfair.models.heads import CosineHead



def g():
    return golden("paper")


def x_adv() -> torch.Tensor:
    return g().t("x_adv_uint8").to(inputs().x.dtype) / 255.0


def setting(name: str, key: str):
    return g().meta["settings"][name][key]


def rows_check(method_name: str, quantity: str, key: str, ours: torch.Tensor, tol: Tol) -> Check:
    """``ours`` against the rows ``key``, ``tol`` the absolute bound (made relative to the rows' largest here)."""
    ref = g().t(key)
    return Check(method_name, quantity, g().ref(key), rel_diff(ours.detach(), ref), relative(tol, ref), REL)


def loss_checks(method_name: str, name: str, m, state, model_fn=None, tag: str = "") -> list[Check]:
    """Per-sample rows of ``m.loss`` and the weight gradient of their mean, against ``name.rows`` /
    ``name.weight_grad``, on the fixed (x, x_adv) with a fresh train-mode model."""
    inp = inputs()
    model = (model_fn or (lambda: inp.model("train")))()
    rows, _ = m.loss(model, inp.x, x_adv(), inp.y, state)
    tag = f" ({tag})" if tag else ""

    def exact_rows(net):
        return m.loss(net, inp.x, x_adv(), inp.y, state)[0]

    out = [rows_check(method_name, f"per-sample loss rows on the fixed x_adv{tag}", f"{name}.rows", rows,
                      logit_tol(exact_rows, model, sides=2))]
    if f"{name}.weight_grad" in g().arrays:
        # the reference leaves out the samples whose max-pool near-ties float32 may route otherwise
        keep = g().t("grad_keep")
        key = f"{name}.weight_grad"
        out.append(Check(method_name, f"weight gradient of the batch mean, max-pool near-ties left out{tag}",
                         g().ref(key), rel_diff(weight_grad(model, (rows * keep).sum() / len(rows)), g().t(key)),
                         weight_grad_tol(lambda net: (exact_rows(net) * keep).sum() / len(rows), model, sides=2),
                         REL))
    return out


@case("me-at")
def me_at():
    m, state = method("me-at", f"method.entropy_weight={setting('me_at', 'beta')}")
    return loss_checks("ME-AT", "me_at", m, state, tag=f"beta {setting('me_at', 'beta'):g}")


@case("me-trades")
def me_trades():
    m, state = method("me-trades", f"method.kl_weight={setting('me_trades', 'lambda')}",
                      f"method.entropy_weight={setting('me_trades', 'beta')}")
    out = loss_checks("ME-TRADES", "me_trades", m, state,
                      tag=f"lambda {setting('me_trades', 'lambda'):g}, beta {setting('me_trades', 'beta'):g}")
    # the paper's two forms agree in float64 (asserted by the generator); the concise one is the code's
    model = inputs().model("train")
    rows, _ = m.loss(model, inputs().x, x_adv(), inputs().y, state)
    exact_rows = logit_tol(lambda net: m.loss(net, inputs().x, x_adv(), inputs().y, state)[0], model, sides=2)
    out.append(rows_check("ME-TRADES", "per-sample rows against the concise form", "me_trades.rows_concise", rows,
                          exact_rows))
    return out


@case("label-smoothing")
def label_smoothing():
    a = setting("ls", "alpha")
    m, state = method("pgd-at", f"method.smoothing={a}")
    out = loss_checks("label smoothing", "ls_at", m, state, tag="PGD-AT+LS")
    m, state = method("trades", f"method.smoothing={a}", f"method.kl_weight={setting('ls', 'trades_lambda')}")
    return out + loss_checks("label smoothing", "ls_trades", m, state, tag="TRADES+LS")


@case("classwise-beta")
def classwise_beta():
    beta = setting("classwise_beta", "beta")
    m, state = method("trades", "method.kl_weight_per_class=[" + ",".join(map(str, beta)) + "]")
    return loss_checks("class-wise beta", "classwise_beta", m, state)


class HENet(nn.Module):
    """TinyNet's features under HE's cosine head holding TinyNet's class weights (fc.weight; no bias)."""

    def __init__(self, mode: str, scale: float):
        super().__init__()
        tiny = inputs().model(mode)
        self.features = tiny.features
        self.head = CosineHead(16 * 8 * 8, 10, scale)
        with torch.no_grad():
            self.head.weight.copy_(tiny.fc.weight)
        self.train(mode == "train")

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


@case("he")
def he():
    inp = inputs()
    s, mg = setting("he_at", "s"), setting("he_at", "m")
    net = HENet("eval", s)
    with torch.no_grad():
        logits = net(inp.x)
    bound = float(head_bound(net, inp.x).max())
    out = [rows_check("HE", "logits s cos(W_k, z) (eval BN, on x)", "he.logits", logits,
                      Tol(bound, "head_bound: s gamma(n)(Σ|h w| + |cos|), 2x features"))]
    m, state = method("pgd-at", "model.head=cosine", f"model.head_scale={s}", f"he.margin={mg}")
    out += loss_checks("HE", "he_at", m, state, lambda: HENet("train", s), tag=f"PGD-HE, s {s:g}, m {mg:g}")
    s, mg, lam = (setting("he_trades", k) for k in ("s", "m", "lambda"))
    m, state = method("trades", "model.head=cosine", f"model.head_scale={s}", f"he.margin={mg}",
                      f"method.kl_weight={lam}")
    return out + loss_checks("HE", "he_trades", m, state, lambda: HENet("train", s),
                             tag=f"TRADES-HE, s {s:g}, m {mg:g}, lambda {lam:g}")


def schedule_scales(schedule: str, epochs: range, *sets: str) -> torch.Tensor:
    m, _ = method("pgd-at", "model.head=cosine", "model.head_scale=1", f"he.schedule={schedule}", *sets)
    net = HENet("eval", 1.0)
    out = []
    for n in epochs:
        m.begin_epoch(net, n)
        out.append(float(net.head.scale))
    return torch.tensor(out, dtype=torch.float64)


@case("he-lis")
def he_lis():
    p = g().meta["settings"]["lis"]
    ours = schedule_scales("lis", range(p["n_fi"]), f"he.scale_end={p['inv_tfi']}", f"train.epochs={p['n_fi']}")
    return [Check("HE-LIS", "head scale 1/T of each epoch", g().ref("lis.scale"),
                  rel_diff(ours, g().t("lis.scale")), Tol(unit(), "u: the scale is a buffer of the precision"), REL)]


XTOL = 1.49012e-08  # MINPACK hybrd's default relative tolerance on the solution (scipy.optimize.root, "hybr")


def cmp_scale_tol(targets) -> Tol:
    """s solving Eq. 3 from the Gram matrix of the float32 class weights (fastfair) against the float64 reference:
    each Gram entry is a dot product of FEATURES unit-row elements, within gamma(FEATURES) of its sum of |terms|;
    s is monotone in each entry, so the Gram matrix moved by that bound, all up or all down, brackets it
    (the relative change of s is the bound), plus each side's solver tolerance on log s."""
    w = F.normalize(inputs().state["fc.weight"].double(), dim=1)
    gram = (w @ w.t()).numpy()
    delta = gamma(w.shape[1]) * (w.abs() @ w.abs().t()).numpy()
    worst = 0.0
    for t in targets:
        s = cmp_scale(t, gram)
        worst = max(worst, *(abs(cmp_scale(t, gram + sign * delta) / s - 1) for sign in (1, -1)))
    return Tol(worst + 2 * XTOL, "|s(Gram ± gamma(n)|W||W|ᵀ) / s - 1| + 2 xtol")


@case("he-cmp")
def he_cmp():
    p = g().meta["settings"]["cmp"]
    targets = torch.tensor([cmp_target(n, p["p0"], p["pfi"], p["n_fi"]) for n in range(p["n_tot"])],
                           dtype=torch.float64)
    # P^max = 1 needs s = infinity (Eq. 3): fastfair caps it (docs/methods.md), so s is compared below n_FI
    ours = schedule_scales("cmp", range(p["n_fi"]), f"he.pmax_start={p['p0']}", f"he.pmax_end={p['pfi']}",
                           f"he.pmax_epoch={p['n_fi']}")
    return [
        # both float64 (Python floats) in either precision: a linear interpolation's three roundings on each side
        Check("HE-CMP", "controlled maximum probability P^max_n of each epoch", g().ref("cmp.target"),
              max_diff(targets, g().t("cmp.target", torch.float64)),
              Tol(6 * U64 * float(g().t("cmp.target").abs().max()), "float64: 3 roundings a side, 6 u64·max|ref|")),
        Check("HE-CMP", "head scale s solving Eq. 3 for P^max_n, epochs before n_FI", g().ref("cmp.scale"),
              rel_diff(ours, g().t("cmp.scale")), cmp_scale_tol(targets[:p["n_fi"]].tolist()), REL),
    ]


# A sample the model still classifies correctly with 1 - S(f(x)/T)_y below this has a float32
# gradient dominated by rounding: S_y rounds to 1, so (S - onehot)_y is 0 in float32 while the
# float64 reference keeps -sum_{j != y} S_j. Its direction is float32's limit, not the equation's.
SATURATED = 1e-4


@case("temperature-pgd")
def temperature_pgd():
    inp = inputs()
    gd = g()
    s = gd.meta["settings"]["tpgd"]
    xk = x_adv()
    eps_c = torch.full((10,), s["eps"])
    alpha_c = torch.full((10,), s["alpha"])
    worst = flips = skipped = 0
    for i, inv_t in enumerate(s["inverse_t"]):
        attack = dataclasses.replace(parse_attack(f"tpgd1@t{1 / inv_t:g}").pgd, steps=1)
        model = inp.model("eval")
        with attack_mode(model, attack.bn_mode), torch.enable_grad():
            ours = descend(attack, model, inp.x, inp.y, eps_c, alpha_c, xk)
            routed = routing_ties(model, xk)  # the same point at every temperature: T scales the logits only
        code = gd.t("tpgd.direction")[i].double()
        # Eq. 4: one step along the reference direction, projected onto the eps-ball and [0, 1]
        x64 = inp.x.double()
        ref = torch.minimum(torch.maximum(xk.double() + s["alpha"] * code.sign(), x64 - s["eps"]), x64 + s["eps"])
        ref = ref.clamp(0, 1)
        keep = gd.t("tpgd.p_true")[i] < 1 - SATURATED
        skipped += int((~keep).sum())
        # step_flips reads noise from |grad| / its sample's max: code 2 marks float32's noise elements, 3 float64's
        noise = code.abs() >= (3 if inp.x.dtype == torch.float64 else 2)
        proxy = torch.where(noise, 0.0, 1.0)
        n, unexplained = step_flips(ours[keep], ref[keep], proxy[keep], s["alpha"], routed[keep])
        flips, worst = flips + n, max(worst, unexplained)
    return [Check("Temperature-PGD", "one step from a fixed point, 1/T in {1, 2, 5, 10, 50}", gd.ref("tpgd.direction"),
                  worst, ONE_STEP, STEPS,
                  f"{flips} noise flips; skipped: {skipped} saturated sample-temperatures")]


@case("cost-sensitive")
def cost_sensitive():
    inp = inputs()
    gd = g()
    w = gd.meta["settings"]["cost_sensitive"]["weights"]
    m, state = method("pgd-at", "cost_sensitive.weights=[" + ",".join(map(str, w)) + "]")
    model = inp.model("train")
    loss, _ = m.objective(model, inp.x, x_adv(), inp.y, state)
    tol = logit_tol(lambda net: m.objective(net, inp.x, x_adv(), inp.y, state)[0], model, sides=2)
    out = [Check("cost-sensitive", "objective mean_i w_y CE_i with given class weights", gd.ref("cs.objective"),
                 rel_diff(loss.detach(), gd.t("cs.objective")), relative(tol, gd.t("cs.objective")), REL)]
    m, state = method("pgd-at", "cost_sensitive.auto=true")
    ours = []
    for epoch, acc in enumerate(gd.arrays["cs.acc"]):
        m.end_epoch(state, epoch, {"train_acc_per_class": acc.tolist()})
        ours.append(state["loss_weight"].clone())
    # accuracies pass through a tensor of the precision (one rounding, relative u), the weights' normalisation over
    # the C classes is a C-term sum (gamma(C)) and a few operations (3u), each relative to the weight
    ref = gd.t("cs.auto_weights")
    out.append(Check("cost-sensitive", "auto class weights after each epoch, from made-up accuracies",
                     gd.ref("cs.auto_weights"), max_diff(torch.stack(ours), ref),
                     Tol((4 * unit() + gamma(ref.shape[-1])) * float(ref.abs().max()), "(4u + gamma(C))·max|w|")))
    return out


@case("measures")
def cv_mcd():
    gd = g()
    acc = gd.arrays["measures.acc"]
    cv = np.array([measures.cv(a) for a in acc])
    mcd = np.array([measures.mcd(a) for a in acc])
    summ_cv = np.array([measures.summary(a)["cv"] for a in acc])
    summ_mcd = np.array([measures.summary(a)["mcd"] for a in acc])
    table = gd.arrays["table1.acc"]
    # Both in float64 on the same ten numbers: only the summation order differs. CV is a mean of C non-negative
    # squares of differences from a C-term mean: each sum within gamma64(C) of its value (no cancellation), the
    # deviations' error 2 gamma64(C) |a| |a - mean| summed (at most 2 gamma64(C) max|a| sqrt(C CV) by
    # Cauchy-Schwarz), on each side. MCD is one float64 difference: within u64 of it on each side.
    top = float(np.abs(acc).max())
    cv_ref = gd.t("measures.cv", torch.float64)  # numpy's float64 on both sides, in either precision
    n = acc.shape[-1]
    cv_tol = Tol(2 * float((gamma(n, U64) * 2 * cv_ref + 2 * gamma(n, U64) * top * (n * cv_ref).sqrt()).max()),
                 "2 (2 gamma64(C)·CV + 2 gamma64(C)·max|a|·sqrt(C·CV))")
    return [
        Check("CV", "CV of made-up per-class accuracies (and summary()['cv'])", gd.ref("measures.cv"),
              max(max_diff(cv, cv_ref), max_diff(summ_cv, cv_ref)), cv_tol),
        Check("MCD", "MCD of made-up per-class accuracies (and summary()['mcd'])", gd.ref("measures.mcd"),
              max(max_diff(mcd, gd.t("measures.mcd", torch.float64)),
                  max_diff(summ_mcd, gd.t("measures.mcd", torch.float64))),
              Tol(2 * U64 * float(gd.t("measures.mcd").abs().max()), "2 u64·max|MCD|: one difference a side")),
        # Table 1 prints CV and MCD to 0.1, truncated or rounded (224.36 is printed 224.3; the TRADES row's
        # 80.6 - 29.4 is printed 51.1): the paper's own numbers agree with the definitions to 0.1, plus the
        # rounding of two accuracies to the precision's tensors (fastfair.evaluation.measures), within u of 100 each
        Check("CV", "CV of Tian KDD Table 1's PGD rows against the printed CV", gd.ref("table1.cv"),
              max_diff([measures.cv(a) for a in table], gd.t("table1.cv", torch.float64)), Tol(0.1, "printed to 0.1")),
        Check("MCD", "MCD of Tian KDD Table 1's PGD rows against the printed MCD", gd.ref("table1.mcd"),
              max_diff([measures.mcd(a) for a in table], gd.t("table1.mcd", torch.float64)),
              Tol(0.1 + 2 * unit() * 100, "printed to 0.1, + 2u·100 (the accuracies in the precision)")),
    ]
