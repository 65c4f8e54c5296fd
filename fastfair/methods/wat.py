"""WAT: worst-class adversarial training by no-regret dynamics (Li & Liu, AAAI 2023, arXiv 2302.04025).

WAT trains on TRADES (beta 6) with one weight per class. The weights are an online learner's
(Hedge / exponential weights) play against the network: after each epoch it reads every class's
TRADES loss on a held-out validation split and moves weight towards the classes that lose most.
The rule implemented is the one in the authors' code (``boqili/WAT``,
``worst_class_adversarial_train.py``: ``train``, ``validate`` and the epoch loop), which this
module was checked against; the paper's own text and equations could not be consulted when it was
written, so no equation numbers are cited (see docs/methods.md).

* Per-class validation loss after epoch t, on the validation split, with x' from the training
  attack (TRADES-PGD on the KL, BN in eval mode)::

      L_k^t = (sum over class-k images of  CE(f(x), y) + beta KL(p(x) || p(x'))) / d_k

  and, with ``method.average_expert``, L_avg^t = the same sum over all images / d (the code's
  (K+1)-th entry, "the expected loss in the decision set"); the divisors d_k and d are the
  code's by default (see ``method.val_divisor`` below), about the class's and the split's image
  counts.
* Hedge from uniform weights, i.e. exponential weights of the cumulative losses, scaled to sum
  to K over the decision set (K or K + 1 entries)::

      w^t = K softmax(eta sum_{s<=t} [L_1^s, ..., L_K^s, L_avg^s])

* Training loss of the next epoch, per image i: (w_{y_i} + w_avg) (CE + beta KL), i.e. the
  code's class-weighted TRADES sum plus the plain TRADES mean times w_avg. The per-class
  factor ``loss_weight_wat`` = w_k + w_avg goes on ``loss_weight``. Before the first update the
  code's weights are all ones, so the first epoch trains with factor 2 (1 without the average
  expert).

* The divisor of the validation sums (``method.val_divisor``): the code divides class k's sum by
  (batches x batch size) / K, i.e. by D / K with D = ceil(N / B) B for N validation images in
  batches of the training batch size B (``data.batch_size``; the code's validation loader uses
  it), and the all-class sum by D (``"batches"``, the default). On the code's balanced
  300-per-class split that is the class mean times 3000/3072 (the last batch is partial), a factor
  on eta; on an unbalanced split it also weighs a class by its share of the images. ``"count"``
  divides by each class's image count instead (the class mean; the average expert's entry is the
  mean over all images).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from fastfair import rules
from fastfair.errors import UserError
from fastfair.evaluation import seeds
from fastfair.methods.base import CODE_PGD10, METHODS
from fastfair.methods.trades import TRADES
from fastfair.ops.losses import widened
from fastfair.scaleout import distributed
from fastfair.schema import Key, Tune


VAL_DIVISORS = ("batches", "count")


def hedge_weights(cum_loss: torch.Tensor, cum_avg: float | torch.Tensor, eta: float,
                  average_expert: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(w_k (K,), w_avg ()) = K softmax(eta [S_1..S_K, S_avg]) (or of eta S alone without the average expert).

    Exponential weights of the cumulative validation losses S: Hedge started from uniform weights
    (WAT code: ``class_factor = exp(eta sum_t cost_t)``, weights = K class_factor / sum)."""
    k = cum_loss.shape[0]
    entries = widened(cum_loss)
    if average_expert:
        entries = torch.cat([entries, torch.as_tensor(cum_avg, dtype=entries.dtype).reshape(1)])
    w = k * torch.softmax(eta * entries, dim=0)  # softmax: exp(eta S) / sum, without overflow
    if average_expert:
        return w[:k], w[k]
    return w, torch.zeros((), device=w.device)


@METHODS.register("wat", "WAT: TRADES with Hedge class weights from per-class validation TRADES loss, eta 0.1, "
                         "beta 6 (Li & Liu 2023, AAAI)")
