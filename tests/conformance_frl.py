"""FRL's three variants against hannxu123/fair_robust: attack steps and K-step result of ``trades_adv``,
loss and weight gradient of ``train_model`` on the code's x_adv with non-uniform class weights,
the multiplier / weight / margin updates of ``frl_train`` over 42 epochs of made-up per-class
validation counts (through ``FRLBase.before_training`` / ``end_epoch``, as the trainer drives
them), and the method defaults and presets against the scripts' settings.

The code's attack iterates are stored as the start and the sign of the code's gradient at each
step; :func:`replay` rebuilds them bit for bit (the generator checks this against the iterates it
recorded), which keeps the golden files small.
"""
import dataclasses
from pathlib import Path

import numpy as np
import torch

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, Tol, case, differing, differs, exact,
                         fixed_start, gamma, golden, inputs, kl_grad, logit_tol, max_diff, method, rel_diff,
                         routing_ties, step_flips, unit, weight_grad, weight_grad_tol, working_dtype)
from fastfair import config
from fastfair.attacks.pgd import attack_mode, descend

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
EPOCHS = 42  # past epoch 40, where the scripts halve rate1
LOSS_EPOCH = 20  # the attack and loss run with the class weights of this (0-based) epoch


def multipliers_tol(lams, m) -> Tol:
    """Both sides' rounding error of the multipliers after each update lam <- normalise(lam + rate gap), summed
    over the updates (an error carries on unscaled): the gap of two accuracies (a count over 300 on the code's
    side, a percentage on fastfair's) and its product with the rate round within 2u of the rate, the sum within
    u of |lam|, the normalisation's C-term total within gamma(C) of it (a relative error it hands every lam) and
    its quotient and product within 2u of |lam|: (3u + gamma(C)) max|lam| + 2u rate per update and side."""
    lams = lams.double()
    rate = max(2 * m.cfg.method.rate_weight, m.cfg.method.rate_margin)
    per = [(3 * unit() + gamma(10)) * float(lam.abs().max()) + 2 * unit() * rate for lam in lams]
    return Tol(2 * sum(per), f"2 Σ {len(per)} updates ((3u + gamma(C))·max|lam| + 2u·rate)")


def weights_tol(lam_tol: Tol, diffs) -> Tol:
    """w_k = 1/C + lam_k - sum_j lam_j / C moves by at most twice a multiplier's error, eps_k / eps = exp(2 lam_k)
    (clamped) by 2 exp(2 lam_k) of it; each rounds within 3u of its size on each side (its two or three
    operations, exp within 1 ulp)."""
    top = float(diffs.double().abs().max())
    factor = float(diffs[:, 2].double().abs().max())
    return Tol((2 + 2 * factor) * lam_tol.value + 2 * 3 * unit() * top,
               "(2 + 2 max eps factor)·multiplier error + 6u·max|w|")
VAL_PER_CLASS = 300  # data_loader.py: each class's training images 4700:5000 validate
LABEL = {"frl-rw": "FRL reweight", "frl": "FRL reweight + remargin", "frl-rm": "FRL remargin"}


def batch(inp) -> torch.Tensor:
    """Two images of every class but 3 (whose margin grows largest: the remargin step is the batch's
    largest eps_y / 4, not the largest of all classes)."""
    y = inp.y.tolist()
    return torch.tensor(sorted(i for c in range(10) if c != 3 for i in [j for j, v in enumerate(y) if v == c][:2]))


def replay(start, signs, x, eps, step) -> list[torch.Tensor]:
    """x_0 .. x_K from the start and the K gradient signs: x + step sign, into the ball x +- eps, into [0, 1]."""
    out = [start]
    for s in signs:
        moved = out[-1] + step * s.to(start.dtype)
        out.append(torch.min(torch.max(moved, x - eps), x + eps).clamp(0.0, 1.0))
    return out


def frl(name: str):
    """fastfair's method ``name`` at its own defaults (FRL fine-tunes: any checkpoint path will do here)."""
    return method(name, "train.init_from=unused.pt")


