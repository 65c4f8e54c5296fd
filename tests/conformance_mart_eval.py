"""MART against YisenWang/MART's mart_loss, and the PGD-20 evaluation attack against the TRADES and MART
code's _pgd_whitebox: one step from each of the code's iterates, the K-step result, the loss and weight
gradient (MART), the per-image decision (evaluation)."""
import dataclasses

import math

import torch
import torch.nn.functional as F

from conformance import (FRACTION, K_STEP, LAMBDA, ONE_STEP, STEPS, Check, Tol, case, differing, differs, exact,
                         golden, inputs, max_diff, steps_from_code)
from conformance_trades import code_loss_checks
from fastfair import config
from fastfair.attacks.names import parse_attack
from fastfair.attacks.pgd import per_class
from fastfair.data import DeviceLoader
from fastfair.evaluation.per_class import confusion

START = "max relative diff: std of x_0 - x, share of x_0 outside [0, 1]"


def start_tol(x, want) -> Tol:
    """Two independent draws of the same law (ours, the code's ``want`` from ``x``), m elements each: the share
    outside [0, 1] is k / m with k about Poisson (k a few hundred, at saturated pixels), so the relative difference
    of two such counts has sd sqrt(2 / k); a sample std of m draws has relative sd 1 / sqrt(2 m), the difference of
    two 1 / sqrt(m). LAMBDA (6) sd each: a false alarm once in 5e8 runs. A wrong law (clipped: no share outside,
    uniform vs normal or another scale: another std) is off by far more."""
    m, k = x.numel(), int(((want < 0) | (want > 1)).sum())
    value = LAMBDA * max(math.sqrt(2 / k) if k else 0.0, 1 / math.sqrt(m))
    return Tol(value, f"{LAMBDA:g} sd of two draws: sqrt(2/k), k = {k} outside")


