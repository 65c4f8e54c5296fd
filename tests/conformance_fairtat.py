"""FAIR-TAT against TejaswiniMedi/FAIR-TAT (index versions, tests/golden/gen_fairtat.py): train_epoch's target draw
(its distribution, the uniform first epoch, the one-collision batch), cw_pgd_loss's targeted attack step by step and
from the code's start, the loss and its weight gradient, the logger's per-class statistics, and the epoch loop's
class-wise eps and target distribution over five epochs of made-up logits. fastfair's method comes from the preset
that follows the code."""
from unittest import mock

import torch

from conformance import (LAMBDA, REL, U64, Check, Tol, case, differs, exact, gamma, golden, inputs, logit_tol,
                         max_diff, rel_diff, rounded, unit, weight_grad, weight_grad_tol, worst_of)
from conformance_fat import attack_checks, decode
from fastfair import config
from fastfair.methods import METHODS, fair_tat
from fastfair.training.class_state import ClassState

PRESET = "trix-rebuttal-t1-fair-tat"  # the preset that follows the code
DRAW = "max abs diff of P(target given label), the code's counted"


def eps_tol(ref) -> Tol:
    """fastfair's eps_k = (0.5 + A_k) 8/255 in the precision against the code's, in float64 in either run (numpy):
    ours A_k through percent and back (two roundings, each within u eps_k once scaled), the sum and the product,
    four roundings of eps_k's size; the code's sum and product two more of float64's."""
    top = float(torch.as_tensor(ref).double().abs().max())
    return Tol((4 * unit() + 2 * U64) * top, "(4u + 2u64)·max|ref|: A_k ×100 and back, + 0.5, × eps; the code's "
                                             "+ 0.5, × eps")


def probs_tol(ref, scores) -> Tol:
    """fastfair's softmax of ``scores`` in the precision against the code's, in float64 in either run (its scores
    are numpy's): on each side the scores' own rounding (u |s|) moves p_i by at most p_i 2u max|s|, the exponent
    s - max rounds within u of 2 max|s| more, the exponentials and division within 3u of p_i, the C-term sum
    within gamma(C) of it; ours at the precision's u, the code's at float64's."""
    p, s = ref.double(), float(torch.as_tensor(scores).double().abs().max())
    c = p.shape[-1]
    side = [gamma(c, u) + 3 * u + 4 * u * s for u in (unit(), U64)]
    return Tol(float(p.max()) * sum(side), "p (gamma(C) + 3u + 4u·max|s|), + the same at u64: the code's")


def draw_tol(counts, p) -> Tol:
    """The code's P(target | label) counted over n draws a label (20,000) against the exact ``p``: each count is
    binomial, sd sqrt(p (1 - p) / n); LAMBDA (6) sd, so the 100 entries' false alarm is below 1e-7 a run. A changed
    rule moves it further: scores F instead of 2 F by 0.064, uniform targets by 0.11."""
    n = counts.sum(1, keepdim=True).double()
    sd = (p * (1 - p) / n).sqrt()
    return Tol(LAMBDA * float(sd.max()), f"{LAMBDA:g} sd of a binomial count of n = {int(n.min())} draws")

differs("FAIR-TAT", "per-class accuracy A_k of CCM's eps: fastfair counts correct_k / n_k, the code K tp_k / N (equal "
                    "on a class-balanced split, as the code's 4,900 training images a class)", "(no key)")
differs("FAIR-TAT", "the code runs two clean forwards a step in train mode that no loss reads (its unused kldiv "
                    "term's and its logger's); they only move BN running statistics and are not run", "(no key)")
differs("FAIR-TAT", "an epoch without a misclassified training example: the code's false-positive shares divide 0 "
                    "by 0 (NaN scores, torch.multinomial fails); fastfair's are 0, so the next targets are uniform",
        "(no key)")


def fair_tat_method():
    m = METHODS.get("fair-tat")(config.resolve(PRESET))
    state = ClassState(10, "cpu")
    m.setup(state)
    return m, state


