"""Carlini & Wagner's L-inf optimisation attack (C&W 2017, "Towards Evaluating the Robustness of Neural
Networks", Sec. V-C "Our L-inf attack") as Carmon et al. (2019) implement it, which Tian et al. follow (ICLR sub.
Sec. 3.3, App. E; KDD App. A.2), with their settings: 5 binary-search steps, 1000 iterations, lr 0.005, initial
constant 0.01, tau decrease 0.9.

C&W replace the L-inf distance, whose gradient moves one coordinate at a time, by a penalty on every
coordinate beyond a threshold tau, and lower tau while they succeed:

    minimise over w   sum_i max(|x'_i - x_i| - tau, 0) + c max(Z(x')_y - max_{j != y} Z(x')_j + kappa, 0)

with x' = (tanh(w) + 1) / 2 in [0, 1] (their Sec. V "box constraints"). The search is Carmon et al.'s
(semisup-adv ``attack_cw.py``, foolbox 1.x based), image by image:

* an outer search on c: c0, then x10 until some tau succeeds, then bisection between the largest failing and
  the smallest succeeding c, ``searches`` constants in all;
* for each c, rounds from the image with tau = the first tau that failed so far (1 at first); a round is a fresh
  Adam (lr, eps 1e-7) from the round's start point, up to ``iterations`` steps, stopped early when the objective
  fell by no more than 1e-4 over a tenth of them; a round succeeds if any iterate was misclassified, and then
  tau becomes 0.9 min(tau, L-inf distance of the last iterate) and the next round starts there; the first
  round that fails (or tau <= 1/256) ends the constant;
* the answer is the closest misclassified iterate of all rounds (foolbox keeps the best adversarial it is shown).

fastfair asks a budget question (is there an adversarial example within eps?): an image stops once a
misclassified iterate lies within its eps, and the point returned is that iterate; an image without one keeps
its clean input, so the attack is exactly as strong as the reference at eps. :meth:`CWInf.distances` runs the
search to its end and returns the closest adversarial distance per image (``tests/conformance_cwinf.py``
compares it with the reference's).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from fastfair.attacks.pgd import attack_mode, flag_masked
from fastfair.ops.losses import widened

_TANH_EDGE = 1 - 1e-6  # atanh(+-1) is infinite: images are shrunk by this factor into (-1, 1) first


def margin(logits: torch.Tensor, y: torch.Tensor, kappa: float = 0.0) -> torch.Tensor:
    """f(x') = max(Z_y - max_{j != y} Z_j, -kappa) per row (C&W 2017, Sec. IV-A, f_6, untargeted)."""
    true = logits.gather(1, y[:, None]).squeeze(1)
    other = logits.scatter(1, y[:, None], float("-inf")).amax(1)
    return (true - other).clamp_min(-kappa)


def to_box(w: torch.Tensor) -> torch.Tensor:
    """x' = (tanh(w) + 1) / 2 (C&W 2017, Sec. V, change of variables: x' always in [0, 1])."""
    return (torch.tanh(w) + 1) / 2


def from_box(x: torch.Tensor) -> torch.Tensor:
    """w with to_box(w) = (2x - 1)(1 - 1e-6) / 2 + 1/2 (pixels at 0 and 1 moved just inside, as the reference)."""
    return torch.atanh((2 * x - 1) * _TANH_EDGE)


def linf(delta: torch.Tensor) -> torch.Tensor:
    return delta.flatten(1).abs().amax(1)


@dataclass(frozen=True)
class CWInf:
    """C&W's L-inf attack as Tian et al. run it; ``iterations`` per round (``cwinfK`` sets K)."""

    iterations: int = 1000
    searches: int = 5  # Tian et al.'s "binary search steps": constants tried per image
    lr: float = 0.005
    c0: float = 0.01
    tau_decrease: float = 0.9
    tau0: float = 1.0  # no coordinate of a [0, 1] image is penalised at first
    tau_min: float = 1 / 256  # the reference's last tau: one grey level
    kappa: float = 0.0

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c=None,
                 masked: torch.Tensor | None = None) -> torch.Tensor:
        """The closest misclassified iterate where it lies within ``eps_c[y]``, else ``x`` (module docstring);
        ``masked`` ((N,) bool) gains the images whose gradient was not finite at some iteration."""
        x = widened(x)  # float32 at least; a float64 model's (the conformance checks') search stays float64
        eps = eps_c[y].to(x.dtype)
        best, dist = self.distances(model, x, y, stop_at=eps, masked=masked)
        shape = (-1,) + (1,) * (x.dim() - 1)
        return torch.where((dist <= eps).view(shape), best, x)

    def distances(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                  stop_at: torch.Tensor | None = None, masked: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """(closest misclassified iterate, its L-inf distance to x; inf where none), per image; an image stops
        once its distance is <= ``stop_at`` (None: the whole search). Clean-misclassified images: (x, 0)."""
        with attack_mode(model, "eval"), torch.enable_grad():
            return self._search(model, widened(x.detach()), y, stop_at, masked)

    def _search(self, model, x, y, stop_at, masked):
        n, dev = len(x), x.device
        shape = (-1,) + (1,) * (x.dim() - 1)
        w_clean = from_box(x)
        x_ref = to_box(w_clean)  # the penalty's centre: x as the tanh space holds it
        with torch.no_grad():
            best, best_d = x.clone(), torch.full((n,), math.inf, device=dev)
            wrong = model(x).argmax(1) != y  # the reference returns a misclassified input at distance 0
            best_d[wrong] = 0.0
            self._keep(model(x_ref), y, x_ref, x, best, best_d)
        done = wrong | (best_d <= stop_at if stop_at is not None else wrong)
        full = lambda v, dt=x.dtype: torch.full((n,), v, dtype=dt, device=dev)  # noqa: E731
        c, lower, upper, step = full(self.c0, torch.float64), full(0.0, torch.float64), full(math.inf, torch.float64), \
            full(0, torch.long)
        tau, start_tau = full(self.tau0), full(self.tau0)
        w0 = w_clean.clone()
        p, m, v = torch.zeros_like(x), torch.zeros_like(x), torch.zeros_like(x)
        it, prev, found = full(0, torch.long), full(math.inf), full(False, torch.bool)
        check_every = math.ceil(self.iterations / 10)
        b1, b2 = 0.9, 0.999
        while not bool(done.all()):
            i = (~done).nonzero().squeeze(1)
            w = (w0[i] + p[i]).requires_grad_(True)
            xa = to_box(w)
            logits = widened(model(xa))
            hinge = margin(logits, y[i], self.kappa) + self.kappa  # max(Z_y - max_j Z_j + kappa, 0)
            penalty = ((xa - x_ref[i]).abs() - tau[i].view(shape)).clamp_min(0).flatten(1).sum(1)
            loss = penalty + c[i].to(x.dtype) * hinge
            (g,) = torch.autograd.grad(loss.sum(), w)
            if masked is not None:  # the rows still searching: their flags, set on the device
                sub = masked[i]
                flag_masked(sub, g)
                masked[i] = sub
            with torch.no_grad():
                xa = xa.detach()
                sub_best, sub_d = best[i], best_d[i]
                adv = self._keep(logits.detach(), y[i], xa, x[i], sub_best, sub_d)
                best[i], best_d[i] = sub_best, sub_d
                t = it[i] + 1  # Adam's step count: one per iteration of the round
                m[i] = b1 * m[i] + (1 - b1) * g
                v[i] = b2 * v[i] + (1 - b2) * g * g
                bc1 = (1 - b1 ** t.double()).to(x.dtype).view(shape)
                bc2 = (1 - b2 ** t.double()).to(x.dtype).view(shape)
                p[i] = p[i] - self.lr * (m[i] / bc1) / ((v[i] / bc2).sqrt() + 1e-7)
                found[i] |= adv
                # every tenth of the iterations (iteration 0 included), stop a round whose objective stalled
                checked = (it[i] % check_every) == 0
                stalled = checked & ~((prev[i] - loss.detach()) > 1e-4)
                prev[i] = torch.where(checked & ~stalled, loss.detach(), prev[i])
                it[i] = t
                ends = i[stalled | (t >= self.iterations)]
                if len(ends):
                    self._end_rounds(ends, x_ref, w_clean, w0, p, tau, start_tau, found, c, lower, upper, step)
                    m[ends], v[ends], p[ends] = 0.0, 0.0, 0.0
                    it[ends], prev[ends], found[ends] = 0, math.inf, False
                    done[ends] |= step[ends] >= self.searches
                if stop_at is not None:
                    done |= best_d <= stop_at
        return best.detach(), best_d

    @staticmethod
    def _keep(logits, y, xa, x, best, best_d) -> torch.Tensor:
        """Record each misclassified iterate closer than the image's best so far (in place); the misclassified mask."""
        adv = logits.argmax(1) != y
        d = linf(xa - x)
        closer = adv & (d < best_d)
        best[closer] = xa[closer]
        best_d[closer] = d[closer]
        return adv

    def _end_rounds(self, j, x_ref, w_clean, w0, p, tau, start_tau, found, c, lower, upper, step):
        """The images ``j`` finished a round: lower tau and go on from the last iterate, or end the constant."""
        shape = (-1,) + (1,) * (x_ref.dim() - 1)
        last = to_box(w0[j] + p[j])
        ok = found[j]
        # a failed round ends the constant; the constant succeeded if an earlier round (a larger tau) did
        c_ok = torch.where(ok, torch.ones_like(ok), tau[j] < start_tau[j])
        start_tau[j] = torch.where(ok, start_tau[j], tau[j])
        new_tau = torch.minimum(tau[j], linf(last - x_ref[j])) * self.tau_decrease
        tau[j] = torch.where(ok, new_tau, tau[j])
        w0[j] = torch.where(ok.view(shape), from_box(last), w0[j])
        ends_c = ~ok | (tau[j] <= self.tau_min)
        k = j[ends_c]
        if len(k):
            ok_k = c_ok[ends_c]
            upper[k] = torch.where(ok_k, c[k], upper[k])
            lower[k] = torch.where(ok_k, lower[k], c[k])
            c[k] = torch.where(torch.isinf(upper[k]), c[k] * 10, (lower[k] + upper[k]) / 2)
            step[k] += 1
            tau[k] = start_tau[k]
            w0[k] = w_clean[k]