def validation(counts) -> dict:
    """The validation dict fastfair's trainer hands to the method: per-class accuracies in percent."""
    clean, robust = (100.0 * c / VAL_PER_CLASS for c in counts)
    return {"clean": {"per_class": clean.tolist()}, "pgd20": {"per_class": robust.tolist()}}


def drive(m, state, counts):
    """Per epoch (the code's now_epoch 1..EPOCHS), fastfair's multipliers and weights after its update."""
    out = []
    for e in range(len(counts)):
        if e == 0:
            m.before_training(state, validation(counts[0]))
        else:
            m.end_epoch(state, e - 1, {"val": validation(counts[e])})
        names = ("frl_lam_nat", "frl_lam_bndy", "frl_lam_margin", "frl_w_nat", "frl_w_bndy")
        out.append({**{k: state[k].clone() for k in names}, "eps_frl": state.factors["eps"]["eps_frl"].clone()})
    return out


def settings_mismatches(cfg, s: dict, *, reweight: bool, remargin: bool, data: bool = False) -> list[str]:
    """The keys of ``cfg`` that do not hold the script's value (its argparse defaults, SGD, MultiStepLR,
    training and validation attack ``configs``; with ``data``, data_loader.py's validation images per class)."""
    a, sgd, sched, atk, val = s["args"], s["SGD"], s["MultiStepLR"], s["configs"], s["configs1"]
    want = {"method.kl_weight": a["beta"], "method.bound": a["bound0"], "method.lim": a["lim"],
            "method.halve_every": 40, "train.epochs": a["epoch"], "data.batch_size": a["batch_size"],
            "train.lr": sgd["lr"], "train.momentum": sgd["momentum"], "train.weight_decay": sgd["weight_decay"],
            "train.lr_milestones": sched["milestones"], "train.lr_gamma": sched["gamma"],
            "attack.eps": atk["epsilon"], "attack.alpha": atk["step_size"], "attack.steps": atk["num_steps"],
            "attack.objective": "kl", "attack.init": "normal", "attack.bn_mode": "eval",
            "method.step_from_eps": remargin, "train.val_attack": f"pgd{val['num_steps']}",
            "eval.eps": val["epsilon"], "eval.alpha": val["step_size"]}
    assert a["bound0"] == a["bound1"]
    if reweight:
        want["method.rate_weight"] = a["rate1"]
    if remargin:
        want["method.rate_margin"] = a["rate2"]
    if data:
        want["data.val_per_class"] = s["val_per_class"]
    have = config.flatten(cfg.to_dict())
    return [k for k, v in want.items() if (have[k] != v if isinstance(v, (str, bool, list)) else
                                           abs(have[k] - v) > 1e-12)]


