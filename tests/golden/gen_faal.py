"""FAAL (TrustAI/FAAL): the KL-ball class weights of ``FAAL.DAW`` (cvxpy), and ft_prn.py's fine-tuning step.

``ft_prn.py`` is a script (argparse, model loading and the epoch loop at top level): its inner loop
``for i, (X, y) in enumerate(train_loader):`` -- attack, class margins, ``DAW.solve_weight``, the
weighted loss, ``loss.backward()``, ``opt.step()`` -- is taken from the parsed file and executed for
one batch in a namespace holding what it reads (``utils``' functions, ``DAW``, ``args``), with
``--normalization 01`` (mu 0, std 1: TinyNet takes [0, 1] images) and an optimiser whose ``step``
keeps the weight gradient. Generation needs cvxpy and ECOS (``pip install cvxpy ecos``); FAAL.py's
``import mosek`` (a fallback solver never reached when ECOS solves) is answered by an empty module
when MOSEK is not installed.
"""
import argparse
import ast
import contextlib
import sys
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from conformance import Recorder
from record import Capture, unit

REPO = "TrustAI/FAAL"
PINNED = "b20ee9dbe60c5ab700eaab3d41faa10e5295d39a"
K = 10
BATCH = 16  # the first 16 fixed images: 8 classes present, so the code's absent-class path (NaN -> -1) runs
STEP_IMAGES = 2  # the attacks (BN in eval mode: each image on its own) are kept step by step for the first 2
RHOS = (0.1, 0.5, 1.0, 2.0)  # run_prn.py and the README: --scale 0.5
# run_prn.py: --distance kl --epsilon 8 --steps 10 --alpha 2 --scale 0.5 (ft_prn.py divides eps, alpha by 255)
# DAW.solve_weight's `.float()` of the float64 p.value and ft_prn.py's and utils.py's `.float()` masks and
# torch.zeros(10) class sums: make.py's FLOAT64_RUN; cvxpy (ECOS) solves in float64 in either run
FLOAT64 = []
SETTINGS = {"distance": "kl", "epsilon": 8 / 255, "alpha": 2 / 255, "steps": 10, "scale": 0.5}


def import_faal():
    import cvxpy  # noqa: F401  (before the stand-in below, so cvxpy's own solver list is not fooled)

    stub = "mosek" not in sys.modules and _missing("mosek")
    if stub:
        sys.modules["mosek"] = types.ModuleType("mosek")
    try:
        import FAAL
        return FAAL
    finally:
        if stub:
            del sys.modules["mosek"]


def _missing(name):
    try:
        __import__(name)
        return False
    except ImportError:
        return True


def solve(faal, y, class_scores, rho):
    """DAW.solve_weight as ft_prn.py calls it; (the weights it returns, its `.float()` of p.value: float32, or
    float64 in the float64 run; float64 p.value; solver name)."""
    daw = faal.DAW(train_batch_size=K, output_return="weights", learning_approach="kl", r_choice=rho)
    w = daw.solve_weight(y, class_scores, device="cpu")
    if rho <= 0:
        return w, w.double(), "none"
    assert daw.model.status == "optimal", daw.model.status
    return w, torch.from_numpy(np.asarray(daw.p.value, dtype=np.float64)), daw.model.solver_stats.solver_name


def solver_cases(faal):
    """Made-up class means (absent classes -1, as ft_prn.py sets NaN means) and counts, at several radii."""
    g = torch.Generator().manual_seed(2)
    rows = {"counts": [], "scores": [], "rho": [], "weights": [], "p": []}
    solvers = set()
    for case in range(4):
        counts = torch.randint(1, 12, (K,), generator=g)
        if case == 3:
            counts[[2, 7]] = 0  # classes absent from the batch
        scores = torch.rand(K, generator=g) * 2 - 1  # a softmax margin lies in [-1, 1]
        scores[counts == 0] = -1.0
        y = torch.repeat_interleave(torch.arange(K), counts)
        y = y[torch.randperm(len(y), generator=g)]
        for rho in (0.0,) + RHOS if case == 0 else RHOS:
            w, p, name = solve(faal, y, scores.float(), rho)
            solvers.add(name)
            rho_t = torch.tensor(rho, dtype=torch.float64)
            for key, v in (("counts", counts), ("scores", scores.float()), ("rho", rho_t), ("weights", w), ("p", p)):
                rows[key].append(v)
    return {f"solver_{k}": torch.stack(v).numpy() for k, v in rows.items()}, sorted(solvers - {"none"})


