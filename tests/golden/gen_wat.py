"""WAT (boqili/WAT): the Hedge update, ``validate``, and ``train``'s attack, loss and weight gradient.

``worst_class_adversarial_train.py`` is a script (argparse, data loading and the epoch loop at top
level), so its functions ``TRADES_loss``, ``TRADES_classwise_loss``, ``train`` and ``validate``
are taken from the parsed file and executed in a namespace holding what they read (``args``,
``attack``, the weight globals); the Hedge update is the epoch loop's own ``if args.alg == 'wat':``
statement, executed the same way with ``validate`` answering made-up costs.
"""
import argparse
import ast
import datetime
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from conformance import Recorder
from record import Capture, unit

REPO = "boqili/WAT"
PINNED = "62d1184f9b88909c9e782ab8234128324235ac84"
FLOAT64 = []  # its code casts nothing the float64 run does not cover
SCRIPT = "worst_class_adversarial_train.py"
K = 10
EPOCHS = 6
VAL_BATCH = 8  # args.batch_size of the validation: the 12 images in batches of 8 and 4 (the last partial)
STEP_IMAGES = 2  # the attack (BN in eval mode: each image on its own) is kept step by step for the first 2
# argparse defaults of the script (--eta 0.1, --beta 6, --epsilon 0.031, --step_size 0.007, --num_steps 10)
SETTINGS = {"eta": 0.1, "beta": 6.0, "epsilon": 0.031, "step_size": 0.007, "num_steps": 10, "class_num": K,
            "alg": "wat"}


def subset(y: torch.Tensor) -> torch.Tensor:
    """12 of the fixed images, every class present, unbalanced: each class's first, then the first 2 others."""
    first = [y.tolist().index(k) for k in range(K)]
    rest = [i for i in range(len(y)) if i not in first][:2]
    return torch.tensor(sorted(first + rest))


def script(path: Path):
    tree = ast.parse((path / SCRIPT).read_text())
    return tree, str(path / SCRIPT)


def run_nodes(nodes, filename, ns):
    exec(compile(ast.Module(body=list(nodes), type_ignores=[]), filename, "exec"), ns)


def namespace(path, batch_size):
    """The script's functions, executed from its parsed source in a namespace of what they read."""
    import attack_generator

    tree, filename = script(path)
    ns = {"torch": torch, "nn": nn, "F": F, "np": np, "datetime": datetime, "attack": attack_generator,
          "args": argparse.Namespace(**SETTINGS, batch_size=batch_size), "iter_num": 0, "epoch": 0}
    funcs = {"TRADES_loss", "TRADES_classwise_loss", "train", "validate"}
    run_nodes([n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in funcs], filename, ns)
    return ns


def hedge_statement(path):
    """The epoch loop's ``if args.alg == 'wat':`` statement (validate, costs, class_factor, weights)."""
    tree, filename = script(path)
    loop = next(n for n in tree.body if isinstance(n, ast.For) and "epoch" in ast.unparse(n.target))
    node = next(n for n in loop.body if isinstance(n, ast.If) and "args.alg == 'wat'" in ast.unparse(n.test))
    return node, filename


def hedge(path):
    """The code's weights after each of EPOCHS epochs fed made-up validation costs (nat, bndy: (E, K+1))."""
    g = torch.Generator().manual_seed(1)
    nat = 0.3 + 2.2 * torch.rand(EPOCHS, K + 1, generator=g)
    bndy = 0.05 + 0.45 * torch.rand(EPOCHS, K + 1, generator=g)
    ns = namespace(path, VAL_BATCH)
    ns.update(nat_class_weights=torch.ones(K + 1), bndy_class_weights=torch.ones(K + 1), model=None,
              valid_loader=None, wat_valid_nat_cost=torch.zeros(EPOCHS, K + 1),
              wat_valid_bndy_cost=torch.zeros(EPOCHS, K + 1), wat_valid_cost=torch.zeros(EPOCHS, K + 1))
    ns["args"].epochs = EPOCHS

    def validate(model, loader, nat_cost, bndy_cost):  # answers the made-up costs of this epoch
        nat_cost[ns["epoch"]] = nat[ns["epoch"]]
        bndy_cost[ns["epoch"]] = bndy[ns["epoch"]]
        return nat_cost, bndy_cost, 0.0, [0.0] * K

    ns["validate"] = validate
    node, filename = hedge_statement(path)
    weights, costs = [], []
    for epoch in range(EPOCHS):
        ns["epoch"] = epoch
        run_nodes([node], filename, ns)
        assert torch.equal(ns["nat_class_weights"], ns["bndy_class_weights"])
        weights.append(ns["bndy_class_weights"].clone())
        costs.append(ns["wat_valid_cost"][epoch].clone())
    return torch.stack(costs), torch.stack(weights)