def variant_checks(name: str) -> list[Check]:
    g, inp = golden(name), inputs()
    label = LABEL[name]
    m, state = frl(name)
    counts = g.t("counts").numpy()

    # -- per-class updates over EPOCHS epochs ---------------------------------------------------
    ours = drive(m, state, counts)
    lams, diffs = g.t("lams"), g.t("diffs")
    lam_diff = max(max_diff(torch.cat([o["frl_lam_nat"], o["frl_lam_bndy"], o["frl_lam_margin"]]), lams[e])
                   for e, o in enumerate(ours))
    w_diff = max(max_diff(torch.stack([o["frl_w_nat"], o["frl_w_bndy"], o["eps_frl"]]), diffs[e])
                 for e, o in enumerate(ours))

    # -- the attack from the code's start, with the class weights of LOSS_EPOCH -----------------
    m, state = frl(name)
    drive(m, state, counts[:LOSS_EPOCH + 1])
    idx = batch(inp)
    x, y = inp.x[idx], inp.y[idx]
    eps = g.t("eps").view(-1, 1, 1, 1)
    its = replay(g.t("start"), g.t("signs"), x, eps, g.t("step"))
    k_steps = len(its) - 1
    # step_flips reads a gradient only for which elements are noise in the precision: the stored mask, as 0 / 1
    packed = g.arrays["noise64" if working_dtype() == torch.float64 else "noise"]
    noise = torch.from_numpy(np.unpackbits(packed)[:g.arrays["signs"].size].reshape(g.arrays["signs"].shape))
    grads = (~noise.bool()).to(working_dtype())
    alpha = m.step_sizes(y, state)
    one = dataclasses.replace(m.attack, steps=1)
    worst = flips = 0
    for k in range(k_steps):  # one step from the code's own x_k
        model = inp.model("train")
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            step = descend(one, model, x, y, state["eps"], alpha, its[k])
            routed = routing_ties(model, its[k])
            grad = kl_grad(model, x, its[k], grads[k]) if one.objective == "kl" else grads[k]
        n, unexplained = step_flips(step, its[k + 1], grad, alpha[y], routed)
        flips, worst = flips + n, max(worst, unexplained)
    with fixed_start(m, its[0]):
        x_adv = m.perturb(inp.model("train"), x, y, state)

    # -- loss and weight gradient on the code's x_adv -------------------------------------------
    model = inp.model("train")
    loss, _ = m.objective(model, x, its[-1], y, state)
    grad = weight_grad(model, loss)

    def exact_loss(net):
        return m.objective(net, x, its[-1], y, state)[0]

    weights = torch.stack([state["frl_w_nat"][y], state["frl_w_bndy"][y]])

    s = g.meta["settings"]
    mism = settings_mismatches(m.cfg, s, reweight=m.reweight, remargin=m.remargin)
    lam_tol = multipliers_tol(lams, m)
    w_tol = weights_tol(lam_tol, diffs)
    checks = [
        Check(label, f"multipliers lam_nat, lam_bndy, lam_margin over {len(counts)} epochs (rate1 halves at 40)",
              g.ref("update"), lam_diff, lam_tol),
        Check(label, f"class weights w_nat, w_bndy and eps factor over {len(counts)} epochs", g.ref("update"),
              w_diff, w_tol),
        # the class weights and factors of LOSS_EPOCH copied per row, eps = eps factor x eps one rounding more
        Check(label, "per-sample loss weights and eps of the attack batch", g.ref("attack"),
              max(max_diff(weights, g.t("weights")[:2]), max_diff(state["eps"][y], g.t("eps"))),
              Tol(w_tol.value, "the class weights' bound (eps: × eps, within it)")),
        Check(label, "one attack step from each of the code's x_k", g.ref("attack"), worst, ONE_STEP,
              STEPS, f"{flips} noise flips in {k_steps} steps"),
        Check(label, "K-step attack from the code's start", g.ref("attack"),
              differing(x_adv, its[-1]), K_STEP, FRACTION),
        Check(label, "loss on the code's x_adv", g.ref("loss"), max_diff(loss.detach(), g.t("loss")),
              logit_tol(exact_loss, model)),
        Check(label, "weight gradient on the code's x_adv", g.ref("loss"), rel_diff(grad, g.t("weight_grad")),
              weight_grad_tol(exact_loss, model), REL),
        Check(label, "method defaults equal the script's settings", g.ref("defaults"), len(mism),
              exact("settings compared as written"), "settings differing", ", ".join(mism)),
    ]
    if name == "frl":
        for preset in ("cfa-t1-frl", "cfa-t1-frl-ema"):
            # the file beside these tests (make.py runs without conftest's mapping of fastfair.presets)
            bad = settings_mismatches(config.resolve(str(CONFIGS / f"{preset}.toml")), s, reweight=True, remargin=True,
                                      data=True)
            checks.append(Check(label, f"preset {preset} holds the script's settings", g.ref("defaults"), len(bad),
                                exact("settings compared as written"), "settings differing", ", ".join(bad)))
    return checks


for _name in LABEL:
    case(_name)(lambda _n=_name: variant_checks(_n))

differs("FRL", "the code forwards the clean batch twice in train mode (3 BN running-statistics updates per step, "
               "fastfair 2); the loss and its gradient are the same", "(no key)")
differs("FRL", "validation split: the code takes each class's last 300 training images (data_loader.py), "
               "fastfair its first data.val_per_class (300 in the presets)", "data.val_per_class")
differs("FRL", "the code keeps no checkpoint by validation (it tests every 5 epochs); the CFA presets pick "
               "CFA's 'best' on the validation split", "train.select")
