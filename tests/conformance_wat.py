"""WAT against boqili/WAT (worst_class_adversarial_train.py): the Hedge weights over epochs, validate's
per-class cost, and train's attack steps, loss and weight gradient."""
import dataclasses
import math

import torch

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, Logged, Tol, case, differing,
                         differs, fixed_start, gamma, golden, inputs, logit_bounds, logit_tol, max_diff, method,
                         one_steps, rel_diff, unit, weight_grad, weight_grad_tol)
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
    # The cumulative costs are sums of up to E epochs' costs, each within gamma(E) of its sum of |terms|;
    # Hedge's weights softmax(-eta cum) move by at most w 2 eta d for a cost error d, and round as a softmax does
    # (the exponent eta cum within u of its size twice, the exponentials and division 3u, the K+1-term sum
    # gamma(K+1)), each relative to the weight; on each side (sqrt 2). The factor w_y + w_avg: two of them, and the
    # sum's rounding.
    cum = costs.double().abs().cumsum(0)
    top, eta = float(cum.max()), m.cfg.method.eta
    w_top = float(want.abs().max())
    per = w_top * (2 * eta * gamma(len(costs)) * top + gamma(K + 1) + 3 * unit() + 2 * unit() * eta * top)
    weights_tol = Tol(math.sqrt(2) * per, "√2 max w (2 eta gamma(E)·Σ|costs| + gamma(K+1) + 3u + 2u eta max|cum|)")
    factor_tol = Tol(2 * weights_tol.value + unit() * 2 * w_top, "2 × the weights' bound + u·max|w_y + w_avg|")
    return [
        Check("WAT", f"class factor w_y + w_avg after each of {len(costs)} epochs of made-up validation costs", ref,
              factor, factor_tol),
        Check("WAT", "the K + 1 Hedge weights (classes, average expert) after each epoch", ref, split, weights_tol),
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
    # Both sides sum the eval-mode TRADES rows of each class (and of all): logit_bounds of those sums, as a
    # fraction of each, carries to the divided costs, whose division rounds once more (u) on each side
    def sums(net):
        net.eval()
        rows = m.ops.row_loss(net(x), net(x_adv), y, ce_nat=1.0, kl=state["kl_weight"][y])
        per_class = torch.zeros(K, dtype=torch.float64).index_add(0, y, rows.double())
        return torch.cat([per_class, per_class.sum().reshape(1)])

    exact_sums = sums(Logged(inputs().model("eval"))).detach()
    share = float((logit_bounds(sums, inputs().model("eval")) / exact_sums).max()) + 2 * unit()

    def cost_tol(costs) -> Tol:
        return Tol(share * float(costs.abs().max()), "max (logit_bounds / sum) of the class sums·max|cost| + 2u")

    return [
        Check("WAT", "per-class and average validation cost on the code's x_adv (val_divisor batches)", ref,
              max_diff(out["batches"], want), cost_tol(want)),
        Check("WAT", "the same as class means (val_divisor count) vs the code's sums over the class counts", ref,
              max_diff(out["count"], means), cost_tol(means)),
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

    def exact_loss(net):
        return m.objective(net, x, g.t("x_adv"), y, state)[0]

    return [
        Check("WAT", "one training attack step from each of the code's x_k", ref, worst, ONE_STEP,
              STEPS, detail),
        Check("WAT", "K-step training attack from the code's start", ref,
              differing(x_k, its[-1]), K_STEP, FRACTION),
        Check("WAT", "class-weighted training loss on the code's x_adv", ref, max_diff(loss.detach(), g.t("loss")),
              logit_tol(exact_loss, model)),
        Check("WAT", "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
    ]
