"""rucy74/DAFA's training setup (arguments.py, train.py, datasets.py, scripts/): get_args() with the flags of
scripts/trades.sh, train.py's top-level `args.nesterov = not args.nesterov`, the lr of every epoch from its
adjust_learning_rate over its epoch loop's range, main()'s optimiser, the top-level training loader,
datasets.get_transform's training transform, what the model's first convolution reads, and which checkpoints the
epoch loop saves and which scripts/evaluation.sh evaluates. Used by gen_setup_trix.py for TRIX's copy of it."""
import ast
import re
import shlex
import sys

import numpy as np
import torch

from conformance_setup import Saved, loader_facts, normalisation, optimiser_facts, statements, transform_facts
from record import load_function

REPO = "rucy74/DAFA"
PINNED = "c60ba8352d712c6108480a2ce7e7fa7abf30b48a"


def script_flags(path, script):
    """The flags a scripts/*.sh passes to train.py (its --model_dir dropped: a folder)."""
    text = (path / "scripts" / script).read_text().replace("\\\n", " ")
    line = next(ln for ln in text.splitlines() if "python train.py" in ln)
    flags = shlex.split(line.split("python train.py", 1)[1])
    return [f for f in flags if not f.startswith("--model_dir")]


def setup(path, inp, script, name):
    import arguments
    import datasets
    import utils

    saved, sys.argv = sys.argv, ["train.py", *script_flags(path, script)]
    try:
        args = arguments.get_args()
    finally:
        sys.argv = saved
    tree = ast.parse((path / "train.py").read_text())
    ns = {"args": args, "torch": torch, "optim": torch.optim, "DataLoader": torch.utils.data.DataLoader,
          "trainset": list(range(10)), "kwargs": {}}
    exec(statements(tree.body, "args.nesterov = not args.nesterov", "train_loader = DataLoader("), ns)
    adjust = load_function(path / "train.py", "adjust_learning_rate", ns)
    main = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main")
    args.n_class = 10
    model = utils.get_model(args)
    ns["model"] = model
    exec(statements(main.body, "optimizer = optim.SGD("), ns)
    loop = next(n for n in main.body if isinstance(n, ast.For))
    assert ast.unparse(loop.iter) == "range(args.load_epoch + 1, args.epochs + 1)"
    epochs = list(range(args.load_epoch + 1, args.epochs + 1))
    lrs = [adjust(ns["optimizer"], epoch) for epoch in epochs]

    x = inp.x[:4]
    facts = {**loader_facts(ns["train_loader"]), "epochs": len(epochs), **optimiser_facts(ns["optimizer"]),
             "eps": float(args.epsilon), "alpha": float(args.pgd_step_size), "steps": int(args.pgd_num_steps),
             **transform_facts(datasets.get_transform(args.dataset, train=True)),
             "normalise": normalisation(model, x)}

    # which checkpoints the loop saves (torch.save recording names), and the one scripts/evaluation.sh evaluates
    keep = statements(loop.body, "if epoch % args.save_freq == 0")
    sv = Saved()
    ns.update(torch=sv, os=__import__("os"), model_dir="m")
    for epoch in epochs:
        ns["epoch"] = epoch
        exec(keep, ns)
    saved_epochs = [int(re.search(r"checkpoint-epoch(\d+)\.pt$", f).group(1)) for f in sv.files]
    evaluated = int(re.search(r"checkpoint-epoch(\d+)\.pt", (path / "scripts" / "evaluation.sh").read_text()).group(1))
    assert evaluated in saved_epochs
    print(f"{name} setup: lr {sorted(set(lrs))} from epochs {[e for e in epochs if lrs[e - 1] != lrs[e - 2]][1:]}, "
          f"saved {saved_epochs}, evaluated {evaluated}")
    # the made-up validation results only give fastfair's rule something to choose from: the code has no choice
    g = np.random.default_rng(3)
    n = len(epochs)
    results = np.clip(0.2 + 0.3 * np.arange(n)[:, None] / n + g.uniform(-0.1, 0.1, (n, 10)), 0, 1)
    arrays = {"lr": np.array(lrs), "select.saved": np.array(saved_epochs), "select.kept": np.int64(evaluated - 1),
              "select.results": results.astype(np.float32)}
    sources = {"lr": {"file": "train.py", "function": "adjust_learning_rate (epoch loop, 1-based)"},
               "setup": {"file": "arguments.py", "function": f"get_args ({script}), train.py, datasets.py"},
               "select": {"file": "train.py", "function": "main (save checkpoint); scripts/evaluation.sh"}}
    meta = {"file": "train.py", "function": "-", "sources": sources, "setup": facts,
            "flags": script_flags(path, script),
            "select": "select.saved: epochs (1-based) whose checkpoint the code writes; select.kept: the 0-based "
                      "epoch scripts/evaluation.sh evaluates; select.results: made-up validation results for "
                      "fastfair's rule"}
    return arrays, meta


def generate(path, inp):
    return {"setup_dafa": setup(path, inp, "trades.sh", "DAFA")}
