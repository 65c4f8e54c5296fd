"""CFA against PKU-ML/CFA: the attacks of its three bases (AT, TRADES, FAT; with CCM's class-wise eps) step by
step and from the code's start, their losses and weight gradients (TRADES with CCR's class-wise beta and its
(1 + beta) normalisation), CCM/CCR's per-class factors, FAWA's gate and the EMA/FAWA averages over several epochs
from the same made-up per-class statistics, and the validation split. Each attack case builds fastfair's method
from the CFA preset that follows the code (``-code``, or the one preset where paper and code agree), with
``begin`` 2 (the golden's) instead of 10.
"""
from __future__ import annotations

import torch

from conformance import (REL, Check, normals, TinyNet, Tol, case, differs, exact, golden, inputs, logit_tol, max_diff,
                         rel_diff, rounded, unit, weight_grad, weight_grad_tol)
from conformance_fat import Flip, attack_checks, decode
from fastfair import config
from fastfair.data.datasets import DataBundle, split
from fastfair.methods import METHODS
from fastfair.training.averaging import WeightAverage
from fastfair.training.class_state import ClassState


def model_at(inp, epoch: int) -> TinyNet:
    """A TinyNet standing for the trained model after ``epoch`` (made-up input of the averaging check): the fixed
    weights moved a little, BN counters advanced."""
    state = {}
    for i, (k, v) in enumerate(inp.state.items()):
        if v.is_floating_point():
            d = 0.05 * normals(1000 * epoch + i, v.shape).to(v.dtype)  # the same on every CPU, in any precision
            state[k] = v + (d.abs() if "running_var" in k else d)
        else:
            state[k] = v + 10 * (epoch + 1)
    net = TinyNet()
    net.load_state_dict(state)
    return net


def stats(robust: torch.Tensor) -> dict:
    return {"train_acc_per_class": (robust.double() * 100).tolist(), "val": {}}


def preset_method(preset: str, *sets: str):
    """fastfair's method from a CFA preset, with the golden's begin, its per-class factors set from the last
    made-up epoch (as the code's class_eps / class_beta in the golden)."""
    g = golden("cfa")
    begin = g.meta["settings"]["begin"]
    cfg = config.resolve(preset, {}, [f"ccm.begin={begin}", f"ccr.begin={begin}", *sets])
    m = METHODS.get(cfg.method.name)(cfg)
    state = ClassState(10, "cpu")
    m.setup(state)
    last = len(g.t("train_robust")) - 2  # the epoch whose statistics the last made-up epoch reads
    m.end_epoch(state, last, stats(g.t("train_robust")[last]))
    return m, state


ATTACKS = {  # golden prefix: (label, the code-following preset, checks the loss / and its weight gradient)
    "at": ("CFA: AT", "cfa-t1-at", "loss"),
    "at_ccm": ("CFA: AT + CCM", "cfa-t2-at-ccm", False),
    "trades": ("CFA: TRADES", "cfa-t1-trades-code", False),
    "trades_ccm": ("CFA: TRADES + CCM + CCR", "cfa-t2-trades-ccm-ccr-code", "grad"),
    "fat": ("CFA: FAT", "cfa-t1-fat", "grad"),
    "fat_ccm": ("CFA: FAT + CCM", "cfa-t2-fat-ccm-code", False),
}


def attack_case(prefix: str) -> list[Check]:
    g, inp = golden("cfa"), inputs()
    label, preset, loss_too = ATTACKS[prefix]
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    m, state = preset_method(preset)
    ref = g.ref(prefix)
    out = [Check(label, "class-wise eps of the attack", ref, max_diff(state["eps"][y], g.t(f"{prefix}.eps")),
                 rounded(g.t(f"{prefix}.eps"), 4, "A_k ×100 and back, + lambda_1, × eps (as eps_k per epoch)"))]
    out += attack_checks(label, ref, m, state, g, prefix, lambda: inp.model("train"), x, y)
    if loss_too:
        x_adv = decode(g.arrays, prefix, x, m.cfg.attack.alpha)[-1]
        model = inp.model("train")
        loss, _ = m.objective(model, x, x_adv, y, state)

        def exact_loss(net):
            return m.objective(net, x, x_adv, y, state)[0]

        out.append(Check(label, "loss on the code's x_adv", ref, max_diff(loss.detach(), g.t(f"{prefix}.loss")),
                         logit_tol(exact_loss, model)))
    if loss_too == "grad":
        out.append(Check(label, "weight gradient on the code's x_adv", ref,
                         rel_diff(weight_grad(model, loss), g.t(f"{prefix}.weight_grad")),
                         weight_grad_tol(exact_loss, model), REL))
    return out


for _prefix in ATTACKS:
    case(f"cfa-{_prefix}")(lambda p=_prefix: attack_case(p))


@case("cfa-flip")
def flipping():
    """CFA's FAT (cfa-t1-fat: stop_rule cfa) on conformance_fat.Flip, whose prediction flips with each step:
    where FAT's own rule would take one more step than CFA's fat_loss."""
    g, inp = golden("cfa"), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], torch.zeros(n, dtype=torch.long)
    out = []
    for prefix, tau in g.meta["flip_taus"].items():
        m, state = preset_method("cfa-t1-fat", f"method.tau={tau}")
        alpha = m.cfg.attack.alpha
        out += attack_checks(f"CFA: FAT (tau {tau}, flipping model)", g.ref(prefix), m, state, g, prefix,
                             lambda: Flip(alpha), x, y)
    return out


