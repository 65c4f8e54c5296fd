"""ABSLD: Anti-Bias Soft Label Distillation (Zhao, Duan, Wang & Wei, NeurIPS 2024, arXiv 2312.05508).

A student distils a robust teacher's soft labels, and every class has its own teacher temperature: after each
epoch a class whose student error risk is above the classes' mean gets a lower temperature (sharper labels),
one below it a higher one (smoother labels), which narrows the gap between hard and easy classes. Only the
paper's abstract could be read when this module was written; the rule below is the authors' code
(``zhaoshiji123/ABSLD`` at 7407c3a: ``absld_loss.py``, ``resnet18_absld_cifar10.py``), which the conformance
cases check it against, so no equation numbers are cited (docs/methods.md, "ABSLD").

Per step, with z_T the teacher's logits of the clean batch (eval mode, no gradient) and tau_adv, tau_nat the
per-class temperatures gathered by label:

* soft labels: q_adv = softmax(z_T / tau_adv[y] / tau_nat[y]) for both terms (``teacher_scaling = "product"``:
  the code divides two names of one tensor in place, once per name, so both terms see the product);
  ``"separate"``: q_adv = softmax(z_T / tau_adv[y]), q_nat = softmax(z_T / tau_nat[y]).
* the attack: TRADES-PGD (x + 0.001 N(0, I) start, BN in eval mode, 10 steps of 2/255 in 8/255) on
  sum_i KL(q_adv || p(x')) against the soft labels instead of the student's clean prediction.
* the loss rows: (a KL(q_adv || p(x')) + (1 - a) KL(q_nat || p(x))) / C, a = 5/6 (the code averages its
  element-wise KL over the N x C elements, hence the 1 / C), both forwards in train mode, x' first.

Per epoch: L_k^adv, L_k^nat = the sums of CE(f(x'), y) and CE(f(x), y) over class k's training images, from the
forwards that fed the loss; then for each of adv and nat

    tau_k <- clip(tau_k - r (L_k - mean_j L_j) / max_j |L_j - mean_j L_j|, 0.5, 5)

from tau = 1, with r = 0.1 times the learning rate's decay so far (the code multiplies both by 0.1 at the same
epochs, before that epoch's update).
"""
from __future__ import annotations

import torch

from fastfair import rules
from fastfair.errors import UserError
from fastfair.methods.base import METHODS, Method
from fastfair.methods.teacher import KEYS as TEACHER_KEYS
from fastfair.methods.teacher import check_source
from fastfair.ops.losses import widened
from fastfair.schema import Key, Tune

SCALINGS = ("product", "separate")
# (per-class temperature vector, the statistic it follows): the adversarial and the natural term's
TEMPERATURES = (("absld_temp_adv", "ce_sum_adv"), ("absld_temp_nat", "ce_sum_nat"))


def temperature_update(tau: torch.Tensor, risk: torch.Tensor, rate: float, low: float, high: float) -> torch.Tensor:
    """clip(tau - rate (L - mean L) / max |L - mean L|, low, high) (ABSLD code, the epoch loop's "update temp").

    Where every class has the same risk the code divides 0 by 0 and its temperatures become NaN; here they stay."""
    gap = widened(risk) - widened(risk).mean()
    scale = gap.abs().max()
    if scale == 0:
        return tau.clone()
    return (widened(tau) - rate * gap / scale).clamp(low, high)


