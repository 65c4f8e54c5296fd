"""Per-class state on the device: the vectors methods read (eps_k, alpha_k, beta_k, loss weights),
the factors options multiply into them, and the epoch's per-class statistics.

A vector is a base that its owner declares (the method: eps from the attack, beta from TRADES;
the state itself: ``loss_weight`` of ones) times the factors that methods and options add
(CCM's ``eps_ccm``, FRL's ``eps_frl``, CCR's ``kl_weight_ccr``, cost-sensitive ``loss_weight_cs``).
Statistics accumulate over an epoch with device-only adds (``index_add_``: no host sync, unlike
``bincount`` on CUDA); :meth:`ClassState.read` is the epoch's one sync.
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.ops.losses import widened
from fastfair.registry import Registry


class Statistic:
    """An on-device accumulator over one epoch: :meth:`update` each step, :meth:`value` once at the end.

    Its state is a few sum tensors (:attr:`sums`), which is what lets torchrun add them over ranks. It reads the
    step's counted logits (``reads = "adv"``), or another of the logits a method's loss names (ABSLD's "nat")."""

    reads = "adv"

    def __init__(self, num_classes: int, device: torch.device):
        self.num_classes = num_classes
        self.sums: dict[str, torch.Tensor] = {}

    def update(self, logits: torch.Tensor, y: torch.Tensor) -> None:
        raise NotImplementedError

    def value(self, sums: dict[str, torch.Tensor]) -> torch.Tensor:
        """The epoch's value from the sums (CPU tensors, read in the epoch's one sync)."""
        raise NotImplementedError


STATISTICS: Registry[type[Statistic]] = Registry("per-class statistic")


def counted(logits: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    """The logits a step's accuracy is counted from: the tensor a method's loss returns, or its dict's "adv"."""
    return logits["adv"] if isinstance(logits, dict) else logits


@STATISTICS.register("softmax_by_class", "(C, C): row k is the mean softmax over class k's training adversarial "
                                         "examples (the class-wise similarity of DAFA, Lee et al. 2024)")
class SoftmaxByClass(Statistic):
    def __init__(self, num_classes, device):
        super().__init__(num_classes, device)
        self.sums = {"p": torch.zeros(num_classes, num_classes, device=device),
                     "n": torch.zeros(num_classes, device=device)}

    def update(self, logits, y):
        self.sums["p"].index_add_(0, y, widened(logits.detach()).softmax(1))
        self.sums["n"].index_add_(0, y, torch.ones_like(y, dtype=self.sums["n"].dtype))

    def value(self, sums):
        return sums["p"] / sums["n"].clamp(min=1)[:, None]


class CESumByClass(Statistic):
    """(C,): the sum over the epoch of CE(logits, y) over class k's training examples (ABSLD code: the
    per-class error risk its temperatures follow, class_labels_total_loss_adv / _nat)."""

    def __init__(self, num_classes, device):
        super().__init__(num_classes, device)
        self.sums = {"ce": torch.zeros(num_classes, device=device)}

    def update(self, logits, y):
        ce = torch.nn.functional.cross_entropy(widened(logits.detach()), y, reduction="none")
        self.sums["ce"].index_add_(0, y, ce)

    def value(self, sums):
        return sums["ce"].clone()  # on a CPU .cpu() is the sum itself, which read() zeroes next


STATISTICS.register("ce_sum_adv", "(C,): sum of CE over class k's training adversarial examples, from the "
                                  "forward that fed the loss (ABSLD's adversarial error risk)")(CESumByClass)


@STATISTICS.register("ce_sum_nat", "(C,): sum of CE over class k's clean training examples, from the forward "
                                   "that fed the loss (ABSLD's natural error risk)")
class CESumNatByClass(CESumByClass):
    reads = "nat"


class ClassState:
    """Per-class ``(C,)`` vectors and factors, the epoch's counters and statistics, all on the device."""

    def __init__(self, num_classes: int, device, train_counts=None):
        """``train_counts``: images per class of the training split (the trainer's; None where unknown), which
        the long-tail options read (class-balanced weights, LDAM margins)."""
        self.num_classes = num_classes
        self.device = torch.device(device)
        self.train_counts = None if train_counts is None else torch.as_tensor(train_counts, dtype=torch.long).cpu()
        self.vectors: dict[str, torch.Tensor] = {}  # what methods read: base x factors
        self.bases: dict[str, torch.Tensor] = {}
        self.factors: dict[str, dict[str, torch.Tensor]] = {}  # vector -> {factor name: factor}
        self.statistics: dict[str, Statistic] = {}
        self.correct = torch.zeros(num_classes, dtype=torch.long, device=self.device)
        self.total = torch.zeros(num_classes, dtype=torch.long, device=self.device)
        self.loss_sum = torch.zeros((), dtype=torch.float32, device=self.device)
        self.steps = 0
        self.add_vector("loss_weight", 1.0)  # per-class loss weights: ones unless an option adds a factor

    def _per_class(self, name: str, value) -> torch.Tensor:
        # torch's default dtype: float32, float64 in the float64 conformance checks (tests/conformance.py)
        t = torch.as_tensor(value, dtype=torch.get_default_dtype(), device=self.device)
        t = (t.expand(self.num_classes) if t.dim() == 0 else t).clone()
        if t.shape != (self.num_classes,):
            raise UserError(f"per-class vector {name!r} needs {self.num_classes} values (one per class), "
                            f"got {tuple(t.shape)}")
        return t

    def add_vector(self, name: str, base) -> torch.Tensor:
        """Declare vector ``name`` with its base value (a float or one value per class)."""
        self.bases[name] = self._per_class(name, base)
        self.factors[name] = {}
        self.vectors[name] = self.bases[name].clone()
        return self.vectors[name]

    def add_factor(self, vector: str, name: str, init=1.0, owner: str = "") -> torch.Tensor:
        """Add factor ``name`` to ``vector``: from now on ``state[vector]`` is base x every factor."""
        if vector not in self.bases:
            have = ", ".join(sorted(self.bases))
            raise UserError(f"{owner or name} scales the per-class vector {vector!r}, which this run's method does not "
                            f"have (it has {have}); choose a method that uses {vector!r}")
        self.factors[vector][name] = self._per_class(name, init)
        self.refresh()
        return self.factors[vector][name]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.vectors[name]

    def _named(self) -> dict[str, torch.Tensor]:
        """Every base (under its vector's name) and factor, as a checkpoint holds them."""
        return {**self.bases, **{f: t for fs in self.factors.values() for f, t in fs.items()}}

    def set(self, name: str, value) -> None:
        """Set a base or a factor; the vectors it enters are recomputed."""
        target = self._named()[name]
        target.copy_(torch.as_tensor(value, dtype=target.dtype))
        self.refresh()

    def refresh(self) -> None:
        """vector = base x factors, written in place (the tensors a compiled step holds stay the same)."""
        for name, base in self.bases.items():
            out = base.clone()
            for factor in self.factors[name].values():
                out = out * factor
            self.vectors[name].copy_(out)

    def add_statistic(self, name: str) -> None:
        """Accumulate the registered statistic ``name`` (:data:`STATISTICS`) from every training step."""
        if name not in self.statistics:
            self.statistics[name] = STATISTICS.get(name)(self.num_classes, self.device)

    def sum_tensors(self) -> list[torch.Tensor]:
        """Every tensor that sums over the epoch (torchrun adds them over ranks)."""
        return [self.correct, self.total, self.loss_sum] + [
            t for s in self.statistics.values() for t in s.sums.values()]

    @torch.no_grad()
    def count(self, logits: torch.Tensor | dict[str, torch.Tensor], y: torch.Tensor, loss: torch.Tensor) -> None:
        """One step's counts from its logits: a tensor (the adversarial logits), or a method's named logits, whose
        "adv" entry is counted (:func:`counted`) and each statistic reads the one it names."""
        named = logits if isinstance(logits, dict) else {"adv": logits}
        self.total.index_add_(0, y, torch.ones_like(y))
        self.correct.index_add_(0, y, (counted(logits).argmax(1) == y).long())
        self.loss_sum += loss.detach().float()
        for statistic in self.statistics.values():
            statistic.update(named[statistic.reads], y)
        self.steps += 1

    def read(self) -> dict:
        """Counters and statistics of the epoch (one host sync), then reset them."""
        correct, total = self.correct.cpu(), self.total.cpu()
        out = {
            "train_acc_per_class": (100.0 * correct / total.clamp(min=1)).tolist(),
            "train_acc": float(100.0 * correct.sum() / total.sum().clamp(min=1)),
            "loss": float(self.loss_sum.cpu()) / max(self.steps, 1),
            "vectors": {k: v.cpu().tolist() for k, v in {**self.vectors, **self._factors_only()}.items()},
            "statistics": {n: s.value({k: t.cpu() for k, t in s.sums.items()}) for n, s in self.statistics.items()},
        }
        for t in self.sum_tensors():
            t.zero_()
        self.steps = 0
        return out

    def sums_state(self) -> dict[str, torch.Tensor]:
        """The epoch's counters and statistic sums so far, on the CPU: an epoch stopped at a step boundary saves
        them, and :meth:`load_sums` continues the epoch with them."""
        sums = {"correct": self.correct, "total": self.total, "loss_sum": self.loss_sum,
                **{f"{name}.{key}": t for name, s in self.statistics.items() for key, t in s.sums.items()}}
        return {**{k: t.detach().cpu().clone() for k, t in sums.items()}, "steps": torch.tensor(self.steps)}

    def load_sums(self, sums: dict[str, torch.Tensor]) -> None:
        for key, t in {"correct": self.correct, "total": self.total, "loss_sum": self.loss_sum}.items():
            t.copy_(sums[key])
        for name, s in self.statistics.items():
            for key, t in s.sums.items():
                t.copy_(sums[f"{name}.{key}"])
        self.steps = int(sums["steps"])

    def _factors_only(self) -> dict[str, torch.Tensor]:
        return {f: t for fs in self.factors.values() for f, t in fs.items()}

    LAYOUT = 2  # 2: bases and factors apart; checkpoints before it held the products under the vectors' names

    def state_dict(self) -> dict:
        return {"_layout": torch.tensor(self.LAYOUT), **{k: v.cpu() for k, v in self._named().items()}}

    def load_state_dict(self, state: dict) -> None:
        if int(state.get("_layout", 1)) != self.LAYOUT and any(self.factors.values()):
            raise UserError("this checkpoint stores per-class vectors as products (fastfair before 0.2), so resuming "
                            "would apply its factors twice; start a new run (its weights load with --init-from)")
        named = self._named()
        for k, v in state.items():
            if k in named:
                named[k].copy_(v.to(self.device))
        self.refresh()
