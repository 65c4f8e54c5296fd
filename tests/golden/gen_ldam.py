"""LDAM (kaidic/LDAM-DRW): ``losses.LDAMLoss`` (max_m 0.5, s 30, as ``cifar_train.py`` builds it) on fixed
logits of a CIFAR-10-LT class profile (imbalance 100, ``imbalance_cifar.py``'s exponential profile): its
margins, its loss and the loss's gradient with respect to the logits.

The class moves its margins with ``torch.cuda.FloatTensor``; on a CPU machine that name stands for
``torch.FloatTensor`` while it runs (nothing else of theirs is changed)."""
import contextlib

import numpy as np
import torch

REPO = "kaidic/LDAM-DRW"
PINNED = "2536330f2afdaa65618323cb5a5850efccce762a"
SETTINGS = {"max_m": 0.5, "s": 30.0}
COUNTS = [int(5000 * 0.01 ** (k / 9)) for k in range(10)]  # img_max * imb_factor^(k / (C - 1))
N = 32


@contextlib.contextmanager
def cpu_float_tensor():
    saved = torch.cuda.FloatTensor
    torch.cuda.FloatTensor = torch.FloatTensor
    try:
        yield
    finally:
        torch.cuda.FloatTensor = saved


def generate(path, inp):
    from losses import LDAMLoss

    g = torch.Generator().manual_seed(0)
    z = (torch.rand(N, 10, generator=g) * 2 - 1).requires_grad_()  # cosine-range logits, as NormedLinear gives
    y = torch.arange(N) % 10
    with cpu_float_tensor():
        loss_fn = LDAMLoss(COUNTS, max_m=SETTINGS["max_m"], s=SETTINGS["s"])
        loss = loss_fn(z, y)
    loss.backward()
    arrays = {"counts": np.asarray(COUNTS), "logits": z.detach().numpy(), "y": y.numpy(),
              "margins": loss_fn.m_list.numpy(), "loss": loss.detach().numpy(), "grad": z.grad.numpy()}
    meta = {"file": "losses.py", "function": "LDAMLoss", "settings": SETTINGS, "counts": COUNTS,
            "loss": "F.cross_entropy(s * output, target): the batch mean", "grad": "d loss / d logits"}
    return {"ldam": (arrays, meta)}