def soft_label_logits(z_teacher: torch.Tensor, tau_adv: torch.Tensor, tau_nat: torch.Tensor,
                      scaling: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits of q_adv, of q_nat): the teacher's logits over each row's class temperatures (module docstring)."""
    z = widened(z_teacher)
    if scaling == "product":
        both = z / tau_adv[:, None] / tau_nat[:, None]
        return both, both
    return z / tau_adv[:, None], z / tau_nat[:, None]


@METHODS.register("absld", "ABSLD: distil a robust teacher's soft labels with a temperature per class, lowered for "
                           "classes of high error risk each epoch (Zhao et al. 2024, NeurIPS; rule from the code at "
                           "zhaoshiji123/ABSLD); needs method.teacher")
class ABSLD(Method):
    """(a KL(q_adv || p(x')) + (1 - a) KL(q_nat || p(x))) / C with class-wise teacher temperatures (ABSLD code)."""

    distils = True
    keys = {
        **TEACHER_KEYS,
        "adv_weight": Key(5 / 6, "ABSLD: weight a of the adversarial KL term; the natural term has 1 - a (code: "
                                 "5/6 and 1/6)", valid=rules.within(0, 1)),
        "temp_rate": Key(0.1, "ABSLD: step r of the temperature update, decayed as the learning rate is (code "
                              "class_labels_temp_rate 0.1, x0.1 with the lr)",
                         tune=Tune(0.025, 0.4, "log", source="no ablation read here; x/4 .. 4x around the code's "
                                                             "0.1"), valid=rules.at_least(0)),
        "temp_min": Key(0.5, "ABSLD: lower clip of the class temperatures (code temp_min)", valid=rules.ABOVE_0),
        "temp_max": Key(5.0, "ABSLD: upper clip of the class temperatures (code temp_max)", valid=rules.ABOVE_0),
        "teacher_scaling": Key("product", "ABSLD soft labels: product = both terms' teacher logits over "
                                          "tau_adv[y] tau_nat[y] (the code's in-place division of one tensor under "
                                          "two names) | separate = each term over its own temperature"),
    }
    defaults = {"attack.objective": "kl", "attack.init": "normal", "attack.bn_mode": "eval"}
    statistics = ("ce_sum_adv", "ce_sum_nat")

    def __init__(self, cfg, *args, **kw):
        super().__init__(cfg, *args, **kw)
        self.teacher = self.teacher_forward = None  # loaded in setup, once the data set's classes are known
        self.soft_labels: tuple[torch.Tensor, torch.Tensor] | None = None  # this step's, set by perturb

    @classmethod
    def check(cls, cfg):
        m = cfg.method
        check_source(m.teacher, "absld")
        if m.teacher_scaling not in SCALINGS:
            raise UserError(f"method.teacher_scaling must be one of {', '.join(SCALINGS)}; got {m.teacher_scaling!r}")
        if not 0 < m.temp_min <= m.temp_max:
            raise UserError(f"method.temp_min and method.temp_max must satisfy 0 < temp_min <= temp_max (they clip "
                            f"temperatures that divide logits); got {m.temp_min} and {m.temp_max}")
        if not 0 <= m.adv_weight <= 1:
            raise UserError(f"method.adv_weight must lie in [0, 1] (the natural term gets 1 - it); got {m.adv_weight}")

    @classmethod
    def epoch_update(cls, cfg):
        return "ABSLD's class temperatures (from the epoch's per-class error risks)"

    def setup(self, state):
        super().setup(state)
        for vector, _ in TEMPERATURES:
            state.add_vector(vector, 1.0)  # the code's torch.ones(10) before the first epoch
        if self.teacher is None:
            raise UserError("absld has no teacher module: fastfair.method and the trainer load method.teacher before "
                            "setup (fastfair.training.teacher.attach); or set m.teacher = net before m.setup(state)")
        self.teacher_forward = self.compile(self.teacher)

    def distil_from(self, x: torch.Tensor, y: torch.Tensor, state) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's soft-label logits (q_adv's, q_nat's) from one teacher forward of the clean batch; kept for
        :meth:`loss`, which runs after :meth:`perturb` on the same batch (the code computes them once a step)."""
        with torch.no_grad():
            z = self.teacher_forward(x)
        self.soft_labels = soft_label_logits(z, state["absld_temp_adv"][y], state["absld_temp_nat"][y],
                                             self.cfg.method.teacher_scaling)
        return self.soft_labels

    def perturb(self, model, x, y, state):
        q_adv, _ = self.distil_from(x, y, state)
        return self.attack(model, x, y, state["eps"], state["alpha"], *self.attack_targets(y, state), reference=q_adv)

    def loss(self, model, x, x_adv, y, state):
        if self.soft_labels is None:
            raise UserError("absld: call perturb (or distil_from) on the batch before its loss: the loss reads the "
                            "teacher's soft labels of that batch")
        q_adv, q_nat = self.soft_labels
        a, classes = self.cfg.method.adv_weight, state.num_classes
        z_adv = model(x_adv)  # the code's order: the adversarial forward, then the clean one (BN running statistics)
        z_nat = model(x)
        rows = (self.ops.row_loss(q_adv, z_adv, y, kl=a / classes)
                + self.ops.row_loss(q_nat, z_nat, y, kl=(1.0 - a) / classes))
        return rows, {"adv": z_adv, "nat": z_nat}

    def temperature_rate(self, lr_next: float) -> float:
        """r for the next epoch: temp_rate x lr_next / train.lr (the code decays both together)."""
        return self.cfg.method.temp_rate * lr_next / self.cfg.train.lr

    def end_epoch(self, state, epoch, stats):
        super().end_epoch(state, epoch, stats)
        m, rate = self.cfg.method, self.temperature_rate(stats["lr_next"])
        for vector, statistic in TEMPERATURES:
            tau = temperature_update(state[vector].cpu(), stats["statistics"][statistic], rate, m.temp_min,
                                     m.temp_max)
            state.set(vector, tau)
