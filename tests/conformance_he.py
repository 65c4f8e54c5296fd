"""HE against ShawnXYang/AT_HE (CIFAR-10/): the FN + WN head of WideResNet.forward, PGD-HE (losses.pgd_loss) and
TRADES-HE (losses.trades_loss): attack steps, K-step result, loss and weight gradient; two steps of
train_adv_cifar10.py's train() (the update and the weights written back normalised); and the PGD-20
evaluation of pgd_attack_cifar10.py, which attacks the cosines (the model's output; s enters only the losses).

fastfair's side is TinyNet's features under fastfair's own cosine head (``model.head = "cosine"``, from the
HEADS registry) holding TinyNet's ``fc.weight``, prepared by the method's ``begin_epoch`` as a run is.
"""
import dataclasses
import math

import torch
from torch import nn

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, STEPS, Check, Tol, case, differing, differs,
                         exact, fixed_start, gamma, golden, head_bound, inputs, logit_tol, max_diff, method, rel_diff,
                         steps_from_code, unit, weight_grad, weight_grad_tol)
from conformance_mart_eval import START, start_law, start_tol
from fastfair import config
from fastfair.attacks.names import parse_attack
from fastfair.attacks.pgd import per_class
from fastfair.models.heads import HEADS

FEATURES = 16 * 8 * 8
CODE_ATTACK = ("attack.init=normal", "attack.bn_mode=eval")  # losses.py: x + 0.001 N(0, I), model.eval()

differs("HE", "class weights normalised inside the forward, their gradient through W / norm(W) (Pang et al. 2020, "
        "Eq. 4 as written; fastfair's default); the code overwrites fc.weight.data with its normalised rows in "
        "each forward, so the gradient is taken at the unit rows without the normalisation's Jacobian "
        "(he.weight_norm=data, the tian-iclr-t5-he preset)", "he.weight_norm")
differs("HE", "PGD-K evaluation (pgdK) attacks CE of the model's logits s cos; pgd_attack_cifar10.py attacks CE of "
        "the cosines (the model's output; s enters only the training losses): that is tpgdK@t<s>",
        "eval.attacks")


class HENet(nn.Module):
    """TinyNet's features under fastfair's cosine head holding TinyNet's class weights (no bias)."""

    def __init__(self, mode: str, scale: float):
        super().__init__()
        tiny = inputs().model(mode)
        self.features = tiny.features
        self.head = HEADS.get("cosine")(FEATURES, 10, scale)
        with torch.no_grad():
            self.head.weight.copy_(tiny.fc.weight)
        self.train(mode == "train")

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def net(m, mode: str) -> HENet:
    """A fresh HENet as the trainer prepares it before the first step (HE's begin_epoch: scale, weight_norm)."""
    model = HENet(mode, m.cfg.model.head_scale)
    m.begin_epoch(model, 0)
    return model


def he_method(name: str, weight_norm: str = "data"):
    s = golden(name).meta["settings"]
    sets = [f"attack.eps={s['epsilon']}", f"attack.alpha={s['step_size']}", f"attack.steps={s['perturb_steps']}",
            "model.head=cosine", f"model.head_scale={s['s']}", f"he.margin={s['m']}", f"he.weight_norm={weight_norm}"]
    if s["loss"] == "pgd_he":
        return method("pgd-at", *sets, *CODE_ATTACK)
    return method("trades", *sets, f"method.kl_weight={s['beta']}")


def projected(g: torch.Tensor) -> torch.Tensor:
    """The code's weight gradient as the graph normalisation gives it: on the class weights W (raw TinyNet rows),
    d/dW of f(W / norm(W)) = (I - w w^T) g / ||W|| with w = W / norm(W) and g the code's gradient at w."""
    g = g.double().clone()
    w = inputs().state["fc.weight"].double()
    norm = w.norm(dim=1, keepdim=True)
    u = w / norm
    head = g[-w.numel():].view_as(w)
    g[-w.numel():] = ((head - (head * u).sum(1, keepdim=True) * u) / norm).flatten()
    return g


