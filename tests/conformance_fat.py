"""FAT against zjfheart/Friendly-Adversarial-Training: its early-stopped PGD (with the omega step noise) step by
step and from the code's start, the loss and weight gradient of its training step, and the dynamic tau schedule.

Also the attack traces both this module and ``conformance_cfa.py`` read: a golden trace stores the code's start,
per step the sign of the code's input gradient (2 where it is within float32 noise of zero, :data:`SIGN_NOISE`, 3
where within float64's too, :func:`sign_noise`),
the rows the code moved, and the residual that makes :func:`replay` give back the code's iterates bit for bit
(the generator asserts it), so a trace is a few hundred KB instead of K full iterates.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch import nn

from conformance import (FRACTION, K_STEP, ONE_STEP, REL, SIGN_NOISE, STEPS, U32, U64, Check, case,
                         differing, exact, fixed_start, golden, inputs, kl_grad, logit_tol, max_diff, method, normals,
                         rel_diff, routing_ties, sign_noise, step_flips, weight_grad, weight_grad_tol, working_dtype)
from fastfair.attacks.pgd import attack_mode, descend
from fastfair.methods.fat import tau_at

ROW = (-1, 1, 1, 1)


def replay_step(x_k, x, code, eps, alpha, moved=None, noise=None):
    """The L-inf step the trace's sign code says the code took from x_k (before its residual)."""
    base = x_k if noise is None else x_k + noise
    eps = eps.view(ROW)
    out = torch.min(torch.max(base + alpha * code.sign().to(x.dtype), x - eps), x + eps).clamp(0.0, 1.0)
    return out if moved is None else torch.where(moved.view(ROW), out, x_k)


def sign_code(grad: torch.Tensor) -> torch.Tensor:
    """int8 sign of the gradient, doubled where it is within float32 noise of zero and tripled where within
    float64's too (as step_flips judges in each precision)."""
    scale = grad.flatten(1).abs().amax(1).view(ROW)
    level = 1 + (grad.abs() <= SIGN_NOISE * scale).to(grad.dtype) + (grad.abs() <= SIGN_NOISE * U64 / U32 * scale)
    return (grad.sign() * level).to(torch.int8)


def code_grad(code: torch.Tensor) -> torch.Tensor:
    """A gradient with the code's signs whose near-zero elements are exactly the code's in the precision: for
    step_flips."""
    c = code.to(working_dtype())
    noise = c.abs() >= (3 if working_dtype() == torch.float64 else 2)
    return torch.where(noise, c.sign() * sign_noise() / 10, c.sign())


def encode(prefix, x, iterates, grads, eps, alpha, moved=None, noise=None) -> dict:
    """Arrays ``prefix.*`` of a trace of K steps (``iterates`` x_0..x_K, ``grads`` g_0..g_{K-1}, None where
    the code took no gradient), checked to :func:`decode` back to the code's iterates exactly."""
    codes, residual = [], []
    for k, g in enumerate(grads):
        code = sign_code(g) if g is not None else torch.zeros_like(x, dtype=torch.int8)
        m = None if moved is None else moved[k]
        n = None if noise is None else noise[k]
        residual.append(iterates[k + 1] - replay_step(iterates[k], x, code, eps, alpha, m, n))
        codes.append(code)
    out = {f"{prefix}.start": iterates[0].numpy(), f"{prefix}.codes": torch.stack(codes).numpy(),
           f"{prefix}.residual": torch.stack(residual).numpy(), f"{prefix}.eps": eps.numpy()}
    if moved is not None:
        out[f"{prefix}.moved"] = moved.numpy()
    back = decode(out, prefix, x, alpha, noise)
    assert all(torch.equal(a, b) for a, b in zip(back, iterates)), f"{prefix}: the trace does not decode exactly"
    return out


