"""Class-aware re-sampling (Benz et al. 2021, Sec. 2.2 and 3.3; Shen et al. 2016; Kang et al. 2020, Eq. 1).

Each epoch keeps its number of images n but draws them with replacement: class k with
probability p_k, then one of its images uniformly (:mod:`fastfair.data.sampling`, on the device
loader). p_k is given (``resampling.weights``), or Kang et al.'s p_k = n_k^q / sum_j n_j^q
(``resampling.power`` q: 1 instance-balanced, 0 class-balanced, 0.5 square-root). With
``resampling.auto`` it is moved after each epoch towards the classes the model gets wrong:
p_k = b_k (1 - A_k) / sum_j b_j (1 - A_j), b the given or power law and A_k the class train
robust accuracy. Benz et al. give no formula; this is fastfair's rule, chosen so that with q = 1
each class's expected share of the gradient equals ``cost_sensitive.auto``'s loss weights.

The probabilities are the per-class vector ``sampling`` of the :class:`ClassState` (logged in
``metrics.jsonl``, kept in checkpoints, so ``--resume`` draws as the killed run would have).
"""
from __future__ import annotations

import torch

from fastfair.errors import UserError
from fastfair.methods.cost_sensitive import weights_from_robust_accuracy
from fastfair.methods.options import Option, register, train_robust_fraction
from fastfair.schema import Key


def power_law(counts: torch.Tensor, q: float) -> torch.Tensor:
    """p_k = n_k^q / sum_j n_j^q over the classes with images, 0 for the others (Kang et al. 2020, Eq. 1)."""
    n = counts.float()
    b = torch.where(n > 0, n.clamp(min=1) ** q, 0.0)
    return b / b.sum()


def error_factor(base: torch.Tensor, train_robust: torch.Tensor) -> torch.Tensor:
    """f_k = (1 - A_k) / sum_j b_j (1 - A_j), so p_k = b_k f_k (fastfair's rule, docs/methods.md); ones when no
    class with b_k > 0 errs."""
    w = weights_from_robust_accuracy(train_robust)  # (1 - A_k) / mean_j (1 - A_j): the scale cancels below
    total = (base * w).sum()
    return torch.where(total > 0, w / total.clamp(min=1e-12), torch.ones_like(w))


@register("resampling", "class-aware re-sampling: epoch drawn with replacement by class probabilities p_k, given, "
                        "n_k^q or from class robust error (Benz et al. 2021; Kang et al. 2020)")
class Resampling(Option):
    keys = {
        "weights": Key([], "class sampling probabilities p_k, one per class, normalised to sum 1 (Benz et al. 2021, "
                           "Sec. 2.2; class-aware sampling, Shen et al. 2016)", list[float]),
        "power": Key(1.0, "p_k = n_k^q / sum_j n_j^q when no weights are given: 1 instance-balanced, 0 class-"
                          "balanced, 0.5 square-root (Kang et al. 2020, Eq. 1)"),
        "auto": Key(False, "after each epoch p_k = b_k (1 - A_k) / sum_j b_j (1 - A_j) from the train robust "
                           "accuracy A_k, b the given or power-law p (fastfair's rule, docs/methods.md)"),
    }

    @classmethod
    def enabled(cls, cfg) -> bool:
        r = cfg.resampling
        return bool(r.weights) or r.power != 1.0 or r.auto

    @classmethod
    def epoch_update(cls, cfg) -> str:
        return "resampling.auto's class probabilities (from the train robust accuracy)" if cfg.resampling.auto else ""

    @classmethod
    def check(cls, cfg) -> None:
        r = cfg.resampling
        if cfg.data.loader != "device":
            raise UserError(f"resampling draws each epoch's images on the device loader; data.loader="
                            f"{cfg.data.loader!r} reads its own order: use --loader device")
        if r.weights and r.power != 1.0:
            raise UserError("set either resampling.weights (p_k given) or resampling.power (p_k = n_k^q), not both")
        if any(w < 0 for w in r.weights) or (r.weights and not any(r.weights)):
            raise UserError(f"resampling.weights are class probabilities: at least 0 and not all 0; got {r.weights} "
                            "(to leave a class out of training use data.drop_classes)")
        if r.power < 0:
            raise UserError(f"resampling.power={r.power} would draw small classes more often than class-balanced "
                            "sampling (q = 0) does; Kang et al. use q in [0, 1]")

    def setup(self, state):
        if self.own.weights and len(self.own.weights) != state.num_classes:
            raise UserError(f"resampling.weights needs {state.num_classes} values (one per class); "
                            f"got {len(self.own.weights)}")
        state.add_vector("sampling", 1.0 / state.num_classes)  # the base is set from the class counts in use_loader
        if self.own.auto:
            state.add_factor("sampling", "sampling_auto", 1.0, owner=f"option {self.name}")

    def use_loader(self, loader, state):
        if not hasattr(loader, "draw_classes"):
            raise UserError(f"resampling needs the device loader (--loader device); {type(loader).__name__} "
                            "cannot draw by class")
        counts = loader.class_counts(state.num_classes).to(state.device)
        has = counts > 0
        if self.own.weights:
            base = torch.tensor(self.own.weights, device=state.device) * has
            if not base.any():
                raise UserError(f"resampling.weights {self.own.weights} put all weight on classes without training "
                                "images (data.drop_classes); give a class with images a weight above 0")
            base = base / base.sum()
        else:
            base = power_law(counts, self.own.power)
        natural = counts.float() / counts.sum()
        if not self.own.auto and torch.allclose(base, natural, atol=1e-6):
            given = f"resampling.weights={self.own.weights}" if self.own.weights else \
                f"resampling.power={self.own.power:g}"
            raise UserError(f"{given} draws every class at its share of the training set (the training set has "
                            f"{counts.tolist()} images per class), so re-sampling changes nothing; give unequal "
                            "resampling.weights, or resampling.auto=true")
        state.set("sampling", base)
        loader.draw_classes(state["sampling"])

    def end_epoch(self, state, epoch, stats):
        if self.own.auto:
            state.set("sampling_auto", error_factor(state.bases["sampling"], train_robust_fraction(stats, state)))
