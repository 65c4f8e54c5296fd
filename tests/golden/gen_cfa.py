"""CFA (PKU-ML/CFA): its attacks and losses (attack.py) for the three bases AT, TRADES and FAT, with and without
CCM's class-wise eps; the CCM/CCR and FAWA/EMA updates of train.py's epoch loop over made-up per-class statistics;
generate_validation.py's split on made-up labels.

train.py and generate_validation.py are scripts: the statements needed (the CCM, CCR, EMA and FAWA blocks of
train.py's epoch loop; the index loop of generate_validation.py) are taken from the files' syntax trees and run in
a namespace holding the made-up inputs, once per epoch. attack.py's ``normalize_cifar`` is the model's input
layer; TinyNet takes [0, 1] pixels, so it is the identity for the run.
"""
import argparse
import ast
from pathlib import Path

import numpy as np
import torch

from conformance import Recorder, TinyNet
from conformance_cfa import model_at
from conformance_fat import Flip, encode

REPO = "PKU-ML/CFA"
PINNED = "071f3334a59d144cedbe65b18019c9757bece6f2"
FLOAT64 = []  # attack.py and train.py's blocks cast nothing the float64 run does not cover
# train.py defaults: --epsilon 8 --pgd-alpha 2 --attack-iters 10 --beta 6 --tau 3 --lambda-1/2 0.5
# --decay-rate 0.88 --threshold 0.24; --begin 10 is 2 here so that six epochs reach it
SETTINGS = {"epsilon": 8 / 255, "alpha": 2 / 255, "attack_iters": 10, "beta": 6.0, "tau": 3, "lambda_1": 0.5,
            "lambda_2": 0.5, "begin": 2, "decay_rate": 0.88, "threshold": 0.24, "epochs": 6}
BATCH = 16
FLIP_TAUS = (0, 1, 3)
TRACKED = ["features.0.weight", "features.1.running_mean", "features.5.running_var", "fc.bias",
           "features.1.num_batches_tracked"]