def training_checks(name: str, label: str) -> list[Check]:
    g, inp = golden(name), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    ref = g.ref()
    m, state = he_method(name)
    worst, detail = steps_from_code(g, lambda: net(m, "train"), dataclasses.replace(m.attack, steps=1), x, y,
                                    state["eps"], state["alpha"], m.cfg.attack.alpha)
    with fixed_start(m, g.t("start")):
        x_adv = m.perturb(net(m, "train"), x, y, state)
    model = net(m, "train")
    loss, _ = m.objective(model, x, g.t("x_adv"), y, state)
    mg, _ = he_method(name, "graph")
    graph = net(mg, "train")
    loss_graph, _ = mg.objective(graph, x, g.t("x_adv"), y, state)

    def exact_loss(model):
        return m.objective(model, x, g.t("x_adv"), y, state)[0]

    def exact_graph(model):
        return mg.objective(model, x, g.t("x_adv"), y, state)[0]

    return [
        Check(label, "one attack step from each of the code's x_k", ref, worst, ONE_STEP, STEPS, detail),
        Check(label, "random start: law of the code's x + 0.001 N(0, I)", ref,
              start_law(m.attack.ops, m.attack.init, x, y, state["eps"], g.t("start")),
              start_tol(x, g.t("start")), START),
        Check(label, "K-step attack from the code's start", ref, differing(x_adv, g.t("x_adv")), K_STEP, FRACTION),
        Check(label, "loss on the code's x_adv", ref, max_diff(loss.detach(), g.t("loss")),
              logit_tol(exact_loss, model)),
        Check(label, "weight gradient on the code's x_adv (he.weight_norm=data)", ref,
              rel_diff(weight_grad(model, loss), g.t("weight_grad")), weight_grad_tol(exact_loss, model), REL),
        # the paper's reading: the same loss, the class weights' gradient through W / norm(W) (float64 from the code's)
        Check(label, "weight gradient on the code's x_adv (he.weight_norm=graph): the code's through W / norm(W)", ref,
              rel_diff(weight_grad(graph, loss_graph), projected(g.t("weight_grad"))),
              weight_grad_tol(exact_graph, graph), REL),
    ]


@case("he_code")
def he():
    g, inp = golden("he"), inputs()
    out = []
    for weight_norm in ("graph", "data"):
        m, _ = he_method("he_pgd", weight_norm)
        model = net(m, "eval")
        with torch.no_grad():
            cos = model(inp.x) / m.cfg.model.head_scale
        # head_bound over s: both sides' cosine error, in quadrature
        bound = float(head_bound(model, inp.x).max()) / float(m.cfg.model.head_scale)
        out.append(Check("HE", f"cosine logits s cos / s, eval BN, 64 images (he.weight_norm={weight_norm})",
                         g.ref(), max_diff(cos, g.t("cos")),
                         Tol(math.sqrt(2) * bound, "√2 head_bound / s: gamma(n)(Σ|h w| + |cos|), 2x features")))
    return out


@case("he_pgd")
def he_pgd():
    return training_checks("he_pgd", "PGD-HE")


@case("he_trades")
def he_trades():
    return training_checks("he_trades", "TRADES-HE")


def two_steps(weight_norm: str) -> torch.Tensor:
    """fastfair's two training steps on the code's x_adv of each step: objective, backward, SGD, after_step;
    the change of every parameter."""
    g = golden("he_train")
    s = g.meta["settings"]
    m, state = he_method("he_pgd", weight_norm)
    model = net(m, "train")
    before = torch.cat([q.detach().flatten() for q in HENet("train", 1.0).parameters()])  # fc.weight: raw rows
    opt = torch.optim.SGD(model.parameters(), lr=s["lr"], momentum=s["momentum"], weight_decay=s["weight_decay"])
    x_adv = g.t("x_adv")
    n = x_adv.shape[1]
    inp = inputs()
    for i in range(len(x_adv)):
        x, y = inp.x[i * n:(i + 1) * n], inp.y[i * n:(i + 1) * n]
        loss, _ = m.objective(model, x, x_adv[i], y, state)
        opt.zero_grad()
        loss.backward()
        opt.step()
        m.after_step(model)
    head = model.head
    with torch.no_grad():  # the values the next forward uses (graph: the normalised rows)
        w = head.unit_weight()
    after = torch.cat([q.detach().flatten() for q in model.parameters()][:-1] + [w.flatten()])
    return after - before


