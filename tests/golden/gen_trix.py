"""TRIX (Fairness-a11y/TRIX): losses.mixed_trades_loss (the batch's class weights, the targeted split, the
targets, the mixed attack, loss and weight gradient) and the DAFA weights of train.py's loop."""
import contextlib
import types

import numpy as np
import torch
import torch.nn.functional as F

from conformance import Recorder
from gen_dafa import LOOP, made_up_epochs, made_up_similarities, run_training_loop, similarity_batches

REPO = "Fairness-a11y/TRIX"
PINNED = "cdeb435fde5c538842c08203aee51f8b80754da6"
FLOAT64 = []  # its code casts nothing the float64 run does not cover
# arguments.py defaults / scripts/trix.sh
SETTINGS = {"epsilon": 0.031, "pgd_step_size": 0.007, "pgd_num_steps": 10, "beta": 6.0, "n_class": 10}
BATCH = 24  # the first 24 fixed images: 9 classes (class 2 absent), unbalanced, so the split's mean over the
# batch's samples differs from a mean over its classes (rows 3, 10 and 21)


@contextlib.contextmanager
def patched(obj, name, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


class Functional(types.SimpleNamespace):
    """torch.nn.functional with ``cross_entropy`` recording the targets it is given (the code's y_t)."""

    def __init__(self):
        super().__init__(targets=[])

    def __getattr__(self, name):
        return getattr(F, name)

    def cross_entropy(self, logits, target, **kw):
        self.targets.append(target.detach().clone())
        return F.cross_entropy(logits, target, **kw)


def run_mixed(losses, model, x, y, weights, settings):
    """mixed_trades_loss on (x, y) with the targets and the batch class weights it computes recorded."""
    fn, seen = Functional(), {}
    clean = losses.calculate_class_weights_from_clean

    def recording_clean(**kw):
        seen["tar_weights"] = clean(**kw)
        return seen["tar_weights"]

    rec = Recorder(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = len(y)
    memory = {"probs": np.zeros((n, settings["n_class"])), "labels": np.zeros(n)}
    with patched(losses, "F", fn), patched(losses, "calculate_class_weights_from_clean", recording_clean):
        loss, info = losses.mixed_trades_loss(rec, x, y, opt, types.SimpleNamespace(**settings), weights,
                                              batch_indices=np.arange(n), memory_dict=memory)
    # the first cross_entropy call is the first attack step's, on y_t
    return loss, rec, fn.targets[0], seen["tar_weights"], memory["probs"], info


def target_table(losses, inp, x, y, weights):
    """(C, N): the code's final draw rand_y_t of every row when torch.randint's first draw is r for all rows
    (row r); a redraw (rows with y == r) comes from the seeded generator. rand_y_t is redrawn in place, so the
    tensor handed out is the final one."""
    classes, out = SETTINGS["n_class"], []
    real = torch.randint
    for r in range(classes):
        handed = []

        def randint(*a, **k):
            if handed:
                return real(*a, **k)
            handed.append(torch.full(tuple(k["size"]), r, dtype=torch.long))
            return handed[0]

        with patched(torch, "randint", randint):
            run_mixed(losses, inp.model("train"), x, y, weights, {**SETTINGS, "pgd_num_steps": 1})
        out.append(handed[0].numpy())
    return np.stack(out)


def generate(path, inp):
    import losses
    from utils import calculate_class_weights

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    # non-uniform epoch class weights: the code's W of a made-up similarity at lambda 1.5, rounded to float32
    sim = made_up_similarities(np.random.default_rng(0))[1]
    w = calculate_class_weights(similarity_batches([sim])[0], 1.5).astype(np.float32).astype(np.float64)
    model = inp.model("train")
    loss, rec, y_t, tar_weights, probs, info = run_mixed(losses, model, x, y, w, SETTINGS)
    grad = torch.autograd.grad(loss, list(model.parameters()))
    strong = (y_t != y).numpy()  # the code redraws until rand_y_t != y, so a targeted row's y_t is never y
    assert int(strong.sum()) == info["num_targeted"]
    rows = [int(np.flatnonzero(strong)[0]), int(np.flatnonzero(~strong)[0])]
    its = rec.iterates + [rec.inputs[-2]]  # the last forwards are model(x_adv), model(x)
    attack = {"y_t": y_t.numpy(), "tar_weights": np.asarray(tar_weights), "step_rows": np.array(rows),
              "x_start": its[0].numpy(), "x_adv": its[-1].numpy(),
              "step_iterates": np.stack([t[rows].numpy() for t in its]),
              "step_grads": np.stack([g[rows].numpy() for g in rec.grads]),
              "loss": loss.detach().numpy(), "weight_grad": torch.cat([g.flatten() for g in grad]).numpy(),
              "stored_probs": np.asarray(probs), "target_table": target_table(losses, inp, x, y, w)}
    rng = np.random.default_rng(1)
    ly, logits = made_up_epochs(rng, LOOP["epochs"], LOOP["samples"])
    order = rng.permutation(LOOP["samples"])
    batches = [order[i:i + LOOP["batch_size"]] for i in range(0, LOOP["samples"], LOOP["batch_size"])]
    used = run_training_loop(path / "train.py", calculate_class_weights, "mixed", ly, logits, batches, LOOP)
    loop = {"labels": ly, "logits": logits, "batch_order": order, "weights_used": used}
    meta = {"file": "losses.py", "function": "mixed_trades_loss", "settings": SETTINGS, "class_weights": w.tolist(),
            "batch": f"the first {BATCH} fixed images",
            "y_t": "the targets the code's first attack step passes to F.cross_entropy (y on untargeted rows)",
            "tar_weights": "what calculate_class_weights_from_clean returned (the batch's class weights)",
            "target_table": "row r: the code's rand_y_t when torch.randint's first draw is r for every row",
            "step_iterates": "x_0 (the code's start x + 0.001 N(0, I)) .. x_K of step_rows (a targeted row, an "
                             "untargeted row), recorded at each forward",
            "sources": {"tar_weights": {"file": "losses.py", "function": "calculate_class_weights_from_clean"}}}
    return {
        "trix": (attack, meta),
        "trix_loop": (loop, {"file": "train.py", "function": "main", "loop": LOOP,
                             "logits": "made-up per-epoch logits; a stand-in for --loss mixed stores their softmax "
                                       "in the code's memory_dict and records the class_weights each epoch trains "
                                       "with"}),
    }