@case("cfa-per-class")
def per_class():
    """CCM's eps_k and CCR's beta_k / (1 + beta_k) per epoch; the code's class_beta is that ratio."""
    g = golden("cfa")
    m, state = preset_method("cfa-t2-trades-ccm-ccr-code")  # lambda_1 = lambda_2 = 0.5, as the code's defaults
    m, state = type(m)(m.cfg), ClassState(10, "cpu")
    m.setup(state)
    robust = g.t("train_robust")
    eps, ratio = [], []
    for epoch in range(len(robust)):
        eps.append(state["eps"].clone())
        beta = state["kl_weight"]
        ratio.append(beta / (1 + beta))
        m.end_epoch(state, epoch, stats(robust[epoch]))
    ref = g.ref("per_class")
    # eps_k = (lambda_1 + A_k) eps from A_k through percent and back (two roundings of A_k <= 1, each
    # within u eps_k once times eps), the sum and the product: four of eps_k's size. beta_k likewise (four of
    # beta_k's size), and b / (1 + b) moves by at most b / (1 + b)^2 <= its own size per relative error of b, plus
    # its sum and division: six of the ratio's size.
    return [Check("CFA: CCM", "eps_k per epoch (6 epochs, begin 2)", ref, max_diff(torch.stack(eps), g.t("class_eps")),
                  rounded(g.t("class_eps"), 4, "A_k ×100 and back, + lambda_1, × eps")),
            Check("CFA: CCR", "beta_k / (1 + beta_k) per epoch (6 epochs, begin 2)", ref,
                  max_diff(torch.stack(ratio), g.t("class_beta")),
                  rounded(g.t("class_beta"), 6, "beta_k's four, 1 + b, the division"))]


differs("CFA: EMA / FAWA", "BN num_batches_tracked: train.py's weight_average averages the integer counter too "
        "(truncated when loaded); fastfair copies it. No effect: BN with a momentum never reads it",
        "none (no effect on the model)")


@case("cfa-averaging")
def averaging():
    """FAWA's gate and both averages after each epoch, from the same models and validation robust accuracies."""
    g, inp = golden("cfa"), inputs()
    s = g.meta["settings"]
    val = g.t("val_robust")
    ema = WeightAverage(TinyNet(), s["decay_rate"], 0, None)  # code: from epoch 0
    fawa = WeightAverage(TinyNet(), s["decay_rate"], 0, s["threshold"])
    accepted, diffs = [], {"ema": 0.0, "fawa": 0.0}
    started = False
    for epoch in range(len(val)):
        model = model_at(inp, epoch)
        ema.update(model, epoch, float(val[epoch].min()))
        accepted.append(fawa.update(model, epoch, float(val[epoch].min())))
        started = started or accepted[-1]
        for name, avg in (("ema", ema), ("fawa", fawa)):
            if name == "fawa" and not started:
                continue  # before its first accepted epoch the code's FAWA model is a fresh init, never used
            sd = avg.model.state_dict()
            for k in g.meta["tracked"]:
                theirs = g.t(f"{name}.{k}")[epoch]
                if sd[k].is_floating_point():  # the code also averages the integer num_batches_tracked (differs)
                    diffs[name] = max(diffs[name], rel_diff(sd[k], theirs))
    ref = g.ref("averaging")
    # avg <- d avg + (1 - d) w rounds three times per epoch, each within u of the tensor's largest magnitude, and an
    # epoch's error carries on scaled by d < 1: 3 u per epoch on each side, relative to the tensor's scale (the
    # weights' scale hardly moves over 6 epochs of the made-up models)
    averaged = Tol(2 * 3 * unit() * len(val), f"2·3u per update, {len(val)} updates")
    return [Check("CFA: FAWA", "epochs accepted by the worst-class gate (6 epochs)", ref,
                  float(sum(a != b for a, b in zip(accepted, g.t("fawa_accepted").tolist()))),
                  exact("a decision per epoch from the same accuracies"), "epochs differing"),
            Check("CFA: FAWA", "averaged weights and BN statistics after each epoch", ref, diffs["fawa"], averaged,
                  REL),
            Check("CFA: EMA", "averaged weights and BN statistics after each epoch", ref, diffs["ema"], averaged, REL)]


@case("cfa-split")
def validation_split():
    """The validation split: the first 100 training images of each class (the rest train)."""
    g = golden("cfa")
    labels = g.t("split.labels")
    bundle = DataBundle("made-up", torch.arange(len(labels)), labels, torch.arange(10), torch.arange(10),
                        [str(k) for k in range(10)])
    parts = split(bundle, int(g.t("split.n")))
    ours_val, ours_train = set(parts["val"][0].tolist()), set(parts["train"][0].tolist())
    theirs_val, theirs_train = set(g.t("split.valid_index").tolist()), set(g.t("split.train_index").tolist())
    return [Check("CFA", "validation split (made-up labels, 5000 images)", g.ref("split"),
                  float(len(ours_val ^ theirs_val) + len(ours_train ^ theirs_train)), exact("image indices"),
                  "images on different sides")]