def start_law(ops, init, x, y, eps_c, want) -> float:
    """fastfair's random start (seeded draw) against the code's drawn start: the spread and the clipping."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ours = ops.random_start(x, y, eps_c, init)

    def stats(s):
        return float((s - x).std()), float(((s < 0) | (s > 1)).double().mean())

    (s_ours, o_ours), (s_want, o_want) = stats(ours), stats(want)
    return max(abs(s_ours / s_want - 1), abs(o_ours - o_want) / max(o_want, 1e-12))


# -- MART training: mart.py::mart_loss ------------------------------------------------------------

def mart_constants(beta: float):
    """The MART code's loss minus fastfair's from the two constants of its KL term that fastfair leaves out (its
    ``(1.0000001 - true_probs)`` weight and ``log(adv_probs + 1e-12)``; about 1e-7 of the loss, below float32's
    noise, far above float64's): beta / N sum_i [1e-7 KL'_i + (1 - p_y(x_i)) sum_k p_k(x_i) (log p_k(x'_i) -
    log(p_k(x'_i) + 1e-12))], KL'_i the code's KL with the 1e-12 (Wang et al. 2020, Eq. 9 as the code writes it)."""
    def constants(model, x, x_adv, y):
        p_nat, p_adv = F.softmax(model(x), 1), F.softmax(model(x_adv), 1)
        kl_code = (p_nat * (p_nat.log() - (p_adv + 1e-12).log())).sum(1)
        shift = (p_nat * (p_adv.log() - (p_adv + 1e-12).log())).sum(1)
        p_y = p_nat.gather(1, y[:, None]).squeeze(1)
        return beta * (1e-7 * kl_code + (1 - p_y) * shift).mean()
    return constants


@case("mart")
def mart():
    checks, (m, state, x, y) = code_loss_checks("MART", "mart", constants=mart_constants(
        golden("mart").meta["settings"]["beta"]))
    g = golden("mart")
    return checks + [Check("MART", "random start: law of the code's x + 0.001 N(0, I)", g.ref(),
                           start_law(m.attack.ops, m.attack.init, x, y, state["eps"], g.t("start")),
                           start_tol(x, g.t("start")), START)]


# -- PGD-20 evaluation: TRADES pgd_attack_cifar10.py and MART train_wideresnet.py _pgd_whitebox ---------

differs("PGD-20 evaluation", "uniform start clipped to [0, 1] before the first step (Madry et al.); the TRADES and "
        "MART code take the first gradient at x + U(-eps, eps) unclipped", "eval.clip_start")


def eval_config(g, *sets):
    s = g.meta["settings"]
    step = s.get("step_size")
    return config.resolve(None, {"method.name": "trades", "data.dataset": "cifar10"},
                          [f"eval.eps={s['epsilon']}", f"eval.alpha={step}", *sets])


def run_eval(cfg, x, y, model, start):
    """fastfair's pgd20 as ``fastfair eval`` builds it (eval.* keys, model.eval(), confusion counts),
    from ``start`` instead of its seeded draw: (x_20, per-image incorrect, per-class robust counts)."""
    attack = parse_attack("pgd20", cfg.eval.cw_kappa, cfg.eval.clip_start)
    ops = dataclasses.replace(attack.pgd.ops, random_start=lambda x_, y_, eps_c, kind: start.clone())
    attack = dataclasses.replace(attack, pgd=dataclasses.replace(attack.pgd, ops=ops))
    eps_c, alpha_c = per_class(cfg.eval.eps, 10, "cpu"), per_class(cfg.eval.alpha, 10, "cpu")
    model.eval()
    x_adv = attack(model, x, y, eps_c, alpha_c)
    with torch.no_grad():
        wrong = model(x_adv).argmax(1) != y
    loader = DeviceLoader((x * 255).round().to(torch.uint8), y, len(y), device="cpu", train=False)
    conf = confusion(model, loader, attack, eps_c, alpha_c, 10)
    return x_adv, wrong, conf.diagonal()


def eval_checks(name: str, label: str):
    g, inp = golden(name), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    assert torch.equal((x * 255).round() / 255, x)  # the loader's uint8 round trip gives the same images
    ref = g.ref()
    code = eval_config(g, "eval.clip_start=false")
    attack = parse_attack("pgd20", code.eval.cw_kappa, code.eval.clip_start).pgd
    eps_c, alpha_c = per_class(code.eval.eps, 10, "cpu"), per_class(code.eval.alpha, 10, "cpu")
    worst, detail = steps_from_code(g, lambda: inp.model("eval"), dataclasses.replace(attack, steps=1), x, y,
                                    eps_c, alpha_c, code.eval.alpha)
    want_wrong = g.t("incorrect")
    robust = torch.zeros(10, dtype=torch.long).index_add_(0, y, (~want_wrong).long())
    start = g.t("start")
    ours, wrong, diag = run_eval(code, x, y, inp.model("eval"), start)
    return [
        Check(label, "one attack step from each of the code's x_k", ref, worst, ONE_STEP, STEPS, detail),
        Check(label, "random start: law of the code's x + U(-eps, eps) (eval.clip_start=false)", ref,
              start_law(attack.ops, attack.init, x, y, eps_c, start), start_tol(x, start), START),
        Check(label, "20-step attack from the code's start", ref, differing(ours, g.t("result")), K_STEP, FRACTION),
        Check(label, "per-image incorrect decision after 20 steps", ref, float((wrong != want_wrong).sum()),
              exact("a decision per image"), "images decided differently"),
        Check(label, "per-class robust counts through fastfair eval's confusion", ref, max_diff(diag, robust),
              exact("counts of images"), "max abs diff (images)"),
    ]


@case("eval_pgd")
def eval_pgd():
    return eval_checks("eval_pgd", "PGD-20 evaluation (TRADES code)")


@case("mart_pgd20")
def mart_pgd20():
    return eval_checks("mart_pgd20", "PGD-20 evaluation (MART code)")
