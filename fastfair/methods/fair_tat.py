"""FAIR-TAT: fair targeted adversarial training (Medi, Jung & Keuper, WACV 2025, arXiv 2410.23142).

"FAIR-TAT: Improving Model Fairness Using Targeted Adversarial Training". Every training image is attacked
*towards* a target class instead of away from its own, the target drawn from the classes the model confused
most in the previous epoch, inside CFA's class-wise budget. Only the paper's abstract could be read when this
module was written; the rule below is the authors' code (``TejaswiniMedi/FAIR-TAT``, files as the tool library's
index holds them: ``target_train_new.py`` at 0154dc3, ``Targeted_attack.py`` at 0188869; the README's command
``--mode AT --ccm --lambda-r 0.5 --lambda-c 0.5 --untargeted 0 --adaptive_eps G-rob``), which the conformance cases
check it against, so code lines rather than equations are cited (docs/methods.md, "FAIR-TAT").

Per step (``train_epoch`` and ``cw_pgd_loss``), the model in train mode throughout:

* the target: in the first epoch a class drawn uniformly from the C - 1 others; after it, a draw from
  p = softmax(2 F), F_c the share of the previous epoch's misclassified training adversarial examples that were
  predicted as class c (the code's ``robust_cw_cfps_gt``), redrawn from p while it equals the label -- except
  in a batch where exactly one draw equals its label, which keeps it (the code's ``nonzero().squeeze()`` of one
  index is 0-dimensional and skips the redraw loop);
* the attack: PGD-10 from x + U(-eps_y, eps_y) stepping *down* CE(f(x'), target) in eps_y (CFA's CCM budget
  eps_y = (lambda + A_y) eps, A_y the previous epoch's train robust accuracy of class y, lambda 0.5, from the
  second epoch), step 2/255;
* the loss: CE(f(x'), y), averaged over the batch (Madry et al.'s AT on the targeted examples).
"""
from __future__ import annotations

import torch

from fastfair import rules
from fastfair.errors import UserError
from fastfair.methods.at import AT_ATTACK, PGDAT
from fastfair.methods.base import METHODS
from fastfair.methods.trix import draw_targets
from fastfair.ops.losses import widened
from fastfair.schema import Key, Tune
from fastfair.training.class_state import STATISTICS, Statistic

TARGETS = ("confusion", "uniform")
SCORES = "fair_tat_scores"  # per-class vector: the softmax scores of the target draw (the code's cw_scaling)


@STATISTICS.register("false_positives", "(C,): share of the epoch's misclassified training adversarial examples "
                                        "predicted as class c (FAIR-TAT code's robust_cw_cfps_gt)")
class FalsePositives(Statistic):
    def __init__(self, num_classes, device):
        super().__init__(num_classes, device)
        self.sums = {"fp": torch.zeros(num_classes, device=device)}

    def update(self, logits, y):
        pred = logits.detach().argmax(1)
        fp = self.sums["fp"]
        fp.index_add_(0, pred, (pred != y).to(fp.dtype))  # a mask, not an index: no host sync

    def value(self, sums):
        """fp_c / sum_c fp_c (code CW_log.result: fp_by_class / (N - correct)); zeros for an epoch without errors,
        where the code divides 0 by 0."""
        return sums["fp"] / sums["fp"].sum().clamp(min=1)


