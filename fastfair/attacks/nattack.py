"""NATTACK (Li, Li, Wang, Zhang & Gong 2019, "NATTACK: Learning the Distributions of Adversarial Examples
for an Improved Black-Box Attack on Deep Neural Networks", ICML), the query-based black-box attack Tian et
al. evaluate with (ICLR sub. App. E, KDD App. A.2: eps 0.031, population 300, sigma 0.1, lr 0.02).

It learns, per image, the mean mu of an isotropic Gaussian N(mu, sigma^2 I) in the tanh space of the image
(Li et al., Sec. 3):

    x'(z) = x + clip_[-eps, eps](g(atanh(2x - 1) + z) - x),   g(u) = (tanh(u) + 1) / 2,   z ~ N(mu, sigma^2 I)

so every sample lies in the eps ball and in [0, 1]. It lowers E_z[f(x'(z))], f the margin of the
log-probabilities max(log p_y - max_{j != y} log p_j, 0), by natural evolution strategies (Li et al., Sec. 3):
with z_k = mu + sigma e_k for a population of e_k ~ N(0, I) and the losses standardised to
A_k = (f_k - mean f) / (std f + 1e-7), mu <- mu - lr / (n sigma) sum_k A_k e_k. Only the model's outputs
are read: no gradient of the model is taken. An image stops at the first iteration where x'(mu) is
misclassified. Tian et al. give no iteration cap; fastfair stops at 500 (``nattackK`` sets K).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from fastfair.attacks.cwinf import from_box, to_box

_ROWS_PER_FORWARD = 8192  # images the population forward takes at once (memory: rows x image size)


def log_prob_margin(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """max(log p_y - max_{j != y} log p_j, 0) per row (Li et al. 2019, Sec. 3, the loss of the search)."""
    logp = logits.float().log_softmax(-1)
    true = logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    other = logp.scatter(-1, y.unsqueeze(-1), float("-inf")).amax(-1)
    return (true - other).clamp_min(0)


def candidate(x: torch.Tensor, base: torch.Tensor, z: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """x'(z) = x + clip_[-eps, eps](g(atanh(2x - 1) + z) - x) (Li et al. 2019, Sec. 3, the projection onto the ball)."""
    return x + (to_box(base + z) - x).clamp(-eps, eps)


@dataclass(frozen=True)
class NAttack:
    """NATTACK as Tian et al. run it; ``iterations`` caps each image's search (``nattackK`` sets K)."""

    iterations: int = 500
    population: int = 300
    sigma: float = 0.1
    lr: float = 0.02
    start_std: float = 0.001  # mu starts at start_std N(0, I): near the image, not exactly at it

    @torch.no_grad()
    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps_c, alpha_c=None) -> torch.Tensor:
        """The first misclassified x'(mu) of each image, else x'(mu) after ``iterations`` (in the eps ball)."""
        was_training = model.training
        model.eval()
        try:
            group = max(1, _ROWS_PER_FORWARD // self.population)
            return torch.cat([self._search(model, x[i:i + group].float(), y[i:i + group], eps_c[y[i:i + group]])
                              for i in range(0, len(x), group)]).to(x.dtype)
        finally:
            model.train(was_training)

    def _search(self, model, x, y, eps):
        p = self.population
        shape = (-1,) + (1,) * (x.dim() - 1)
        eps = eps.float().view(shape)
        base = from_box(x)
        mu = self.start_std * torch.randn_like(x)
        found = candidate(x, base, mu, eps)
        active = model(found).argmax(1) == y
        for _ in range(self.iterations):
            idx = active.nonzero().squeeze(1)
            if not len(idx):
                break
            xa, ba, ea, ya = x[idx], base[idx], eps[idx], y[idx]
            e = torch.randn((len(idx), p, *x.shape[1:]), device=x.device)
            z = mu[idx].unsqueeze(1) + self.sigma * e
            pop = candidate(xa.unsqueeze(1), ba.unsqueeze(1), z, ea.unsqueeze(1))
            f = log_prob_margin(model(pop.flatten(0, 1)).view(len(idx), p, -1), ya.unsqueeze(1).expand(-1, p))
            a = (f - f.mean(1, keepdim=True)) / (f.std(1, unbiased=False, keepdim=True) + 1e-7)
            mu[idx] = mu[idx] - self.lr / (p * self.sigma) * torch.einsum("np,np...->n...", a, e)
            found[idx] = candidate(xa, ba, mu[idx], ea)
            active[idx] = model(found[idx]).argmax(1) == ya
        return found
