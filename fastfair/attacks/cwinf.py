"""Carlini & Wagner's L-inf optimisation attack (C&W 2017, "Towards Evaluating the Robustness of Neural
Networks", Sec. V-C "Our L-inf attack"), with the settings Tian et al. evaluate with (ICLR sub. App. E,
KDD App. A.2): 5 constant-search steps, 1000 iterations, lr 0.005, initial constant 0.01, tau decrease 0.9.

C&W replace the L-inf distance, whose gradient moves one coordinate at a time, by a penalty on every
coordinate beyond a threshold tau, and lower tau while they succeed:

    minimise over w   c f(x') + sum_i max(|x'_i - x_i| - tau, 0),   x' = (tanh(w) + 1) / 2

``f`` is the untargeted margin f(x') = max(Z(x')_y - max_{j != y} Z(x')_j, -kappa) (their f_6 with
kappa = 0), and the change of variables keeps x' in [0, 1] (their Sec. V "box constraints"). Each
optimisation runs ``iterations`` Adam steps from the previous solution and stops early for an image
whose objective reaches 0 (adversarial with every coordinate within tau). After a success with
distance d, tau becomes 0.9 d; after a failure c doubles, at most ``searches - 1`` times per tau,
after which the image keeps its last success (C&W's outer loop). Starting from d rather than the old
tau skips rounds that would succeed at their first step, so the iterates are those of C&W's loop.

fastfair asks a budget question (is there an adversarial example within eps?), so an image stops as
soon as a success lies within its eps, and the returned point is that success; for the others, the
last iterate projected onto the eps ball, so the attack never returns a point outside the ball.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fastfair.attacks.pgd import attack_mode

_TANH_EDGE = 1 - 1e-6  # atanh(+-1) is infinite: pixels at 0 or 1 start just inside


def margin(logits: torch.Tensor, y: torch.Tensor, kappa: float = 0.0) -> torch.Tensor:
    """f(x') = max(Z_y - max_{j != y} Z_j, -kappa) per row (C&W 2017, Sec. IV-A, f_6, untargeted)."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.scatter(1, y[:, None], float("-inf")).amax(1)
    return (true - other).clamp_min(-kappa)


def to_box(w: torch.Tensor) -> torch.Tensor:
    """x' = (tanh(w) + 1) / 2 (C&W 2017, Sec. V, change of variables: x' always in [0, 1])."""
    return (torch.tanh(w) + 1) / 2


def from_box(x: torch.Tensor) -> torch.Tensor:
    """w with to_box(w) = x (pixels at 0 and 1 moved 1e-6 inside)."""
    return torch.atanh((2 * x - 1) * _TANH_EDGE)


def linf(delta: torch.Tensor) -> torch.Tensor:
    return delta.flatten(1).abs().amax(1)


@dataclass(frozen=True)
class CWInf:
    """C&W's L-inf attack as Tian et al. run it; ``iterations`` per optimisation (``cwinfK`` sets K)."""

    iterations: int = 1000
    searches: int = 5  # optimisations per tau: c0, 2 c0, 4 c0, ... (Tian et al.'s "binary search steps")
    lr: float = 0.005
    c0: float = 0.01
    tau_decrease: float = 0.9
    tau0: float = 1.0  # C&W start with tau = 1: no coordinate penalised in [0, 1] images
    kappa: float = 0.0

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c=None) -> torch.Tensor:
        """The point in ``x``'s eps ball (``eps_c[y]``) the attack ends at (see the module docstring)."""
        with attack_mode(model, "eval"), torch.enable_grad():
            return self._search(model, x.float(), y, eps_c[y].float())

    def _search(self, model, x, y, eps):
        n = len(x)
        shape = (-1,) + (1,) * (x.dim() - 1)
        w = from_box(x).detach()
        tau = torch.full((n,), self.tau0, device=x.device)
        c = torch.full((n,), self.c0, device=x.device)
        failures = torch.zeros(n, dtype=torch.long, device=x.device)
        best = x.clone()  # the last success, else x
        best_d = torch.full((n,), float("inf"), device=x.device)
        active = torch.ones(n, dtype=torch.bool, device=x.device)
        while bool(active.any()):
            idx = active.nonzero().squeeze(1)
            w_i, ok = self._optimise(model, w[idx], x[idx], y[idx], tau[idx], c[idx])
            w[idx] = w_i
            x_i = to_box(w_i)
            d = linf(x_i - x[idx])
            # a success: record it, lower tau below its distance, start the constant afresh
            best[idx] = torch.where(ok.view(shape), x_i, best[idx])
            best_d[idx] = torch.where(ok, d, best_d[idx])
            tau[idx] = torch.where(ok, self.tau_decrease * d, tau[idx])
            c[idx] = torch.where(ok, torch.full_like(d, self.c0), 2 * c[idx])
            failures[idx] = torch.where(ok, torch.zeros_like(failures[idx]), failures[idx] + 1)
            active = (failures < self.searches) & (best_d > eps)
        inside = (best_d <= eps).view(shape)
        last = torch.minimum(torch.maximum(to_box(w), x - eps.view(shape)), x + eps.view(shape))
        return torch.where(inside, best, last).detach()

    def _optimise(self, model, w, x, y, tau, c):
        """``iterations`` Adam steps on the C&W objective from ``w``; per row, (the final w, success) where a
        row that reaches objective 0 stops there. Adam's moments start at 0, as a fresh optimiser each time."""
        shape = (-1,) + (1,) * (x.dim() - 1)
        m, v = torch.zeros_like(w), torch.zeros_like(w)
        b1, b2 = 0.9, 0.999
        done = torch.zeros(len(w), dtype=torch.bool, device=w.device)
        for t in range(1, self.iterations + 1):
            w = w.detach().requires_grad_(True)
            x_adv = to_box(w)
            raw = margin(model(x_adv).float(), y, float("inf"))
            penalty = (x_adv - x).abs().sub(tau.view(shape)).clamp_min(0).flatten(1).sum(1)
            objective = c * raw.clamp_min(-self.kappa) + penalty
            done = done | _succeeded(raw, penalty)
            if bool(done.all()):
                break
            (grad,) = torch.autograd.grad(objective.sum(), w)
            grad = grad * (~done).view(shape)  # a finished row keeps its point
            m = b1 * m + (1 - b1) * grad
            v = b2 * v + (1 - b2) * grad * grad
            step = self.lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + 1e-8)
            w = w.detach() - step * (~done).view(shape)
        with torch.no_grad():  # the final point counts too
            x_adv = to_box(w)
            raw = margin(model(x_adv).float(), y, float("inf"))
            penalty = (x_adv - x).abs().sub(tau.view(shape)).clamp_min(0).flatten(1).sum(1)
            done = done | _succeeded(raw, penalty)
        return w.detach(), done


def _succeeded(raw_margin: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """Objective 0 with kappa = 0: another class strictly ahead (a tie would still predict y when y is first)
    and every coordinate within tau."""
    return (raw_margin.detach() < 0) & (penalty.detach() <= 0)