def validation(path, inp, weights, idx):
    """validate() on the subset in two batches, then the hedge statement's cost of that epoch."""
    ns = namespace(path, VAL_BATCH)
    rec = Recorder(inp.model("train"))
    marks = []
    x, y = inp.x[idx], inp.y[idx]

    class Loader:  # batches in order; validate reads len(loader.dataset)
        dataset = y

        def __iter__(self):
            for i in range(0, len(y), VAL_BATCH):
                yield x[i:i + VAL_BATCH], y[i:i + VAL_BATCH]
                marks.append(len(rec.inputs))  # after the batch: its last forward is model(output_adv)

    ns.update(nat_class_weights=weights, bndy_class_weights=weights, model=rec, valid_loader=Loader(),
              wat_valid_nat_cost=torch.zeros(1, K + 1), wat_valid_bndy_cost=torch.zeros(1, K + 1),
              wat_valid_cost=torch.zeros(1, K + 1))
    node, filename = hedge_statement(path)
    run_nodes([node], filename, ns)
    x_adv = torch.cat([rec.inputs[m - 1] for m in marks])
    assert x_adv.shape == x.shape and len(marks) == 2
    return {"val_cost": ns["wat_valid_cost"][0].numpy(), "val_x_adv": x_adv.numpy()}


def training(path, inp, weights, idx):
    """train() for one batch (the subset) with non-uniform class weights (K + 1 entries)."""
    ns = namespace(path, len(idx))
    model = inp.model("train")
    rec = Recorder(model)
    opt = Capture(model)
    ns.update(nat_class_weights=weights.clone(), bndy_class_weights=weights.clone())
    _, loss = ns["train"](rec, [(inp.x[idx], inp.y[idx])], opt, 0)
    # the last two forwards are model(data), model(output_adv), after model.train()
    x_adv = rec.inputs[-1]
    n = STEP_IMAGES
    return {"iterates": np.stack([t[:n].numpy() for t in rec.iterates + [x_adv]]),
            "step_grads": np.stack([unit(g[:n]) for g in rec.grads]), "x_adv": x_adv.numpy(),
            "loss": np.float64(loss), "weight_grad": opt.grad.numpy(), "train_weights": weights.numpy()}


def generate(path, inp):
    costs, weights = hedge(path)
    idx = subset(inp.y)
    arrays = {"hedge_costs": costs.numpy(), "hedge_weights": weights.numpy(), "subset": idx.numpy()}
    arrays.update(validation(path, inp, weights[-1], idx))
    arrays.update(training(path, inp, weights[-1], idx))
    fn = {"file": SCRIPT}
    meta = {**fn, "function": "train", "settings": {**SETTINGS, "epochs": EPOCHS, "val_batch_size": VAL_BATCH},
            "sources": {"hedge": {**fn, "function": "main loop: if args.alg == 'wat'"},
                        "validate": {**fn, "function": "validate"}},
            "hedge_costs": "made-up costs nat + beta bndy (K + 1 entries, the last the average expert) per epoch",
            "hedge_weights": "the code's bndy_class_weights (= nat_class_weights) after each epoch",
            "subset": "the 12 images (indices into inputs) of every run below: each class's first, 2 more",
            "val_cost": "wat_valid_cost[epoch] after validate on the subset in batches of 8 and 4",
            "val_x_adv": "the x_adv validate's attack made (its model(output_adv) input)",
            "iterates": "train(): x_0 .. x_K of the training attack, its first 2 images (BN eval: independent)",
            "step_grads": "the gradient of each step, first 2 images, over each image's max |g|, float32",
            "x_adv": "train(): the adversarial forward's input, all 12",
            "train_weights": "the class weights train() read (nat = bndy, K + 1): the last hedge weights"}
    return {"wat": (arrays, meta)}
