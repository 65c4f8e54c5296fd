"""DAFA (rucy74/DAFA): class weights (utils.calculate_class_weights), the warm-up of train.py's loop,
and the TRADES / PGD-AT attacks, losses and weight gradients of losses.trades_loss / madry_loss.

Also holds :func:`code_functions` and :func:`run_training_loop`, which gen_trix.py uses on the TRIX
code's train.py (the same loop)."""
import ast
import logging
import os
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from conformance import Recorder

REPO = "rucy74/DAFA"
PINNED = "c60ba8352d712c6108480a2ce7e7fa7abf30b48a"
FLOAT64 = []  # utils.py, losses.py and train.py's loop cast nothing the float64 run does not cover
# arguments.py defaults / scripts/trades_dafa.sh
SETTINGS = {"epsilon": 0.031, "pgd_step_size": 0.007, "pgd_num_steps": 10, "beta": 6.0, "n_class": 10}
LAMBDAS = [0.5, 1.0, 1.5, 3.0]  # code --dafa_lambda: CIFAR-10 1.0, CIFAR-100 / STL-10 1.5; 3.0 drives a W below 0
LOOP = {"epochs": 5, "dafa_warmup": 3, "dafa_lambda": 1.0, "samples": 40, "batch_size": 16}


def code_functions(path: Path, names, namespace: dict) -> dict:
    """Compile and run just the top-level functions ``names`` of the authors' script ``path`` (whose
    module body parses arguments and loads data) in ``namespace``: their code, none of their globals."""
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in nodes} == set(names), f"{path} lacks some of {names}"
    exec(compile(ast.Module(body=nodes, type_ignores=[]), str(path), "exec"), namespace)
    return namespace


def similarity_batches(sims):
    """One made-up sample per class whose softmax row is row i of ``sim``: the code's mean over class i is that row."""
    return [{"probs": s, "labels": np.arange(s.shape[0], dtype=np.float64)} for s in sims]


def made_up_similarities(rng, classes=10, count=3):
    """Row-stochastic (C, C) matrices with a heavier diagonal; the last has exact diagonal ties (classes 1, 4, 7)."""
    out = []
    for k in range(count + 1):
        s = rng.dirichlet(np.full(classes, 0.6), size=classes) + np.diag(rng.uniform(0.5, 3.0, classes))
        s = s / s.sum(1, keepdims=True)
        if k == count:  # exact ties on the diagonal, rows still summing to 1
            for i in (4, 7):
                s[i] = s[i] * (1 - s[1, 1]) / (1 - s[i, i])
                s[i, i] = s[1, 1]
        out.append(s)
    return out


def paper_weights(s, lam):
    """DAFA paper, Algorithm 2, in float64: on a tie p_i(i) == p_j(j) neither branch fires."""
    c = s.shape[0]
    w = np.ones(c)
    for i in range(c):
        for j in range(c):
            if i != j and s[i, i] < s[j, j]:
                w[i] += lam * s[i, j] * s[j, j]
            elif i != j and s[i, i] > s[j, j]:
                w[i] -= lam * s[j, i] * s[i, i]
    return w


def made_up_epochs(rng, epochs, n, classes=10):
    """(labels (n,), logits (epochs, n, C): float32 values held in float64): every class present; class k's own
    logit is raised by a class- and epoch-dependent margin, so the per-class similarity differs between classes and
    epochs."""
    y = np.arange(n) % classes
    rng.shuffle(y)
    margin = rng.uniform(0.0, 3.0, (epochs, classes))
    z = rng.normal(0.0, 1.5, (epochs, n, classes))
    z[:, np.arange(n), y] += margin[:, y]
    return y.astype(np.int64), z.astype(np.float32).astype(np.float64)


