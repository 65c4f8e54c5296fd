"""Class-aware re-sampling of a training epoch (the ``resampling`` option, :mod:`fastfair.methods.resampling`).

An epoch of n images is n draws with replacement: a class k with probability p_k, then one of its
images uniformly, so an image of class k is drawn with probability p_k / n_k (the class-aware
sampler of long-tail learning, Shen et al. 2016; Kang et al. 2020, Sec. 3 and Eq. 1). The draw is a
few device ops (inverse CDF with ``searchsorted``), no host sync, from the loader's generator
reseeded from (seed, epoch): a resumed run and every torchrun rank draw the same indices.
"""
from __future__ import annotations

import torch


class ClassIndex:
    """A split's images grouped by class, for :func:`draw`: the order sorting them by label, each class's
    first position in it, and its count (made once; one host sync to size the bincount)."""

    def __init__(self, y: torch.Tensor, num_classes: int):
        self.by_class = torch.argsort(y, stable=True)
        self.count = torch.bincount(y, minlength=num_classes)
        self.start = self.count.cumsum(0) - self.count


def draw(p: torch.Tensor, index: ClassIndex, n: int, gen: torch.Generator) -> torch.Tensor:
    """n image indices: class k with probability p_k / sum(p) (p (C,) >= 0, zero for classes without images),
    then an image of class k uniformly (Kang et al. 2020, Eq. 1's class-aware sampler)."""
    dev = p.device
    cdf = p.float().cumsum(0)
    u = torch.rand(n, device=dev, generator=gen) * cdf[-1]
    # u can round up to the total: cap at the last class with p_k > 0, never at a class of p_k = 0 after it
    last = torch.where(p > 0, torch.arange(len(p), device=dev), 0).amax()
    k = torch.minimum(torch.searchsorted(cdf, u, right=True), last)
    count = index.count[k]
    j = torch.minimum((torch.rand(n, device=dev, generator=gen) * count).long(), count - 1)  # the same rounding
    return index.by_class[index.start[k] + j]