@case("he_train")
def he_train():
    g = golden("he_train")
    ref = g.ref()
    want = g.t("change")
    got = two_steps("data")
    k = 10 * FEATURES
    # The change is lr times the (momentum-summed) gradients, within weight_grad_tol of its scale (taken at the
    # first step; the second's weights differ by one small step), plus the rounding of each parameter's update
    # w - lr (g + wd w) in the precision (three operations a step, two steps, each side), within u of |w|, which is
    # much larger than the change. The unit rows after: that error, plus their normalisation by a norm of
    # FEATURES squares (within gamma(FEATURES) / 2 relative, on each side) of values up to max|row|.
    m, state = he_method("he_pgd", "data")
    x_adv, inp = g.t("x_adv"), inputs()
    n = x_adv.shape[1]
    grad_tol = weight_grad_tol(lambda model: m.objective(model, inp.x[:n], x_adv[0], inp.y[:n], state)[0],
                               net(m, "train"))
    weights = torch.cat([q.detach().flatten() for q in HENet("train", 1.0).parameters()]).double()
    scale = float(want.double().abs().max())
    change_tol = Tol(grad_tol.value + 2 * 6 * unit() * float(weights.abs().max()) / scale,
                     "weight_grad_tol + 12u·max|w| / max|change|")
    rows = float(want[-k:].double().abs().max())
    rows_tol = Tol(change_tol.value * scale + gamma(FEATURES) * rows,
                   "change's bound × max|change| + 2 gamma(n)/2·max|row|")
    return [
        Check("PGD-HE", "two training steps: change of every parameter (he.weight_norm=data)", ref,
              rel_diff(got, want), change_tol, REL),
        Check("PGD-HE", "two training steps: class weights after the steps, unit rows as the code's forward "
              "writes them (he.weight_norm=data)", ref, max_diff(got[-k:], want[-k:]), rows_tol),
    ]


# -- PGD-20 evaluation: pgd_attack_cifar10.py::_pgd_whitebox on the HE model's output (the cosines) ---------

def eval_attack(g):
    """fastfair's tpgd20@t<s>: PGD-20 on (s cos) / s, with the code's unclipped uniform start."""
    s = golden("he_pgd").meta["settings"]["s"]
    e = g.meta["settings"]
    cfg = config.resolve(None, {"method.name": "pgd-at", "data.dataset": "cifar10"},
                         [f"eval.eps={e['epsilon']}", f"eval.alpha={e['step_size']}", "eval.clip_start=false"])
    name = f"tpgd{e['num_steps']}@t{s:g}"
    return cfg, parse_attack(name, cfg.eval.cw_kappa, cfg.eval.clip_start).pgd, name, s


@case("he_pgd20")
def he_pgd20():
    g, inp = golden("he_pgd20"), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    ref = g.ref()
    cfg, attack, name, s = eval_attack(g)
    m, _ = he_method("he_pgd")
    eps_c, alpha_c = per_class(cfg.eval.eps, 10, "cpu"), per_class(cfg.eval.alpha, 10, "cpu")
    worst, detail = steps_from_code(g, lambda: net(m, "eval"), dataclasses.replace(attack, steps=1), x, y,
                                    eps_c, alpha_c, cfg.eval.alpha)
    start = g.t("start")
    ops = dataclasses.replace(attack.ops, random_start=lambda x_, y_, eps_c_, kind: start.clone())
    model = net(m, "eval")
    ours = dataclasses.replace(attack, ops=ops)(model, x, y, eps_c, alpha_c)
    with torch.no_grad():
        wrong = model(ours).argmax(1) != y
    label = f"PGD-20 evaluation of HE (fastfair {name}, s = {s:g})"
    return [
        Check(label, "one attack step from each of the code's x_k", ref, worst, ONE_STEP, STEPS, detail),
        Check(label, "random start: law of the code's x + U(-eps, eps) (eval.clip_start=false)", ref,
              start_law(attack.ops, attack.init, x, y, eps_c, start), start_tol(x, start), START),
        Check(label, "20-step attack from the code's start", ref, differing(ours, g.t("result")), K_STEP, FRACTION),
        Check(label, "per-image incorrect decision after 20 steps", ref, float((wrong != g.t("incorrect")).sum()),
              exact("a decision per image"),
              "images decided differently"),
    ]