def decode(arrays, prefix, x, alpha, noise=None) -> list[torch.Tensor]:
    """The code's iterates x_0..x_K from a trace, replayed in the trace's float64 and handed back in ``x``'s dtype
    (each rounded once, in a float32 run: a row the code stopped keeps the same point)."""
    t = {k.split(".", 1)[1]: torch.from_numpy(np.array(v)) for k, v in arrays.items() if k.startswith(prefix + ".")}
    t = {k: v.double() if v.is_floating_point() else v for k, v in t.items()}
    x64 = x.double()
    its = [t["start"]]
    for k in range(len(t["codes"])):
        m = t["moved"][k] if "moved" in t else None
        n = None if noise is None else noise[k].double()
        its.append(replay_step(its[-1], x64, t["codes"][k], t["eps"], alpha, m, n) + t["residual"][k])
    return [it.to(x.dtype) for it in its]


class Flip(nn.Module):
    """A made-up model whose prediction flips with each PGD step: class 0 while floor(first pixel / alpha) is
    even, else class 1, and CE(., 0) has a negative input gradient everywhere, so every unclipped step moves the
    pixel down by alpha. With labels 0 it is what tells the early-stop rules apart (TinyNet's rows, once
    misclassified, stay so: there FAT's and CFA's rules take the same steps)."""

    def __init__(self, alpha: float):
        super().__init__()
        self.alpha = alpha
        self.scale = nn.Parameter(torch.ones(()))  # a weight, so the code's training step can backpropagate

    def forward(self, x):
        k = torch.floor(x.detach()[:, 0, 0, 0] / self.alpha)
        right = torch.where(k.remainder(2) == 0, 10.0, -10.0)
        z0 = right + 1e-3 * self.scale * x.flatten(1).sum(1)
        return torch.cat([z0[:, None], torch.zeros(len(x), 9)], 1)


@dataclass(frozen=True)
class Resumed:
    """A stop rule picked up in the state it had reached: one step from the code's x_k with its history."""

    rule: Any
    state: Any

    def start(self, y):
        return self.state

    def update(self, state, logits, y):
        return self.rule.update(state, logits, y)


def attack_checks(label: str, ref: str, m, state, g, prefix: str, model_fn, x, y, unit=None,
                  targets=(None, None)) -> list[Check]:
    """One step of fastfair's attack from each of the code's x_k (its stop rule replayed over the code's own
    iterates up to k), and the K steps from the code's start, against a golden trace. ``unit``: the code's
    N(0, I) step-noise draws (K, *x.shape), which fastfair's attack scales by its omega; ``targets``: the code's
    (target, toward) of a targeted attack, which the caller also makes ``m.perturb`` use."""
    alpha = m.cfg.attack.alpha
    noise = None if unit is None else m.attack.noise * unit
    its = decode(g.arrays, prefix, x, alpha, noise)
    codes = g.t(f"{prefix}.codes")
    attack = m.attack
    rule = attack.stop.start(y) if attack.stop else None
    worst = flips = 0
    for k in range(len(codes)):
        one = dataclasses.replace(attack, steps=1, stop=Resumed(attack.stop, rule) if attack.stop else None)
        model = model_fn()
        with attack_mode(model, one.bn_mode), torch.enable_grad():
            ours = descend(one, model, x, y, state["eps"], state["alpha"], its[k], *targets,
                           None if noise is None else noise[k:k + 1])
            routed = routing_ties(model, its[k])
            grad = code_grad(codes[k])
            if one.objective == "kl" and hasattr(model, "features"):
                grad = kl_grad(model, x, its[k], grad)
        n, unexplained = step_flips(ours, its[k + 1], grad, alpha, routed)
        flips, worst = flips + n, max(worst, unexplained)
        if attack.stop:  # the rule's state after the code's check at x_k, as fastfair's engine reaches it
            model = model_fn()
            with attack_mode(model, attack.bn_mode), torch.no_grad():
                _, rule = attack.stop.update(rule, model(its[k]), y)
    model = model_fn()
    served = contextlib.nullcontext() if unit is None else mock.patch("torch.randn", lambda *a, **k: unit.clone())
    with fixed_start(m, its[0]), served:
        x_adv = m.perturb(model, x, y, state)
    return [
        Check(label, "one attack step from each of the code's x_k", ref, worst, ONE_STEP, STEPS,
              f"{flips} noise flips in {len(codes)} steps"),
        Check(label, "K-step attack from the code's start", ref,
              differing(x_adv, its[-1]), K_STEP, FRACTION),
    ]


