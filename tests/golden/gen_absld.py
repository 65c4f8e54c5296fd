"""ABSLD (zhaoshiji123/ABSLD): ``absld_loss.absld_inner_loss`` (the attack) and the epoch loop of
``resnet18_absld_cifar10.py`` (soft labels, loss, weight gradient, per-class error risks, temperature update).

The training script is top level throughout (data, teacher, epoch loop), so its ``kl_loss`` definition, its
settings (the top-level assignments named in ``SETTINGS``) and its ``for epoch in ...`` statement are taken from
the parsed file and executed in a namespace holding what they read. ``one_epoch`` runs the loop for one epoch
of one batch with the fixed TinyNet as student (``Inputs.teacher()`` as teacher) and the real
``absld_inner_loss``; ``temperature_loop`` runs it over epochs 213-218 (the code's first rate decay is at the
end of 215) with stand-ins answering made-up teacher, clean and adversarial logits.
"""
import ast
import types
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from conformance import Recorder
from record import BATCH, Capture, steps_record

REPO = "zhaoshiji123/ABSLD"
PINNED = "7407c3ad226a1373c8a2af13bf3f6946e100ff84"
FLOAT64 = []  # its code casts nothing the float64 run does not cover
SCRIPT = "resnet18_absld_cifar10.py"
K = 10
# the script's top-level assignments the epoch loop reads, executed from its source
SETTINGS = ("epsilon", "class_labels_temp_adv", "class_labels_temp_nat", "class_labels_temp_rate", "temp_max",
            "temp_min", "pgd_best_accuracy", "pgd_fair_best_accuracy", "ce_loss")
LOOP = {"start_epochs": 212, "epochs": 218, "samples": 40, "batch_size": 16}


def script_nodes(path):
    """(kl_loss's definition and the SETTINGS assignments, the epoch loop), parsed from the script."""
    tree = ast.parse((path / SCRIPT).read_text())
    head = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "kl_loss") or
            (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in SETTINGS for t in n.targets))]
    loop = next(n for n in tree.body if isinstance(n, ast.For) and ast.unparse(n.target) == "epoch")
    return head, loop


def run(path, ns, before=None):
    """Execute the settings, then ``before`` (the caller's changes to them), then the epoch loop, in ``ns``."""
    head, loop = script_nodes(path)
    filename = str(path / SCRIPT)
    exec(compile(ast.Module(body=head, type_ignores=[]), filename, "exec"), ns)
    ns.update(before or {})
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # reduce=False; the evaluation of an empty loader
        warnings.simplefilter("ignore")
        exec(compile(ast.Module(body=[loop], type_ignores=[]), filename, "exec"), ns)
    return ns


class Optimizer(Capture):
    """Capture with the param_groups the loop decays at its milestones."""

    def __init__(self, model):
        super().__init__(model)
        self.param_groups = [{"lr": 0.1}]


def namespace(**stand_ins):
    printed = []
    return {"torch": torch, "F": F, "np": np, "print": lambda *a, **k: printed.append(a), "printed": printed,
            **stand_ins}


def made_up_temperatures(rng):
    """Non-uniform class temperatures in the code's clip range, float32."""
    return (torch.from_numpy(rng.uniform(0.6, 2.5, (2, K))).float())


def one_epoch(path, inp, tau):
    """The loop for one epoch of the first BATCH images with temperatures ``tau`` (adv, nat)."""
    import absld_loss

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = inp.model("train")
    rec, opt, handed = Recorder(model), Optimizer(model), []

    def inner(student, teacher_logits, *a, **k):
        handed.append(teacher_logits.detach().clone())
        return absld_loss.absld_inner_loss(student, teacher_logits, *a, **k)

    ns = namespace(student=rec, teacher=inp.teacher(), trainloader=[(x, y)], optimizer=opt, absld_inner_loss=inner,
                   start_epochs=0, epochs=1)
    run(path, ns, {"class_labels_temp_adv": tau[0].clone(), "class_labels_temp_nat": tau[1].clone()})
    # forwards: the attack's K iterates, model(x_adv) in train mode, student(x)
    assert len(rec.iterates) == K and len(rec.inputs) == K + 2
    x_adv = rec.inputs[-2]
    return {**steps_record(rec.iterates + [x_adv], rec.grads), "x_start": rec.iterates[0].numpy(),
            "x_adv": x_adv.numpy(), "tau": tau.numpy(), "q_adv_logits": handed[0].numpy(),
            "q_nat_logits": ns["teacher_logits_new_nat"].numpy(), "loss": ns["loss"].detach().numpy(),
            "weight_grad": opt.grad.numpy(),
            "risk_adv": ns["class_labels_total_loss_adv"].numpy(),
            "risk_nat": ns["class_labels_total_loss_nat"].numpy(),
            "tau_after": np.stack([ns["class_labels_temp_adv"].numpy(), ns["class_labels_temp_nat"].numpy()])}