def after_epoch(m, state, epoch: int, acc, fp) -> None:
    """``m.end_epoch`` with a train result: per-class robust accuracy (fractions) and false-positive shares."""
    m.end_epoch(state, epoch, {"train_acc_per_class": (torch.as_tensor(acc).double() * 100).tolist(),
                               "statistics": {"false_positives": torch.as_tensor(fp)}})


@case("fair-tat-step")
def step():
    g = golden("fairtat")
    ref = g.ref("attack")
    m, state = fair_tat_method()
    after_epoch(m, state, 0, g.t("last_acc"), g.t("last_fp"))
    inp, n = inputs(), g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    y_t = g.t("y_t")
    with mock.patch.object(m, "targets", lambda y, state: y_t.clone()):  # the code's draw of this batch
        checks = attack_checks("FAIR-TAT", ref, m, state, g, "attack", lambda: inp.model("train"), x, y,
                               targets=(y_t, torch.ones_like(y, dtype=torch.bool)))
    model = inp.model("train")
    loss, logits = m.objective(model, x, decode(g.arrays, "attack", x, m.cfg.attack.alpha)[-1], y, state)
    state.count(logits, y, loss.detach())
    stats = state.read()
    tp = torch.tensor(stats["train_acc_per_class"]).double() / 100 * torch.bincount(y, minlength=10)

    def exact_loss(net):
        return m.objective(net, x, decode(g.arrays, "attack", x, m.cfg.attack.alpha)[-1], y, state)[0]

    return [
        Check("FAIR-TAT", "class-wise eps (0.5 + A_y) 8/255 of the batch, from the last epoch's accuracy",
              g.ref("calibration"), max_diff(state["eps"][y], g.t("class_eps")[y]), eps_tol(g.t("class_eps")[y])),
        Check("FAIR-TAT", "target distribution softmax(2 F), F the last epoch's false-positive shares",
              g.ref("targets"), max_diff(fair_tat.target_probs(state[fair_tat.SCORES]), g.t("probs")),
              probs_tol(g.t("probs"), state[fair_tat.SCORES])),
        *checks,
        Check("FAIR-TAT", "loss CE(f(x'), y) on the code's x_adv (train mode)", ref,
              max_diff(loss.detach(), g.t("loss")), logit_tol(exact_loss, model)),
        Check("FAIR-TAT", "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
        Check("FAIR-TAT", "the step's robust true positives per class and false-positive shares", g.ref("statistics"),
              max(max_diff(tp, g.t("tp")), max_diff(stats["statistics"]["false_positives"], g.t("fp"))),
              statistics_tol(g.t("tp"), g.t("fp"))),
    ]


def statistics_tol(tp, fp) -> Tol:
    """Counts are exact; what rounds is their scaling: tp_k from accuracy in percent (a division, x 100, / 100,
    x n_k: four roundings of tp_k's size), the false-positive share one division (float32: one of its size). The
    reference rounds as often: twice that."""
    return worst_of([rounded(tp, 8, "tp: 4 on each side"), rounded(fp, 2, "fp share: 1 on each side")])


@case("fair-tat-loop")
def epochs():
    g = golden("fairtat_loop")
    m, state = fair_tat_method()
    y, order, adv = g.t("labels"), g.t("batch_order"), g.t("adv_logits")
    batch = g.meta["loop"]["batch_size"]
    eps = probs = stat = 0.0
    probs_tols = []
    for e in range(len(adv)):
        eps = max(eps, max_diff(state["eps"], g.t("class_eps")[e]))
        if e:  # the first epoch draws uniform targets (checked by fair-tat-draw)
            probs = max(probs, max_diff(fair_tat.target_probs(state[fair_tat.SCORES]), g.t("probs")[e]))
            probs_tols.append(probs_tol(g.t("probs")[e], state[fair_tat.SCORES]))
        for idx in order.split(batch):
            state.count(adv[e][idx], y[idx], torch.zeros(()))
        stats = state.read()
        stat = max(stat, max_diff(torch.tensor(stats["train_acc_per_class"]) / 100, g.t("acc")[e]),
                   max_diff(stats["statistics"]["false_positives"], g.t("fp")[e]))
        m.end_epoch(state, e, stats)
    epochs = f"{len(adv)} epochs of {len(y)} images, made-up logits"
    return [
        Check("FAIR-TAT", f"per-class robust accuracy and false-positive shares of each epoch ({epochs})",
              g.ref("statistics"), stat, rounded(torch.cat([g.t("acc"), g.t("fp")], 1), 4,
                                                 "acc ×100, /100, fp share: on each side")),
        Check("FAIR-TAT", f"class-wise eps each epoch trains with ({epochs})", g.ref("calibration"), eps,
              eps_tol(g.t("class_eps"))),
        Check("FAIR-TAT", f"target distribution each epoch draws from, from the second ({epochs})",
              g.ref("calibration"), probs, worst_of(probs_tols)),
    ]


def conditional(counts: torch.Tensor) -> torch.Tensor:
    return counts.double() / counts.sum(1, keepdim=True)


def uniform_for(p: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """u with fair_tat.pick(p, u) == classes: the middle of each class's interval of 1 - u."""
    c = p.double().cumsum(0)
    low = torch.cat([torch.zeros(1, dtype=c.dtype), c[:-1]])
    return (1 - (low + c)[classes] / 2 / c[-1]).to(p.dtype)


@case("fair-tat-draw")
def draws():
    g = golden("fairtat_draw")
    ref = g.ref("targets")
    scores = 2 * torch.tensor(g.meta["shares"])
    p = fair_tat.target_probs(scores)
    labels = torch.arange(10)
    # fastfair's exact distribution: a first draw from p, redrawn from p without the label where it hit it
    ours = fair_tat.redraw_distribution(p, labels).double()
    uniform_p = (1 - torch.eye(10, dtype=torch.float64)) / 9
    quirk = {}
    for name in ("one", "two"):
        y, first = g.t("labels_quirk"), g.t(f"{name}.first")
        u = iter([uniform_for(p, first), torch.zeros(len(y))])
        with mock.patch.object(torch, "rand", lambda *a, **k: next(u)):
            quirk[name] = fair_tat.confusion_targets(y, scores)
    code_one, code_two = g.t("one.y_t"), g.t("two.y_t")
    redrawn = g.t("two.first") == g.t("labels_quirk")
    return [
        Check("FAIR-TAT", "target distribution p of the draw (softmax of the made-up scores)", ref,
              max_diff(p, g.t("probs")), probs_tol(g.t("probs"), scores)),
        Check("FAIR-TAT", "P(target given label) in the second epoch: fastfair's exact, the code's over 200,000 draws",
              ref, max_diff(ours, conditional(g.t("counts_epoch1"))), draw_tol(g.t("counts_epoch1"), ours), DRAW),
        Check("FAIR-TAT", "P(target given label) in the first epoch (uniform over the other classes): the code's "
                          "get_rand_target over 200,000 draws", ref,
              max_diff(uniform_p, conditional(g.t("counts_epoch0"))), draw_tol(g.t("counts_epoch0"), uniform_p), DRAW),
        Check("FAIR-TAT", "a batch whose first draw hits its label once keeps it (the code's 0-dim squeeze)", ref,
              float((quirk["one"] != code_one).sum()), exact("targets from the same uniforms"), "targets differing"),
        Check("FAIR-TAT", "a batch whose first draw hits twice redraws both, the rest kept", ref,
              float((quirk["two"][~redrawn] != code_two[~redrawn]).sum()
                    + (quirk["two"][redrawn] == g.t("labels_quirk")[redrawn]).sum()),
              exact("targets from the same uniforms"), "targets differing"),
    ]
