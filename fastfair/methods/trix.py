"""TRIX: mixed targeted/untargeted adversarial training (Medi, Jung & Keuper 2025, arXiv 2507.07768).

"TRIX- Trading Adversarial Fairness via Mixed Adversarial Training". Its abstract states the
method: strong classes (well separated, robust early) train on *weaker targeted* adversaries whose
targets are sampled uniformly, weak classes on *stronger untargeted* ones, plus per-class loss
weights and per-class perturbation budgets "building on prior work" to emphasise weak classes.
Only the abstract of the paper could be read when this module was written; the rule below is the
one of an anonymous repository presenting itself as TRIX's code (presumably the
authors'), ``github.com/Fairness-a11y/TRIX`` (``losses.py``
``mixed_trades_loss``, ``train.py``, ``utils.py``, ``scripts/trix.sh``), so no equation numbers
are cited (see docs/methods.md, "TRIX").

Per training step (code ``mixed_trades_loss``):

* the split: DAFA's Algorithm 2 weights (lambda 1) computed from *this batch's clean* softmax,
  mean per class over the batch (model in eval mode); a sample is "strong" when its class's
  batch weight is below the mean of that weight over the batch's samples (not over classes).
  A class DAFA calls easy (it loses weight to the classes it is confused with) is strong.
* targets: for strong samples a class drawn uniformly from the C - 1 other classes.
* the attack (TRADES-PGD, x + 0.001 N(0, I) start, BN eval): strong rows step *down*
  CE(f(x'), target), weak rows step up KL(p(x) || p(x')); both inside eps_y with step alpha_y.

Per epoch: after the warm-up (70 epochs) the DAFA class weights W from the epoch's training
adversarial softmax (:mod:`.dafa`, the code's ``--rob_fairness_algorithm dafa``) set
eps_k = W_k eps, alpha_k = W_k alpha and weight the natural CE term by W_y (the KL unweighted).
So TRIX is ``dafa-trades`` (weight_terms ce) with the mixed attack.
"""
from __future__ import annotations

import torch

from fastfair.attacks.pgd import attack_mode
from fastfair.methods.base import CODE_PGD10, METHODS
from fastfair.methods.dafa import DAFATrades, dafa_weights
from fastfair.methods.trades import TRADES_ATTACK
from fastfair.ops.losses import widened
from fastfair.schema import Key


def batch_similarity(z: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(C, C) row k: mean softmax of z over the batch's class-k rows; zeros for absent classes (TRIX code
    ``calculate_class_weights_from_clean``)."""
    p = widened(z.detach()).softmax(1)
    sums = torch.zeros(num_classes, num_classes, device=z.device, dtype=p.dtype).index_add_(0, y, p)
    counts = torch.zeros(num_classes, device=z.device, dtype=p.dtype).index_add_(0, y, torch.ones_like(p[:, 0]))
    return sums / counts.clamp(min=1)[:, None]


# The code adds this to the batch similarity's diagonal before DAFA's rule (calculate_class_weights_from_clean,
# "to avoid instability"): it moves every weight by about 1e-8, below float32's resolution of the weights.
CODE_DIAGONAL = 1e-8


def batch_weights(z_nat: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(C,) DAFA Alg. 2 weights (lambda 1) of the batch's clean similarity plus 1e-8 on its diagonal, in float64
    then float32 (TRIX code ``calculate_class_weights_from_clean``)."""
    p = batch_similarity(z_nat, y, num_classes).double()
    p = p + CODE_DIAGONAL * torch.eye(num_classes, dtype=p.dtype, device=p.device)
    return dafa_weights(p, 1.0, tie_subtracts=True)


def strong_mask(z_nat: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(N,) bool: w_{y_i} < mean_j w_{y_j}, w = :func:`batch_weights` (TRIX code ``mixed_trades_loss``:
    ``tar_weights_mask < tar_weights_mask.mean()``, both float32)."""
    w = batch_weights(z_nat, y, num_classes)[y]
    return w < w.mean()


def strong_rows(model, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """:func:`strong_mask` of the model's clean logits: one forward, compiled with the attack where it is."""
    return strong_mask(model(x), y, num_classes)


def draw_targets(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(y + U{1..C-1}) mod C: uniform over the classes other than y (TRIX abstract: "uniformly sampled
    targets"; code: redraw until != y, the same distribution), from torch's seeded generator."""
    shift = torch.randint(1, num_classes, y.shape, device=y.device)
    return (y + shift) % num_classes


@METHODS.register("trix", "TRIX: DAFA-TRADES whose strong classes train on targeted PGD to uniform random "
                          "targets, weak classes on untargeted TRADES-PGD (Medi et al. 2025, arXiv 2507.07768; "
                          "rule from the code at Fairness-a11y/TRIX)")
class TRIX(DAFATrades):
    """DAFA-TRADES (Lee et al. 2024) with TRIX's mixed attack (Medi et al. 2025; code ``mixed_trades_loss``)."""

    keys = {"targeted": Key(True, "TRIX: strong classes of each batch train on a targeted attack to a uniformly "
                                  "drawn other class (code mixed_trades_loss); false: untargeted for all, i.e. "
                                  "dafa-trades")}
    defaults = {**TRADES_ATTACK, **CODE_PGD10, "method.kl_weight": 6.0, "method.entropy_weight": 0.0}

    def __init__(self, cfg, *args, **kw):
        super().__init__(cfg, *args, **kw)
        # without this the clean forward ran eagerly beside the compiled attack: ~90 launches a step on CUDA
        self.strong_rows = self.compile(strong_rows)

    def targeting(self, model, x: torch.Tensor, y: torch.Tensor, num_classes: int) -> tuple[torch.Tensor, ...]:
        """(targets, strong mask) of this batch: an extra clean forward in the attack's BN mode, no host sync."""
        with attack_mode(model, self.attack.bn_mode), torch.no_grad():
            strong = self.strong_rows(model, x, y, num_classes)
        return draw_targets(y, num_classes), strong

    def perturb(self, model, x, y, state):
        if not self.cfg.method.targeted:
            return super().perturb(model, x, y, state)
        target, strong = self.targeting(model, x, y, state.num_classes)
        return self.attack(model, x, y, state["eps"], state["alpha"], target, strong)