def run_training_loop(train_py: Path, calculate_class_weights, loss_name: str, y, logits, batches, loop) -> np.ndarray:
    """Run the authors' train.py ``main`` and ``train`` (their epoch loop, warm-up test and memory_dict) for
    ``loop['epochs']`` epochs over made-up batches, with a stand-in for the loss that records the class weights
    each epoch trains with and stores softmax(logits[epoch]) where the code's loss stores its training
    adversarial softmax. Returns the weights used, (epochs, C)."""
    n, classes = len(y), logits.shape[-1]
    used = np.full((loop["epochs"], classes), np.nan)
    args = types.SimpleNamespace(
        dataset="cifar10", model="stand-in", load_epoch=0, lr=0.1, momentum=0.9, weight_decay=5e-4, nesterov=True,
        epochs=loop["epochs"], lr_schedule="bag_of_tricks", eval_freq=10 ** 9, save_start=-1, save_freq=10 ** 9,
        save_all=False, rob_fairness_algorithm="dafa", dafa_warmup=loop["dafa_warmup"],
        dafa_lambda=loop["dafa_lambda"], loss=loss_name, log_interval=10 ** 9, batch_size=loop["batch_size"],
        model_dir="unused")
    weight = torch.nn.Parameter(torch.zeros(()))

    def stand_in_loss(model, x_natural, y, optimizer, args, class_weights, batch_indices=None, memory_dict=None,
                      **_):
        cw = class_weights.cpu().numpy() if torch.is_tensor(class_weights) else np.asarray(class_weights)
        used[args.epoch] = cw
        if memory_dict is not None:  # the code's losses store F.softmax(logits of x_adv) here
            memory_dict["probs"][batch_indices] = F.softmax(torch.from_numpy(logits[args.epoch][batch_indices]),
                                                            dim=1).numpy()
            memory_dict["labels"][batch_indices] = y.numpy()
        return weight * 0.0, {}

    loader = [((torch.zeros(len(b), 1), torch.from_numpy(y[b])), torch.from_numpy(b)) for b in batches]
    ns = {"args": args, "np": np, "torch": torch, "optim": torch.optim, "os": os, "time": time, "logging": logging,
          "logger": logging.getLogger("authors-train"), "use_cuda": False, "device": torch.device("cpu"),
          "model_dir": "unused", "trainset": range(n), "train_loader": loader, "test_loader": [],
          "get_model": lambda args: torch.nn.Linear(1, 1), "eval": lambda *a, **k: None, "print": lambda *a, **k: None,
          "calculate_class_weights": calculate_class_weights, "trades_loss": stand_in_loss,
          "madry_loss": stand_in_loss, "mixed_trades_loss": stand_in_loss}
    code_functions(train_py, ["train", "adjust_learning_rate", "main"], ns)
    save, torch.save = torch.save, lambda *a, **k: None  # main saves checkpoints each epoch
    try:
        ns["main"]()
    finally:
        torch.save = save
    assert not np.isnan(used).any()
    return used


def loop_golden(path: Path, calculate_class_weights, loss_name: str):
    rng = np.random.default_rng(1)
    y, logits = made_up_epochs(rng, LOOP["epochs"], LOOP["samples"])
    order = rng.permutation(LOOP["samples"])
    batches = [order[i:i + LOOP["batch_size"]] for i in range(0, LOOP["samples"], LOOP["batch_size"])]
    used = run_training_loop(path / "train.py", calculate_class_weights, loss_name, y, logits, batches, LOOP)
    arrays = {"labels": y, "logits": logits, "batch_order": order, "weights_used": used}
    return arrays


def one_per_class(y: torch.Tensor) -> torch.Tensor:
    """Indices of the first image of each class in the fixed batch: the attack goldens' batch (10 images keep
    the golden files small; every class present)."""
    return torch.stack([torch.nonzero(y == k)[0, 0] for k in range(int(y.max()) + 1)])


def attack_golden(loss_fn, inp, weights, loss_name, step_rows, pick):
    """The authors' loss on the fixed images ``pick`` with class weights ``weights``: the start x_0 and the
    final x_adv of every row, each iterate x_0 .. x_K and step gradient of the rows ``step_rows`` (indices into
    ``pick``; the attack runs with BN in eval mode, so rows do not interact), the loss, the weight gradient and
    the softmax the code stores for the class similarity."""
    model = inp.model("train")
    rec = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    args = types.SimpleNamespace(**SETTINGS)
    x, y = inp.x[pick], inp.y[pick]
    n = len(y)
    memory = {"probs": np.zeros((n, SETTINGS["n_class"])), "labels": np.zeros(n)}
    loss, _ = loss_fn(rec, x, y, opt, args, weights, batch_indices=np.arange(n), memory_dict=memory)
    grad = torch.autograd.grad(loss, list(model.parameters()))
    # trades_loss's last forwards are model(x_adv), model(x); madry_loss's last is model(x_adv)
    x_adv = rec.inputs[-2] if loss_name == "trades" else rec.inputs[-1]
    its = rec.iterates + [x_adv]
    return {"pick": pick.numpy(), "step_rows": np.asarray(step_rows), "x_start": its[0].numpy(),
            "x_adv": x_adv.numpy(), "step_iterates": np.stack([t[step_rows].numpy() for t in its]),
            "step_grads": np.stack([g[step_rows].numpy() for g in rec.grads]),
            "loss": loss.detach().numpy(), "weight_grad": torch.cat([g.flatten() for g in grad]).numpy(),
            "stored_probs": np.asarray(memory["probs"])}