def epoch_loop(path: Path):
    """The body of train.py's ``for epoch in range(epochs):`` loop."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and ast.unparse(node.iter) == "range(epochs)":
            return node.body
    raise AssertionError("train.py: no epoch loop")


def pick(body, *sources):
    """The statements of ``body`` whose source starts with one of ``sources``, compiled as one block."""
    nodes = [n for n in body if any(ast.unparse(n).startswith(s) for s in sources)]
    assert len(nodes) == len(sources), [ast.unparse(n)[:40] for n in nodes]
    return compile(ast.Module(body=nodes, type_ignores=[]), "train.py", "exec")


def made_up_robust(epochs):
    """Train robust accuracy per epoch and class (CW_log.result's m * cw_robust / N), and the validation's."""
    g = torch.Generator().manual_seed(7)
    train = (torch.randint(0, 4901, (epochs, 10), generator=g) / 4900.0).float()
    val = (torch.randint(0, 101, (epochs, 10), generator=g) / 100.0).float()
    val_min = [0.15, 0.3, 0.2, 0.27, 0.5, 0.1]  # the FAWA gate: worst class below, above, below, ...
    for e, v in enumerate(val_min):
        val[e] = val[e].clamp(min=v + 0.01)
        val[e, e % 10] = v
    return train, val


def per_class(path, inp):
    from utils import weight_average

    s = SETTINGS
    body = epoch_loop(path / "train.py")
    calibrate = pick(body, "if epoch >= args.begin:", "if args.ccr and epoch >= args.begin:")
    average = pick(body, "weight_average(EMA_model", "R_min =", "if R_min >= args.threshold:")
    args = argparse.Namespace(begin=s["begin"], lambda_1=s["lambda_1"], lambda_2=s["lambda_2"], ccr=True,
                              mode="TRADES", tau=s["tau"], decay_rate=s["decay_rate"], threshold=s["threshold"])
    train_robust, val_robust = made_up_robust(s["epochs"])
    torch.manual_seed(0)
    ns = {"args": args, "torch": torch, "device": "cpu", "eps": s["epsilon"], "beta": s["beta"],
          "class_beta": torch.ones(10) * (s["beta"] / (1 + s["beta"])), "weight_average": weight_average,
          "EMA_model": TinyNet().eval(), "FAWA_model": TinyNet().eval(), "SEAT_init": False}
    out = {k: [] for k in ("class_eps", "class_beta", "fawa_accepted")}
    avg = {f"{w}.{k}": [] for w in ("ema", "fawa") for k in TRACKED}
    for epoch in range(s["epochs"]):
        # cw_tensor holds every finished epoch's (train clean, train robust, ...) per class; row 1 is A_k
        cw = torch.zeros(max(epoch, 1), 6, 10)
        cw[:epoch, 1] = train_robust[:epoch]
        ns.update(epoch=epoch, cw_tensor=cw)
        exec(calibrate, ns)
        out["class_eps"].append(ns["class_eps"].clone())
        out["class_beta"].append(ns["class_beta"].clone())
        before = {k: v.clone() for k, v in ns["FAWA_model"].state_dict().items()}
        ns.update(model=model_at(inp, epoch), valid_result=(None, None, None, val_robust[epoch]))
        exec(average, ns)
        after = ns["FAWA_model"].state_dict()
        out["fawa_accepted"].append(not all(torch.equal(before[k], after[k]) for k in before))
        for w in ("ema", "fawa"):
            sd = ns[f"{w.upper()}_model"].state_dict()
            for k in TRACKED:
                avg[f"{w}.{k}"].append(sd[k].clone())
    arrays = {k: torch.stack(v).numpy() if k != "fawa_accepted" else np.array(v) for k, v in out.items()}
    arrays.update({k: torch.stack(v).numpy() for k, v in avg.items()})
    arrays.update(train_robust=train_robust.numpy(), val_robust=val_robust.numpy())
    return arrays


def trace(prefix, fn, inp, x, y, eps_rows, *args, eval_attack=False, model=None):
    """Run one of attack.py's losses on a Recorder; its iterates as a trace, and the loss and weight gradient."""
    model = model or inp.model("train")
    rec = Recorder(model)
    loss, _ = fn(rec, x, y, *args)
    grad = torch.cat([g.flatten() for g in torch.autograd.grad(loss, list(model.parameters()))])
    K = SETTINGS["attack_iters"]
    # PGD / FAT: one forward per iterate (FAT one more after its last step), then the CE forward on x + delta;
    # TRADES: x_adv and x per step, then x, x_adv, x
    its = rec.iterates[:K + 1] if not eval_attack else rec.iterates[:K]
    x_adv = rec.inputs[-2] if eval_attack else rec.inputs[-1]
    its = its[:K] + [x_adv]
    grads = rec.grads + [None] * (K - len(rec.grads))
    while len(its) < K + 1:  # FAT broke off: nothing moved any more
        its.insert(-1, its[-2])
    moved = torch.stack([(its[k + 1] != its[k]).flatten(1).any(1) for k in range(K)])
    arrays = encode(prefix, x, its, grads, eps_rows, SETTINGS["alpha"], moved)
    if prefix in ("at", "trades_ccm", "fat"):  # the loss formulas: CE (AT, FAT) and CCR's TRADES
        arrays[f"{prefix}.loss"] = loss.detach().numpy()
    if prefix in ("trades_ccm", "fat"):  # pgd_loss's CE is fat_loss's: one weight gradient of it is enough
        arrays[f"{prefix}.weight_grad"] = grad.numpy()
    print(f"CFA {prefix}: steps taken per row {moved.sum(0).tolist()}")
    return arrays


def generate(path, inp):
    import attack

    attack.normalize_cifar = lambda t: t  # the model's input layer: TinyNet reads [0, 1] pixels
    s = SETTINGS
    arrays = per_class(path, inp)
    # the attacks' class-wise eps and beta: the last made-up epoch's (the code's CCM and CCR blocks)
    class_eps = torch.from_numpy(arrays["class_eps"][-1])
    class_beta = torch.from_numpy(arrays["class_beta"][-1])
    x, y = inp.x[:BATCH], inp.y[:BATCH]
    eps, alpha, K, tau = s["epsilon"], s["alpha"], s["attack_iters"], s["tau"]
    flat = torch.full((BATCH,), eps)
    torch.manual_seed(1)
    arrays.update(trace("at", attack.pgd_loss, inp, x, y, flat, eps, s["beta"], alpha, K))
    arrays.update(trace("at_ccm", attack.cw_pgd_loss, inp, x, y, class_eps[y], class_eps, s["beta"], alpha, K))
    arrays.update(trace("trades", attack.trades_loss, inp, x, y, flat, eps, class_beta, alpha, K, eval_attack=True))
    arrays.update(trace("trades_ccm", attack.cw_trades_loss, inp, x, y, class_eps[y], class_eps, class_beta, alpha, K,
                        eval_attack=True))
    arrays.update(trace("fat", attack.fat_loss, inp, x, y, flat, eps, tau, alpha, K))
    arrays.update(trace("fat_ccm", attack.cw_fat_loss, inp, x, y, class_eps[y], class_eps, tau, alpha, K))
    for t in FLIP_TAUS:  # conformance_fat.Flip: a prediction that flips with each step tells the stop rules apart
        arrays.update(trace(f"flip{t}", attack.fat_loss, inp, x, torch.zeros_like(y), flat, eps, t, alpha, K,
                            model=Flip(alpha)))
    arrays.update(split(path))
    fn = {"pgd_loss": "at", "cw_pgd_loss": "at_ccm", "trades_loss": "trades", "cw_trades_loss": "trades_ccm",
          "fat_loss": "fat", "cw_fat_loss": "fat_ccm"}
    sources = {p: {"file": "attack.py", "function": f} for f, p in fn.items()}
    sources.update(per_class={"file": "train.py", "function": "__main__ (epoch loop: CCM, CCR blocks)"},
                   averaging={"file": "train.py", "function": "__main__ (epoch loop: EMA, FAWA blocks)"},
                   split={"file": "generate_validation.py", "function": "__main__ (index loop)"})
    sources.update({f"flip{t}": {"file": "attack.py", "function": "fat_loss"} for t in FLIP_TAUS})
    meta = {"file": "attack.py", "function": "-", "settings": s, "batch": BATCH, "tracked": TRACKED,
            "flip_taus": {f"flip{t}": t for t in FLIP_TAUS},
            "sources": sources,
            "traces": "PREFIX.*: the attack of that function on the first BATCH images from the code's own start "
                      "(see conformance_fat.encode); class_eps / class_beta of the last made-up epoch",
            "per_class": "class_eps, class_beta (beta_k / (1 + beta_k)), fawa_accepted and the EMA / FAWA averages "
                         "of the TRACKED tensors after each epoch, from train_robust and val_robust"}
    return {"cfa": (arrays, meta)}


def split(path: Path) -> dict:
    """generate_validation.py's CIFAR-10 index loop on made-up labels (5000 images, about 500 per class)."""
    tree = ast.parse((path / "generate_validation.py").read_text())
    main = next(n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
    cifar10 = next(n for n in main.body if isinstance(n, ast.If) and "cifar10" in ast.unparse(n.test))
    nodes = []
    for n in cifar10.body:
        src = ast.unparse(n)
        if src.startswith(("n = ", "valid_index, train_index", "for i in range(10)", "valid_index = torch.cat",
                           "train_index = torch.cat")):
            nodes.append(n)
    assert len(nodes) == 5
    labels = torch.randint(0, 10, (5000,), generator=torch.Generator().manual_seed(3))
    ns = {"torch": torch, "ori_label": labels}
    exec(compile(ast.Module(body=nodes, type_ignores=[]), "generate_validation.py", "exec"), ns)
    return {"split.labels": labels.numpy(), "split.valid_index": ns["valid_index"].numpy(),
            "split.train_index": ns["train_index"].numpy(), "split.n": np.int64(ns["n"])}
