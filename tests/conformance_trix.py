"""TRIX against Fairness-a11y/TRIX's mixed_trades_loss (the batch class weights, the targeted split, the target
draw, the mixed attack step by step, loss, weight gradient) and the DAFA weights of its train.py loop."""
import dataclasses
from unittest import mock

import torch

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, case, differing, exact, fixed_start,
                         golden, inputs, logit_tol, max_diff, method, rel_diff, routing_ties, softmax_tol, step_flips,
                         weight_grad, weight_grad_tol)
from conformance_dafa import loop_check, set_weights, similarity_weights_tol
from fastfair.attacks.pgd import attack_mode, descend
from fastfair.methods import trix


def trix_method():
    g = golden("trix")
    s = g.meta["settings"]
    m, state = method("trix", f"attack.eps={s['epsilon']}", f"attack.alpha={s['pgd_step_size']}",
                      f"attack.steps={s['pgd_num_steps']}", f"method.kl_weight={s['beta']}")
    set_weights(m, state, torch.tensor(g.meta["class_weights"]))
    return m, state


def batch():
    inp, n = inputs(), golden("trix").t("x_start").shape[0]
    return inp.x[:n], inp.y[:n]


def exact_distribution(table: torch.Tensor, draws, y: torch.Tensor, classes: int) -> torch.Tensor:
    """(N, C): P(target = t) of each row, each of ``draws`` (rows of ``table``) equally likely."""
    out = torch.zeros(len(y), classes, dtype=torch.float64)
    for r in draws:
        out[torch.arange(len(y)), table[r]] += 1.0 / len(draws)
    return out


@case("trix-split")
def split():
    g = golden("trix")
    ref = g.ref()
    m, state = trix_method()
    x, y = batch()
    classes = state.num_classes
    model = inputs().model("train")
    with attack_mode(model, m.attack.bn_mode), torch.no_grad():
        z = model(x)
    _, strong = m.targeting(inputs().model("train"), x, y, classes)
    code_strong = g.t("y_t") != y
    # the code's draw: randint(0, C), redrawn while == y. Its first draw r is uniform on C values; an accepted
    # one (r != y) is the target (the table's row r), a rejected one is redrawn from the same uniform, so the
    # target is distributed as an accepted first draw: uniform over the code's table rows r != y_i.
    table = g.t("target_table")
    code_p = torch.stack([exact_distribution(table[:, i:i + 1], [r for r in range(classes) if r != int(yi)], y[i:i + 1],
                                             classes)[0] for i, yi in enumerate(y)])
    # fastfair's draw: one torch.randint; enumerate every value of the range it asks for
    ours, space = [], [None]

    def draw(k):
        def randint(low, high, size, device=None):
            space[0] = high - low
            return torch.full(size, low + k, device=device)
        with mock.patch.object(torch, "randint", randint):
            return trix.draw_targets(y, classes)

    ours.append(draw(0))
    ours += [draw(k) for k in range(1, space[0])]
    ff_p = exact_distribution(torch.stack(ours), range(len(ours)), y, classes)
    return [
        Check("TRIX", f"batch class weights of the split (DAFA Alg. 2, lambda 1, on the clean softmax of {len(y)} "
                      "images, one class absent)", g.ref("tar_weights"),
              max_diff(trix.batch_weights(z, y, classes), g.t("tar_weights")),
              similarity_weights_tol([z], y, 1.0, g.t("tar_weights"), 1)),
        Check("TRIX", "strong (targeted) rows: fastfair's targeting vs the code's y_t != y", ref,
              float((strong != code_strong).sum()), exact("a decision per row"), "rows differing"),
        Check("TRIX", "target distribution per row, exact: enumerating the code's first draw (rejection = an "
                      "accepted first draw) and fastfair's shift (different random streams, same distribution)", ref,
              max_diff(ff_p, code_p), exact("ratios of counts of draws, the same on both sides"),
              "max abs diff of each row's P(target)"),
    ]


@case("trix-attack")
def attack():
    g = golden("trix")
    ref = g.ref()
    m, state = trix_method()
    x, y = batch()
    y_t, rows = g.t("y_t"), g.t("step_rows")
    strong = y_t != y
    one = dataclasses.replace(m.attack, steps=1)
    model = inputs().model("train")
    its, grads = g.t("step_iterates"), g.t("step_grads")
    alpha = torch.tensor(g.meta["class_weights"])[y[rows]] * g.meta["settings"]["pgd_step_size"]
    checks = []
    for j, label in enumerate(["targeted", "untargeted"]):
        r = rows[j:j + 1]
        assert bool(strong[r]) == (label == "targeted")
        worst = flips = 0
        for k in range(len(grads)):
            with attack_mode(model, one.bn_mode), torch.enable_grad():
                ours = descend(one, model, x[r], y[r], state["eps"], state["alpha"], its[k, j:j + 1], y_t[r], strong[r])
                routed = routing_ties(model, its[k, j:j + 1])
            n, unexplained = step_flips(ours, its[k + 1, j:j + 1], grads[k, j:j + 1], alpha[j:j + 1], routed)
            flips, worst = flips + n, max(worst, unexplained)
        checks.append(Check("TRIX", f"one attack step of a {label} row (W_y-scaled eps, step) from each of the code's "
                                    "x_k", ref, worst, ONE_STEP, STEPS,
                            f"{flips} noise flips in {len(grads)} steps"))
    # the whole perturb (split, targets, K steps) from the code's start, the code's draw of the targets fed in
    with fixed_start(m, g.t("x_start")), mock.patch.object(trix, "draw_targets", lambda y, c: y_t.clone()):
        x_adv = m.perturb(inputs().model("train"), x, y, state)
    model = inputs().model("train")
    loss, logits = m.objective(model, x, g.t("x_adv"), y, state)

    def exact_loss(net):
        return m.objective(net, x, g.t("x_adv"), y, state)[0]

    return checks + [
        Check("TRIX", "K-step attack (split, the code's targets, 10 steps) from the code's start", ref,
              differing(x_adv, g.t("x_adv")), K_STEP, FRACTION),
        Check("TRIX", "loss on the code's x_adv (non-uniform W)", ref, max_diff(loss.detach(), g.t("loss")),
              logit_tol(exact_loss, model)),
        Check("TRIX", "weight gradient on the code's x_adv", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
        Check("TRIX", "softmax the class similarity reads (the loss's train-mode forward of x_adv)", ref,
              max_diff(logits.detach().softmax(1), g.t("stored_probs")), softmax_tol(model, g.t("x_adv"))),
    ]


@case("trix-loop")
def warm_up():
    return [loop_check("trix", "trix_loop", "TRIX")]