def pick(p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """A draw from each row of p (unnormalised) for u ~ U[0, 1): the first class whose cumulative mass reaches
    (1 - u) of the total (inverse CDF, what torch.multinomial(p, 1) samples, without its host sync). 1 - u lies in
    (0, 1], so a class of zero mass is never drawn and the index never passes the last class."""
    c = p.cumsum(-1)
    return (c < (1.0 - u)[..., None] * c[..., -1:]).sum(-1)


def redraw_distribution(p: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(N, C): p with class y_i removed and renormalised, what drawing from p until != y_i gives (code
    train_epoch's ``while y_t[ind] == y[ind]`` loop)."""
    q = p.expand(len(y), -1).scatter(1, y[:, None], 0.0)
    return q / q.sum(1, keepdim=True)


def target_probs(scores: torch.Tensor) -> torch.Tensor:
    """p = softmax(scores), the distribution targets are drawn from (code train_epoch: torch.softmax(cw_scaling)), in
    float32 at least (a float64 state's, the conformance checks', stays float64)."""
    return widened(scores).softmax(0)


def confusion_targets(y: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """Targets from p = :func:`target_probs`, redrawn where they equal the label unless exactly one does (code
    train_epoch, the ``else`` branch of ``epoch == 0``; see the module docstring)."""
    p = target_probs(scores)
    first = pick(p, torch.rand(y.shape, device=y.device))
    hit = first == y
    redo = hit & (hit.sum() != 1)
    again = pick(redraw_distribution(p, y), torch.rand(y.shape, device=y.device))
    return torch.where(redo, again, first)


@METHODS.register("fair-tat", "FAIR-TAT: AT on PGD targeted to classes drawn from the last epoch's confusion, in "
                              "CFA's class-wise eps (Medi et al. 2025, WACV; rule from the code at "
                              "TejaswiniMedi/FAIR-TAT)")
class FAIRTAT(PGDAT):
    """CE(f(x'), y), x' the targeted PGD towards a class drawn from the last epoch's confusion (FAIR-TAT code)."""

    keys = {
        "targets": Key("confusion", "FAIR-TAT targets: confusion = from softmax(fp_scale F) of the last epoch's "
                                    "false positives (code default); uniform = a uniformly drawn other class "
                                    "every epoch (code --random_target)"),
        "fp_scale": Key(2.0, "FAIR-TAT: the target draw's softmax scores are fp_scale x F_c, F_c the class's share "
                             "of the last epoch's training adversarial misclassifications (code: "
                             "robust_cw_cfps_gt * 2)",
                        tune=Tune(0.5, 8.0, "log", source="no ablation read here; x/4 .. 4x around the code's 2"),
                        valid=rules.at_least(0)),
    }
    # the README's command: --mode AT --ccm --adaptive_eps G-rob --lambda-r 0.5; --begin 1 is the code's default
    defaults = {**AT_ATTACK, "method.entropy_weight": 0.0, "ccm.enabled": True, "ccm.lambda_1": 0.5, "ccm.begin": 1}
    statistics = ("false_positives",)

    def __init__(self, cfg, *args, **kw):
        super().__init__(cfg, *args, **kw)
        self.first_epoch = True  # set by begin_epoch; the code's first epoch draws uniform targets

    @classmethod
    def check(cls, cfg):
        m = cfg.method
        if m.targets not in TARGETS:
            raise UserError(f"method.targets must be one of {', '.join(TARGETS)}; got {m.targets!r}")
        if cfg.attack.objective != "ce":
            raise UserError(f"fair-tat steps every row down CE(f(x'), target), so attack.objective="
                            f"{cfg.attack.objective} would do nothing; leave it ce")
        if m.targets == "confusion" and not cfg.ccm.enabled:
            raise UserError("method.targets=confusion follows the false positives only with ccm on (the code updates "
                            "both in one block, --adaptive_eps); set ccm.enabled=true, or method.targets=uniform")
        if m.targets == "uniform" and m.fp_scale != 2.0:
            raise UserError(f"method.fp_scale={m.fp_scale} does nothing with method.targets=uniform; drop it")

    @classmethod
    def epoch_update(cls, cfg):
        if cfg.method.targets == "uniform":
            return ""
        return "FAIR-TAT's target distribution (from the epoch's training false positives)"

    def setup(self, state):
        super().setup(state)
        state.add_vector(SCORES, 1.0)  # the code's cw_scaling = torch.ones(num_classes) before any epoch

    def begin_epoch(self, model, epoch):
        super().begin_epoch(model, epoch)
        self.first_epoch = epoch == 0

    def targets(self, y: torch.Tensor, state) -> torch.Tensor:
        """This batch's target classes, on the device (no host sync)."""
        if self.first_epoch or self.cfg.method.targets == "uniform":
            return draw_targets(y, state.num_classes)
        return confusion_targets(y, state[SCORES])

    def perturb(self, model, x, y, state):
        target = self.targets(y, state)
        return self.attack(model, x, y, state["eps"], state["alpha"], target, torch.ones_like(y, dtype=torch.bool))

    def end_epoch(self, state, epoch, stats):
        super().end_epoch(state, epoch, stats)  # CCM's eps_k
        if self.cfg.method.targets == "confusion" and epoch + 1 >= self.cfg.ccm.begin:
            state.set(SCORES, self.cfg.method.fp_scale * stats["statistics"]["false_positives"])
