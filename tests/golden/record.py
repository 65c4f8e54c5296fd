"""What the generators share: running a function of an authors' script, and keeping a small per-step record.

Attacks that run with the model in eval mode treat every image on its own (the batch-mean loss only
scales each gradient by 1/N), so the per-step record of the first ``STEP_IMAGES`` images checks the step
rule, and each gradient is kept over its image's largest magnitude in float32 (its sign, and whether it lies
within float64's or float32's sign noise of zero): golden files stay small. Losses and weight gradients (train-mode
BN) use the first ``BATCH`` images.
"""
import ast

import numpy as np
import torch

from conformance import Recorder

BATCH, STEP_IMAGES = 16, 2


class Outputs(Recorder):
    """A Recorder that also keeps every forward's logits (the evaluation's decisions are made from them)."""

    def __init__(self, model):
        super().__init__(model)
        self.outputs = []

    def forward(self, x):
        out = super().forward(x)
        self.outputs.append(out.detach().clone())
        return out


def load_function(path, name, namespace):
    """``name`` from the script ``path`` (which parses arguments and loads CIFAR-10 at import): its
    definition alone, compiled and run in ``namespace`` (stand-ins for the script's globals)."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    exec(compile(ast.Module([node], []), str(path), "exec"), namespace)
    return namespace[name]


def script_namespace(**globals_):
    import torch.nn as nn
    import torch.optim as optim
    from torch.autograd import Variable

    return {"torch": torch, "nn": nn, "optim": optim, "Variable": Variable, "device": torch.device("cpu"),
            **globals_}


def steps_record(iterates, grads):
    """The per-step record of the first STEP_IMAGES images: iterates, and each gradient over its image's largest
    magnitude in float32 (its sign, and whether it lies within a precision's sign noise of zero: conformance's
    ``sign_noise``, 2e-13 of that in float64)."""
    its = torch.stack(iterates)[:, :STEP_IMAGES]
    g = torch.stack(grads)[:, :STEP_IMAGES]
    scale = g.flatten(2).abs().amax(2)[:, :, None, None, None]
    return {"step_iterates": its.numpy(), "step_grad": (g / scale).to(torch.float32).numpy()}


class Capture:
    """The optimiser handed to an authors' training step: ``zero_grad`` clears, ``step`` keeps the weight
    gradient (flattened, in ``model.parameters()`` order) and updates nothing."""

    def __init__(self, model):
        self.params = list(model.parameters())
        self.grad = None

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grad = torch.cat([p.grad.flatten().clone() for p in self.params])


def unit(g: torch.Tensor) -> np.ndarray:
    """Gradients over each sample's largest magnitude, float32: what step_flips needs (sign, relative size, down to
    float64's sign noise of 2e-13, which float16 would flush to zero)."""
    return (g / g.flatten(1).abs().amax(1).view(-1, 1, 1, 1)).numpy().astype(np.float32)


def training_loss_record(loss_fn, inp, settings: dict, x_adv_back: int) -> dict:
    """Run an authors' TRADES-style training loss, ``loss_fn(model, x, y, optimizer, distance="l_inf",
    **settings)`` (TRADES's trades_loss, MART's mart_loss), on the first ``BATCH`` images: the per-step record
    (:func:`steps_record`), its start, its x_adv (the input of the ``x_adv_back``-th forward from the end),
    the loss and the weight gradient."""
    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = inp.model("train")
    rec = Recorder(model)
    loss = loss_fn(rec, x, y, torch.optim.SGD(model.parameters(), lr=0.1), distance="l_inf", **settings)
    grad = torch.autograd.grad(loss, list(model.parameters()))
    x_adv = rec.inputs[-x_adv_back]
    return {**steps_record(rec.iterates + [x_adv], rec.grads), "start": rec.iterates[0].numpy(),
            "x_adv": x_adv.numpy(), "loss": loss.detach().numpy(),
            "weight_grad": torch.cat([g.flatten() for g in grad]).numpy()}