class WAT(TRADES):
    """TRADES rows times w_{y} + w_avg, the Hedge weights of the cumulative per-class validation loss."""

    defaults = {**TRADES.defaults, **CODE_PGD10}

    keys = {
        "eta": Key(0.1, "WAT Hedge step: weights are exp(eta x each class's cumulative validation TRADES loss), "
                        "normalised (WAT code --eta; Li & Liu 2023)",
                   tune=Tune(0.025, 0.4, "log", source="no ablation read here; x/4 .. 4x around the code's 0.1"),
                   valid=rules.ABOVE_0),
        "average_expert": Key(True, "WAT: the all-class mean validation loss is a (K+1)-th Hedge entry whose weight "
                                    "scales every class (WAT code: 'expected loss in the decision set')"),
        "val_divisor": Key("batches", "WAT per-class validation loss: batches = class sum x K / (batches x "
                                      "data.batch_size) (WAT code validate) | count = class sum / class count (the "
                                      "class mean)"),
    }

    @classmethod
    def epoch_update(cls, cfg) -> str:
        return "WAT's class weights (from the validation losses)"

    def setup(self, state):
        if self.cfg.method.val_divisor not in VAL_DIVISORS:
            raise UserError(f"method.val_divisor must be one of {', '.join(VAL_DIVISORS)}; "
                            f"got {self.cfg.method.val_divisor!r}")
        super().setup(state)
        state.add_vector("wat_cum_loss", 0.0)  # S_k: the sum over epochs of class k's validation loss
        state.add_vector("wat_cum_avg", 0.0)  # S_avg, held in every entry (a ClassState vector is per class)
        first = 2.0 if self.cfg.method.average_expert else 1.0  # the code's initial weights are all ones
        state.add_factor("loss_weight", "loss_weight_wat", first, owner="wat")

    @torch.no_grad()
    def _loss_sums(self, model, x, x_adv, y, state, sums, counts):
        z_nat, z_adv = model(x), model(x_adv)
        rows = self.ops.row_loss(z_nat, z_adv, y, ce_nat=1.0, kl=state["kl_weight"][y])
        sums.index_add_(0, y, widened(rows))
        counts.index_add_(0, y, torch.ones_like(rows))

    def validation_pass(self, model: nn.Module, loader, state, epoch: int) -> dict:
        """Per-class and mean validation TRADES loss of the current model (one host read at the end)."""
        dev, k = state.device, state.num_classes
        sums, counts = torch.zeros(k, device=dev), torch.zeros(k, device=dev)
        was_training = model.training
        model.eval()
        try:
            for i, (x, y) in enumerate(loader):
                with seeds.seeded(self.cfg.train.seed, "wat-val", epoch, i, device=dev):
                    x_adv = self.perturb(model, x, y, state)
                self._loss_sums(model, x, x_adv, y, state, sums, counts)
        finally:
            model.train(was_training)
        sums, counts = distributed.all_reduce_sum(sums), distributed.all_reduce_sum(counts)
        sums, counts = sums.double().cpu(), counts.double().cpu()
        n = float(counts.sum())
        if self.cfg.method.val_divisor == "count":
            per_class, total = counts.clamp(min=1), max(n, 1.0)
        else:  # the code's (batches x batch size) / K per class, batches x batch size for the mean
            b = self.cfg.data.batch_size
            total = max(math.ceil(n / b) * b, 1)
            per_class = torch.full_like(sums, total / k)
        return {"wat_loss_per_class": (sums / per_class).tolist(), "wat_loss_avg": float(sums.sum() / total)}

    def end_epoch(self, state, epoch, stats):
        m = self.cfg.method
        val = stats["val_method"]
        cum = state["wat_cum_loss"] + torch.tensor(val["wat_loss_per_class"], device=state.device)
        cum_avg = state["wat_cum_avg"] + val["wat_loss_avg"]
        w, w_avg = hedge_weights(cum, cum_avg[0], m.eta, m.average_expert)
        state.set("wat_cum_loss", cum)
        state.set("wat_cum_avg", cum_avg)
        state.set("loss_weight_wat", w + w_avg)
        super().end_epoch(state, epoch, stats)
