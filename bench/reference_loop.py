"""The baseline of bench_training.py: one training step written the way the papers' public code
trains (read for facts, written anew), so that fastfair's speed-up is measured on the same GPU in
the same run against the habits that cost time:

- fp32, NCHW tensors, a torchvision-style CPU DataLoader (a PIL image per sample; RandomCrop
  with zero padding, RandomHorizontalFlip and ToTensor in worker processes), ``.to(device)`` per
  batch and Python floats from ``.item()`` every step (the running loss and accuracy);
- PGD-AT family (Madry et al. 2018; robust_overfitting-style code): ``loss.backward()`` in every
  attack step, which also computes the weights' gradients only for ``zero_grad`` to drop them; BN
  in train mode;
- TRADES family (as in the TRADES code): BN in eval mode during the attack, the natural forward
  recomputed in every attack step, ``autograd.grad`` w.r.t. x' (so no weight gradients there),
  and a loss with three forwards (natural, adversarial, natural again), all three
  back-propagated (the KL target is not detached).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from fastfair.errors import UserError


class TorchvisionStyleDataset(Dataset):
    """uint8 images kept as HWC numpy and turned into a PIL image per sample, as torchvision.datasets.CIFAR10 does."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor, padding: int, flip: bool):
        from torchvision import transforms  # here, not at the top: 2.4 CPU s that importing bench's modules skips

        self.images = x.permute(0, 2, 3, 1).numpy()
        self.labels = y.tolist()
        steps = [transforms.RandomCrop(self.images.shape[1], padding=padding)] if padding else []
        steps += [transforms.RandomHorizontalFlip()] if flip else []
        self.transform = transforms.Compose([*steps, transforms.ToTensor()])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i):
        img = self.images[i]
        return self.transform(Image.fromarray(img[..., 0] if img.shape[-1] == 1 else img)), self.labels[i]


def loader(x, y, batch_size: int, *, padding: int, flip: bool, workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(TorchvisionStyleDataset(x, y, padding, flip), batch_size=batch_size, shuffle=True,
                      num_workers=workers, pin_memory=pin_memory, drop_last=True)


def _entropy(z: torch.Tensor) -> torch.Tensor:
    logp = F.log_softmax(z, dim=1)
    return -(logp.exp() * logp).sum(dim=1)


def pgd_at_step(model, opt, x, y, cfg) -> tuple[float, int]:
    """PGD-AT / ME-AT step: CE(f(x'), y) - beta H(p(x')), x' from PGD with .backward() per attack step."""
    a, m = cfg.attack, cfg.method
    model.train()
    delta = torch.empty_like(x).uniform_(-a.eps, a.eps)
    delta = ((x + delta).clamp(0, 1) - x).requires_grad_(True)
    for _ in range(a.steps):
        F.cross_entropy(model(x + delta), y).backward()  # fills the weights' .grad too
        with torch.no_grad():
            delta += a.alpha * delta.grad.sign()
            delta.clamp_(-a.eps, a.eps)
            delta.copy_((x + delta).clamp(0, 1) - x)
        delta.grad.zero_()
    out = model((x + delta).detach())
    loss = F.cross_entropy(out, y, label_smoothing=m.smoothing)
    if m.entropy_weight:
        loss = loss - m.entropy_weight * _entropy(out).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item(), (out.argmax(1) == y).sum().item()


def trades_step(model, opt, x, y, cfg) -> tuple[float, int]:
    """TRADES / ME-TRADES step: CE(f(x), y) + lambda KL(p(x) || p(x')) - beta H(p(x)), TRADES-code style."""
    a, m = cfg.attack, cfg.method
    model.eval()
    x_adv = x + 0.001 * torch.randn_like(x)
    for _ in range(a.steps):
        x_adv.requires_grad_(True)
        kl = F.kl_div(F.log_softmax(model(x_adv), dim=1), F.softmax(model(x), dim=1), reduction="sum")
        (grad,) = torch.autograd.grad(kl, [x_adv])
        x_adv = torch.min(torch.max(x_adv.detach() + a.alpha * grad.sign(), x - a.eps), x + a.eps).clamp(0, 1)
    model.train()
    opt.zero_grad()
    z_nat, z_adv = model(x), model(x_adv)
    kl = F.kl_div(F.log_softmax(z_adv, dim=1), F.softmax(model(x), dim=1), reduction="sum") / len(y)
    loss = F.cross_entropy(z_nat, y, label_smoothing=m.smoothing) + m.kl_weight * kl
    if m.entropy_weight:
        loss = loss - m.entropy_weight * _entropy(z_nat).mean()
    loss.backward()
    opt.step()
    return loss.item(), (z_adv.argmax(1) == y).sum().item()


STEPS = {"pgd-at": pgd_at_step, "me-at": pgd_at_step, "trades": trades_step, "me-trades": trades_step}


def step_for(method: str):
    if method not in STEPS:
        raise UserError(f"the reference loop has no step for method {method!r}; it has {', '.join(sorted(STEPS))}")
    return STEPS[method]