@contextlib.contextmanager
def cuda_is_cpu():
    """ft_prn.py calls ``solve_weight(..., device='cuda')``, i.e. ``tensor.to('cuda')``: the CPU here
    (make.py makes ``.cuda()`` a no-op; this does the same for ``.to``)."""
    saved = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)
        if isinstance(kwargs.get("device"), str) and kwargs["device"].startswith("cuda"):
            kwargs["device"] = "cpu"
        return saved(self, *args, **kwargs)

    torch.Tensor.to = to
    try:
        yield
    finally:
        torch.Tensor.to = saved


def batch_loop(path):
    """ft_prn.py's ``for i, (X, y) in enumerate(train_loader):`` statement, parsed from the file."""
    filename = str(path / "ft_prn.py")
    tree = ast.parse(Path(filename).read_text())
    epochs = next(n for n in tree.body if isinstance(n, ast.For) and ast.unparse(n.target) == "epoch")
    loop = next(n for n in epochs.body if isinstance(n, ast.For) and "train_loader" in ast.unparse(n.iter))
    return compile(ast.Module(body=[loop], type_ignores=[]), filename, "exec")


def finetune(path, faal, inp, loss_kind):
    import utils

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    model = inp.model("train")
    rec = Recorder(model)
    opt = Capture(model)
    s = SETTINGS
    ns = {"torch": torch, "nn": nn, "F": F, "np": np, "DAW": faal.DAW,
          "pgd_attack": utils.pgd_attack, "attack_trade": utils.attack_trade, "normalize": utils.normalize,
          "cw": utils.cw,  # ft_prn.py defines cw, then `from utils import *` rebinds it to utils.cw
          "args": argparse.Namespace(loss=loss_kind, distance=s["distance"], steps=s["steps"],
                                     lr_schedule="multistep"),
          "model": rec, "train_loader": [(x, y)], "opt": opt, "epsilon": s["epsilon"], "alpha": s["alpha"],
          "scale": s["scale"], "mu": torch.zeros(3, 1, 1), "std": torch.ones(3, 1, 1),
          "criterion": nn.CrossEntropyLoss(reduction="none"), "train_loss": 0, "train_acc": 0, "train_n": 0}
    with cuda_is_cpu():
        exec(batch_loop(path), ns)
    x_adv = ns["X_adv"]
    its = rec.iterates if loss_kind == "AT" else rec.iterates + [x_adv]  # pgd_attack's last forward is x_K
    assert len(its) == s["steps"] + 1 and len(rec.grads) == s["steps"]
    n = STEP_IMAGES
    p = loss_kind.lower()
    return {f"{p}_iterates": np.stack([t[:n].numpy() for t in its]),
            f"{p}_step_grads": np.stack([unit(g[:n]) for g in rec.grads]), f"{p}_x_adv": x_adv.numpy(),
            f"{p}_margin": ns["loss_margin"].detach().numpy(), f"{p}_class_margin": ns["class_margin"].detach().numpy(),
            f"{p}_weights": ns["weights"].detach().numpy(), f"{p}_loss": ns["loss"].detach().numpy(),
            f"{p}_weight_grad": opt.grad.numpy()}


def generate(path, inp):
    faal = import_faal()
    arrays, solvers = solver_cases(faal)
    for kind in ("AT", "TRADES"):
        arrays.update(finetune(path, faal, inp, kind))
    assert solvers == ["ECOS"], solvers
    meta = {"file": "ft_prn.py", "function": "epoch loop: for i, (X, y) in enumerate(train_loader)",
            "settings": {**SETTINGS, "batch": BATCH, "normalization": "01 (mu 0, std 1)"},
            "sources": {"solver": {"file": "FAAL.py", "function": "DAW.solve_weight"}},
            "solver": "cvxpy " + __import__("cvxpy").__version__ + ", solved by " + ", ".join(solvers),
            "solver_*": "made-up per-class means (absent: -1) and counts; the weights solve_weight returns "
                        "(its .float() cast: float64 in the float64 run) and the float64 p.value",
            "at_* / trades_*": "ft_prn.py --loss AT / --loss TRADES on the first 16 images: iterates x_0 .. x_K "
                               "and step gradients (over each image's max |g|, float32) of the first 2 images, "
                               "X_adv, cw margins, class_margin, weights, loss, weight gradient"}
    return {"faal": (arrays, meta)}