class Answers:
    """The student (called), teacher and attack of the loop, answering made-up logits of (epoch, images in the
    batch): a batch's inputs are its image indices."""

    def __init__(self, ns, teacher, nat, adv):
        self.ns, self.logits, self.handed = ns, {"teacher": teacher, "nat": nat, "adv": adv}, []

    def _rows(self, which, idx):
        epoch = self.ns["epoch"] - LOOP["start_epochs"] - 1
        return torch.from_numpy(self.logits[which][epoch][idx.long().flatten().numpy()]).requires_grad_()

    def teacher(self, x):
        return self._rows("teacher", x).detach()

    def __call__(self, x):  # the student's clean forward
        return self._rows("nat", x)

    def inner(self, student, teacher_logits, x, *a, **k):
        self.handed.append(teacher_logits.detach().clone())
        return self._rows("adv", x)

    def train(self, mode=True):
        return self

    def eval(self):
        return self


def temperature_loop(path, rng):
    epochs, n = LOOP["epochs"] - LOOP["start_epochs"], LOOP["samples"]
    y = np.concatenate([np.arange(K), rng.integers(0, K, n - K)])  # every class, unbalanced
    shape = (epochs, n, K)
    # float32 values (the draws as first made), held in float64 so that the stand-ins answer in float64
    teacher, nat, adv = (rng.normal(0, s, shape).astype(np.float32).astype(np.float64) for s in (3.0, 2.0, 2.0))
    order = rng.permutation(n)
    batches = [order[i:i + LOOP["batch_size"]] for i in range(0, n, LOOP["batch_size"])]
    ns = namespace(start_epochs=LOOP["start_epochs"], epochs=LOOP["epochs"], testloader=[],
                   trainloader=[(torch.from_numpy(b)[:, None].float(), torch.from_numpy(y[b])) for b in batches])
    answers = Answers(ns, teacher, nat, adv)
    ns.update(student=answers, teacher=answers.teacher, absld_inner_loss=answers.inner,
              optimizer=types.SimpleNamespace(zero_grad=lambda: None, step=lambda: None, param_groups=[{"lr": 0.1}]))
    run(path, ns)
    printed = ns["printed"]

    def after(label):  # the tensor the loop prints after each epoch under ``label``
        return np.stack([printed[i + 1][0].numpy() for i, a in enumerate(printed) if a == (label,)])

    handed = torch.stack([torch.cat(answers.handed[j * len(batches):(j + 1) * len(batches)]) for j in range(epochs)])
    return {"labels": y, "batch_order": order, "teacher_logits": teacher, "nat_logits": nat, "adv_logits": adv,
            "q_logits": handed.numpy(), "risk_adv": after("class total loss adv"),
            "risk_nat": after("class total loss nat"), "tau_adv": after("class_labels_temp_adv"),
            "tau_nat": after("class_labels_temp_nat")}


def generate(path, inp):
    rng = np.random.default_rng(0)
    step = one_epoch(path, inp, made_up_temperatures(rng))
    loop = temperature_loop(path, np.random.default_rng(1))
    fn = {"file": SCRIPT}
    meta = {"file": "absld_loss.py", "function": "absld_inner_loss", "batch": f"the first {BATCH} fixed images",
            "settings": {"epsilon": 8 / 255, "step_size": 2 / 255, "perturb_steps": K, "adv_weight": 5 / 6},
            "teacher": "conformance.Inputs.teacher(): the fixed TinyNet in eval mode, head times 3",
            "sources": {q: {**fn, "function": "epoch loop"} for q in ("soft labels", "loss", "risk", "temperatures")},
            "tau": "made-up class temperatures (adv, nat) the epoch starts from",
            "q_adv_logits": "the teacher logits the loop hands absld_inner_loss (teacher_logits_new_adv)",
            "q_nat_logits": "teacher_logits_new_nat after the loop (the natural term's)",
            "loss": "5/6 kl_Loss1 + 1/6 kl_Loss2 of the step", "weight_grad": "its gradient (optimizer.step)",
            "risk_adv": "class_labels_total_loss_adv after the epoch (and risk_nat)",
            "tau_after": "the temperatures (adv, nat) after the epoch's update"}
    loop_meta = {**fn, "function": "epoch loop", "loop": LOOP,
                 "logits": "made-up teacher, clean and adversarial logits per epoch, answered by stand-ins for the "
                           "teacher, the student and absld_inner_loss",
                 "q_logits": "the teacher logits handed to absld_inner_loss each epoch, rows in the batch order",
                 "tau_adv": "class_labels_temp_adv printed after each epoch's update (and tau_nat, risk_adv, risk_nat)"}
    return {"absld": (step, meta), "absld_loop": (loop, loop_meta)}