# -- FAT's own code ---------------------------------------------------------------------------------------------

def fat_noise(g, prefix: str) -> torch.Tensor:
    """The unit N(0, I) draws FAT's code added at each step, per row of the whole batch: its torch.randn was
    served slices of a bank of :func:`conformance.normals` (row r of the moving rows got row r of the bank's step)."""
    meta = g.meta["noise"]
    bank = normals(meta["seed"], meta["shape"])
    assert float(bank.sum()) == meta["sum"], "numpy draws this seed differently now"
    moved = g.t(f"{prefix}.moved")
    bank = bank.to(working_dtype())
    out = torch.zeros_like(bank)
    for k in range(len(moved)):
        out[k, moved[k]] = bank[k, :int(moved[k].sum())]
    return out


def fat_method(g, tau: int):
    s = g.meta["settings"]
    return method("fat", f"attack.eps={s['epsilon']}", f"attack.alpha={s['step_size']}",
                  f"attack.steps={s['num_steps']}", f"method.tau={tau}", "method.tau_milestones=[]",
                  f"method.omega={s['omega']}")


@case("fat")
def fat():
    g, inp = golden("fat"), inputs()
    n = g.meta["batch"]
    x, y = inp.x[:n], inp.y[:n]
    out = []
    for prefix in g.meta["flip_taus"]:  # the made-up model whose prediction flips with each step
        tau = g.meta["flip_taus"][prefix]
        m, state = fat_method(g, tau)
        alpha = m.cfg.attack.alpha
        out += attack_checks(f"FAT (tau {tau}, flipping model)", g.ref("attack"), m, state, g, prefix,
                             lambda: Flip(alpha), x, torch.zeros_like(y), fat_noise(g, prefix))
    for tau in g.meta["taus"]:
        prefix = f"tau{tau}"
        m, state = fat_method(g, tau)
        noise = fat_noise(g, prefix)
        ref = g.ref("attack")
        out += attack_checks(f"FAT (tau {tau})", ref, m, state, g, prefix, lambda: inp.model("eval"), x, y, noise)
        model = inp.model("train")
        x_adv = decode(g.arrays, prefix, x, m.cfg.attack.alpha, m.cfg.method.omega * noise)[-1]
        loss, _ = m.objective(model, x, x_adv, y, state)
        ref = g.ref("train")

        def exact_loss(net, m=m, state=state, x_adv=x_adv):
            return m.objective(net, x, x_adv, y, state)[0]

        out += [Check(f"FAT (tau {tau})", "loss on the code's x_adv", ref,
                      max_diff(loss.detach(), g.t(f"{prefix}.loss")), logit_tol(exact_loss, model)),
                Check(f"FAT (tau {tau})", "weight gradient on the code's x_adv", ref,
                      rel_diff(weight_grad(model, loss), g.t(f"{prefix}.weight_grad")),
                      weight_grad_tol(exact_loss, model), REL)]
    epochs = range(len(g.t("tau_schedule")))
    ours = torch.tensor([tau_at(e, 0, method("fat")[0].cfg.method.tau_milestones) for e in epochs])
    out.append(Check("FAT", "dynamic tau per epoch (epochs 0-119)", g.ref("tau_schedule"),
                     max_diff(ours, g.t("tau_schedule")), exact("integers from the same milestones")))
    return out