def row_weighted_trades(inp, pick, x_adv, w, beta):
    """Paper Algorithm 1 read as W_y times the whole TRADES row, in float64 (no code has it): mean_i W_{y_i}
    (CE(f(x_i), y_i) + beta KL(p(x_i) || p(x'_i))), train-mode forwards x then x'."""
    model = inp.model("train").double()
    x, y = inp.x[pick].double(), inp.y[pick]
    z_nat, z_adv = model(x), model(torch.from_numpy(x_adv).double())
    logp_nat, logp_adv = z_nat.log_softmax(1), z_adv.log_softmax(1)
    ce = -logp_nat.gather(1, y[:, None]).squeeze(1)
    kl = (logp_nat.exp() * (logp_nat - logp_adv)).sum(1)
    return (torch.from_numpy(w)[y] * (ce + beta * kl)).mean().detach().numpy()


def generate(path, inp):
    from losses import madry_loss, trades_loss
    from utils import calculate_class_weights

    rng = np.random.default_rng(0)
    sims = made_up_similarities(rng)
    code_w = np.stack([[calculate_class_weights(mem, lam) for lam in LAMBDAS] for mem in similarity_batches(sims)])
    paper_w = np.stack([[paper_weights(s, lam) for lam in LAMBDAS] for s in sims])
    weights = {"similarities": np.stack(sims), "lambdas": np.array(LAMBDAS), "code_weights": code_w,
               "paper_weights": paper_w}
    # non-uniform class weights for the attacks: the code's W of the first matrix at lambda 1.5, rounded to float32
    # (the code's class_weights_mask is float32 anyway)
    w = code_w[0, LAMBDAS.index(1.5)].astype(np.float32).astype(np.float64)
    pick = one_per_class(inp.y)
    rows = [int(np.argmax(w[inp.y[pick]])), int(np.argmin(w[inp.y[pick]]))]  # the largest and the smallest W_y
    trades = attack_golden(trades_loss, inp, w, "trades", rows, pick)
    trades["row_loss_paper"] = row_weighted_trades(inp, pick, trades["x_adv"], w, SETTINGS["beta"])
    madry = attack_golden(madry_loss, inp, w, "pgd", rows, pick)
    loop = loop_golden(path, calculate_class_weights, "trades")
    src = {"utils.py": {"file": "utils.py", "function": "calculate_class_weights"},
           "train.py": {"file": "train.py", "function": "main"}}
    common = {"settings": SETTINGS, "class_weights": w.tolist(),
              "batch": "the first image of each class of the fixed inputs (pick)",
              "step_iterates": "x_0 (the code's start x + 0.001 N(0, I)) .. x_K of step_rows, recorded at each "
                               "forward"}
    return {
        "dafa_weights": (weights, {**src["utils.py"], "lambdas": LAMBDAS, "sources": {
            "paper_weights": {"reference": "Lee et al. 2024 (DAFA), Algorithm 2 (float64 loop; a tie skips the pair)"}},
            "similarities": "made-up row-stochastic 10 x 10 matrices; the last has exact diagonal ties; each fed to "
                            "the code as one sample per class"}),
        "dafa_loop": (loop, {**src["train.py"], "loop": LOOP, "sources": {"weights_used": src["train.py"]},
                             "logits": "made-up per-epoch logits; a stand-in loss stores their softmax in the code's "
                                       "memory_dict and records the class_weights each epoch trains with"}),
        "dafa_trades": (trades, {"file": "losses.py", "function": "trades_loss", **common, "sources": {
            "row_loss_paper": {"reference": "Lee et al. 2024 (DAFA), Algorithm 1 read as W_y on the whole TRADES "
                                            "row (float64, on the code's x_adv)"}}}),
        "dafa_at": (madry, {"file": "losses.py", "function": "madry_loss", **common, "sources": {
            "eps_bound_paper": {"reference": "Lee et al. 2024 (DAFA), Algorithm 1: eps_k = W_k eps bounds x'"}}}),
    }
