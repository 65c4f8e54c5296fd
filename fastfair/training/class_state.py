"""Per-class state: the vectors methods read (eps_k, alpha_k, weights) and on-device counters."""
from __future__ import annotations

import torch


class ClassState:
    """Per-class ``(C,)`` vectors and correct/total counters, all on the device.

    :meth:`count` only adds on the device (``index_add_``: no host sync, unlike
    ``bincount`` on CUDA); :meth:`read` is the one sync of an epoch.
    """

    def __init__(self, num_classes: int, device):
        self.num_classes = num_classes
        self.device = torch.device(device)
        self.vectors: dict[str, torch.Tensor] = {}
        self.correct = torch.zeros(num_classes, dtype=torch.long, device=self.device)
        self.total = torch.zeros(num_classes, dtype=torch.long, device=self.device)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self.steps = 0

    def add_vector(self, name: str, value) -> torch.Tensor:
        t = torch.as_tensor(value, dtype=torch.float32, device=self.device)
        self.vectors[name] = (t.expand(self.num_classes) if t.dim() == 0 else t).clone()
        if self.vectors[name].shape != (self.num_classes,):
            raise ValueError(f"per-class vector {name!r} needs {self.num_classes} values, got {tuple(t.shape)}")
        return self.vectors[name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.vectors[name]

    def set(self, name: str, value) -> None:
        self.vectors[name].copy_(torch.as_tensor(value, dtype=torch.float32))

    @torch.no_grad()
    def count(self, logits: torch.Tensor, y: torch.Tensor, loss: torch.Tensor) -> None:
        self.total.index_add_(0, y, torch.ones_like(y))
        self.correct.index_add_(0, y, (logits.argmax(1) == y).long())
        self.loss_sum += loss.detach().float()
        self.steps += 1

    def read(self) -> dict:
        """Counters of the epoch as Python numbers (one host sync), then reset them."""
        correct, total = self.correct.cpu(), self.total.cpu()
        out = {
            "train_acc_per_class": (100.0 * correct / total.clamp(min=1)).tolist(),
            "train_acc": float(100.0 * correct.sum() / total.sum().clamp(min=1)),
            "loss": float(self.loss_sum.cpu()) / max(self.steps, 1),
            "vectors": {k: v.cpu().tolist() for k, v in self.vectors.items()},
        }
        self.correct.zero_(), self.total.zero_(), self.loss_sum.zero_()
        self.steps = 0
        return out

    def state_dict(self) -> dict:
        return {k: v.cpu() for k, v in self.vectors.items()}

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            self.vectors[k] = v.to(self.device).clone()
