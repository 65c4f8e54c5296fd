"""WAT against boqili/WAT (worst_class_adversarial_train.py): the Hedge weights over epochs, validate's
per-class cost, and train's attack steps, loss and weight gradient."""
import dataclasses
import math

import torch

from conformance import (FRACTION, K_TOL, REL, STEPS, Check, case, differing, differs, fixed_start, golden, inputs,
                         max_diff, method, one_steps, rel_diff, weight_grad)
from fastfair.methods.wat import hedge_weights

K = 10

differs("WAT", "per-class validation loss divided by the class's image count (the class mean), not by the code's "
               "(batches x batch size) / K", 'method.val_divisor = "count"')
differs("WAT", "Hedge over the K classes alone, without the code's (K+1)-th average-loss entry",
        "method.average_expert = false")


def wat_method(*sets):
    s = golden("wat").meta["settings"]
    return method("wat", f"attack.eps={s['epsilon']}", f"attack.alpha={s['step_size']}",
                  f"attack.steps={s['num_steps']}", f"method.kl_weight={s['beta']}", f"method.eta={s['eta']}", *sets)


def subset():
    g, inp = golden("wat"), inputs()
    idx = g.t("subset").long()
    return inp.x[idx], inp.y[idx]


@case("wat-hedge")
def hedge():
    g = golden("wat")
    ref = g.ref("hedge")
    costs, want = g.t("hedge_costs"), g.t("hedge_weights").double()
    m, state = wat_method()
    factor = split = 0.0
    for epoch in range(len(costs)):
        val = {"wat_loss_per_class": costs[epoch, :K].tolist(), "wat_loss_avg": float(costs[epoch, K])}
        m.end_epoch(state, epoch, {"val": {}, "val_method": val})
        # what trains: w_y + w_avg per class (the code's class weight plus its (K+1)-th on TRADES_loss)
        factor = max(factor, max_diff(state["loss_weight"], want[epoch, :K] + want[epoch, K]))
        w, w_avg = hedge_weights(state["wat_cum_loss"], state["wat_cum_avg"][0], m.cfg.method.eta, True)
        split = max(split, max_diff(torch.cat([w, w_avg.reshape(1)]), want[epoch]))
    # float32 sums of six epochs' losses (about 20: ulp 2e-6, times eta) and a softmax: ~4e-7 measured on weights ~1
    return [
        Check("WAT", f"class factor w_y + w_avg after each of {len(costs)} epochs of made-up validation costs", ref,
              factor, 2e-6),
        Check("WAT", "the K + 1 Hedge weights (classes, average expert) after each epoch", ref, split, 2e-6),
    ]


def code_x_adv(m, batches):
    """``m`` whose attack answers the code's x_adv of each validation batch, in order."""
    it = iter(batches)
    m.perturb = lambda model, x, y, state: next(it)
    return m


@case("wat-validate")
def validate():
    g = golden("wat")
    ref = g.ref("validate")
    b = g.meta["settings"]["val_batch_size"]
    x, y = subset()
    x_adv = g.t("val_x_adv")
    loader = [(x[i:i + b], y[i:i + b]) for i in range(0, len(y), b)]
    advs = [x_adv[i:i + b] for i in range(0, len(y), b)]
    want = g.t("val_cost").double()
    out = {}
    for divisor in ("batches", "count"):
        m, state = wat_method(f"data.batch_size={b}", f"method.val_divisor={divisor}")
        got = code_x_adv(m, advs).validation_pass(inputs().model("train"), loader, state, epoch=0)
        out[divisor] = torch.tensor(got["wat_loss_per_class"] + [got["wat_loss_avg"]], dtype=torch.float64)
    # count: the class means, from the code's numbers: its cost_k x (batches x batch size) / (K n_k)
    d = math.ceil(len(y) / b) * b
    n = torch.bincount(y, minlength=K).double()
    means = torch.cat([want[:K] * d / (K * n), want[K:] * d / len(y)])
    # float32 sums of a dozen rows of about 3: rounding ~1e-6
    return [
        Check("WAT", "per-class and average validation cost on the code's x_adv (val_divisor batches)", ref,
              max_diff(out["batches"], want), 1e-5),
        Check("WAT", "the same as class means (val_divisor count) vs the code's sums over the class counts", ref,
              max_diff(out["count"], means), 1e-5),
    ]


@case("wat-train")
def train():
    g, inp = golden("wat"), inputs()
    ref = g.ref()
    x, y = subset()
    its, grads = g.t("iterates"), g.t("step_grads")
    n = its.shape[1]  # the images kept step by step (the attack's BN is in eval mode: each on its own)
    m, state = wat_method()
    worst, detail = one_steps(lambda: inp.model("train"), dataclasses.replace(m.attack, steps=1), x, y,
                              state["eps"], state["alpha"], m.cfg.attack.alpha, its, grads)
    with fixed_start(m, its[0]):
        x_k = m.perturb(inp.model("train"), x[:n], y[:n], state)
    w = g.t("train_weights")
    state.set("loss_weight_wat", w[:K] + w[K])
    model = inp.model("train")
    loss, _ = m.objective(model, x, g.t("x_adv"), y, state)
    return [
        Check("WAT", "one training attack step from each of the code's x_k", ref, worst, 0,
              STEPS, detail),
        Check("WAT", "K-step training attack from the code's start", ref,
              differing(x_k, its[-1]), K_TOL, FRACTION),
        # float32 loss of about 10: rounding ~1e-6
        Check("WAT", "class-weighted training loss on the code's x_adv", ref, max_diff(loss.detach(), g.t("loss")),
              1e-5),
        Check("WAT", "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), 1e-5, REL),
    ]
