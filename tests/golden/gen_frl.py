"""FRL (hannxu123/fair_robust): for each variant, the attack, loss and weight gradient of the code's
``train_model`` (``trades_adv`` inside it) on one batch with non-uniform class weights, and the
multiplier / weight / margin updates of its ``frl_train`` (``normalize_lambda``, ``cost_sensitive``)
over 42 epochs of made-up per-class validation counts, with the scripts' rate1 halving.

frl-rw runs utils_frl.py with frlrw.py's defaults; frl runs utils_frl2.py with frlrmrw.py's; frl-rm
(no script of its own) runs utils_frl2.py with frlrmrw.py's defaults and --rate1 0. The scripts'
argparse defaults and literal settings are read from their files with ``ast`` (no code of theirs
runs for that) so that a check can compare fastfair's defaults and presets with them.
"""
import ast
import contextlib

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from conformance import SIGN_NOISE, U32, U64, Recorder
from conformance_frl import EPOCHS, LOSS_EPOCH, VAL_PER_CLASS, batch, replay

REPO = "hannxu123/fair_robust"
PINNED = "a80547def881cb4ca99b50e7544f997f9a0210a7"
FLOAT64 = []  # match_weight's torch.tensor(label == i, dtype=torch.float) masks: make.py's FLOAT64_RUN

# variant -> (module, script, settings overridden on the script's defaults)
VARIANTS = {"frl-rw": ("utils_frl", "frlrw.py", {}),
            "frl": ("utils_frl2", "frlrmrw.py", {}),
            "frl-rm": ("utils_frl2", "frlrmrw.py", {"rate1": 0.0})}


def script_settings(path, script: str) -> dict:
    """The script's argparse defaults, SGD and MultiStepLR keywords and its attack ``configs`` dicts,
    read from the file (literal arithmetic only)."""
    tree = ast.parse((path / script).read_text())
    out = {"args": {}}

    def value(node):
        return eval(compile(ast.Expression(node), script, "eval"), {"__builtins__": {}})

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            kw = {k.arg: k.value for k in node.keywords if k.arg}
            if node.func.attr == "add_argument" and "default" in kw:
                out["args"][value(node.args[0]).lstrip("-")] = value(kw["default"])
            elif node.func.attr in ("SGD", "MultiStepLR"):
                out[node.func.attr] = {k: value(v) for k, v in kw.items() if k != "params"}
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            out[node.targets[0].id] = value(node.value)
    return out


def val_per_class(path) -> int:
    """Validation images per class in data_loader.py: the width of its one slice not starting at 0."""
    tree = ast.parse((path / "data_loader.py").read_text())
    widths = {n.upper.value - n.lower.value for n in ast.walk(tree) if isinstance(n, ast.Slice)
              and isinstance(n.lower, ast.Constant) and isinstance(n.upper, ast.Constant) and n.lower.value}
    (width,) = widths
    assert width == VAL_PER_CLASS
    return width


class CudaToCpu(TorchFunctionMode):
    """The code builds tensors with ``device='cuda'`` (match_weight); on this CPU they go to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


@contextlib.contextmanager
def patched(module, **attrs):
    saved = {k: getattr(module, k) for k in attrs}
    for k, v in attrs.items():
        setattr(module, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(module, k, v)


def made_up_counts(seed: int = 0):
    """(EPOCHS, 2, 10) correct counts out of VAL_PER_CLASS (clean, then PGD-20): classes 2-5 lag, class 3
    most (its margin grows to the clamp); noise moves classes across the average."""
    rng = np.random.default_rng(seed)
    clean = np.array([0.88, 0.93, 0.70, 0.62, 0.75, 0.72, 0.87, 0.88, 0.92, 0.90])
    robust = np.array([0.58, 0.68, 0.34, 0.12, 0.30, 0.38, 0.52, 0.56, 0.64, 0.60])
    out = []
    for e in range(EPOCHS):
        drift = 0.002 * e  # training helps a little
        c = np.clip(clean + drift + rng.normal(0, 0.03, 10), 0, 1)
        r = np.minimum(np.clip(robust + drift + rng.normal(0, 0.03, 10), 0, 1), c)
        out.append(np.round(np.stack([c, r]) * VAL_PER_CLASS))
    return np.array(out, dtype=np.int64)


def run_updates(mod, s: dict, counts):
    """The code's frl_train, its evaluate and train_model replaced by the made-up validation and a recorder
    of the weights it would train with; the rate1 halving of the scripts' epoch loop around it."""
    lams, diffs = [], []
    epoch = {"i": 0}

    def evaluate(h_net, ds_valid, configs, device, mode="Test"):
        c, r = counts[epoch["i"]]
        acc, acc_adv = torch.zeros(10), torch.zeros(10)  # the code's in_class: float32 per-class accuracy
        for i in range(10):
            acc[i], acc_adv[i] = c[i] / VAL_PER_CLASS, r[i] / VAL_PER_CLASS
        n = 10 * VAL_PER_CLASS
        return 1 - acc, acc - acc_adv, 1 - c.sum() / n, c.sum() / n - r.sum() / n

    def train_model(model, train_loader, optimizer, diff0, diff1, diff2, epoch_, beta, configs, device):
        diffs.append(torch.stack([diff0, diff1, diff2]).numpy())

    a = s["args"]
    rate1 = a["rate1"]
    lmbda = torch.zeros(30)
    delta0, delta1 = a["bound0"] * torch.ones(10), a["bound1"] * torch.ones(10)
    with patched(mod, evaluate=evaluate, train_model=train_model):
        for now_epoch in range(1, EPOCHS + 1):
            if now_epoch % 40 == 0:  # the scripts' main loop
                rate1 = rate1 / 2
            epoch["i"] = now_epoch - 1
            lmbda = mod.frl_train(None, None, None, None, now_epoch, s["configs"], s["configs1"], "cpu",
                                  delta0, delta1, rate1, a["rate2"], lmbda, a["beta"], a["lim"])
            lams.append(lmbda.numpy().copy())
    return np.array(lams), np.array(diffs)


class Grads:
    """Stands in for the optimiser: records the gradients ``train_model`` computed, steps nothing."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        self.grads = torch.cat([p.grad.flatten().clone() for p in self.params])


def run_step(mod, s: dict, inp, diffs):
    """The code's train_model on BATCH with the class weights ``diffs``: its attack iterates and
    gradients, the loss value (recorded at backward) and the weight gradient."""
    idx = batch(inp)
    xb, yb = inp.x[idx], inp.y[idx]
    model = inp.model("train")
    rec, opt, losses = Recorder(model), Grads(model.parameters()), []
    backward = torch.Tensor.backward

    def recording_backward(self, *args, **kw):
        losses.append(self.detach().clone())
        return backward(self, *args, **kw)

    torch.manual_seed(1)
    with CudaToCpu(), patched(torch.Tensor, backward=recording_backward):
        w0, w1, w2 = mod.match_weight(yb, *[torch.from_numpy(d) for d in diffs])
        mod.train_model(rec, [(xb, yb)], opt, *[torch.from_numpy(d) for d in diffs], 0, s["args"]["beta"],
                        s["configs"], "cpu")
    its, grads = rec.iterates, rec.grads
    x_adv = rec.inputs[-2]  # train_model's forwards: data, x_adv, data
    eps = (s["configs"]["epsilon"] * w2).view(-1, 1, 1, 1)  # the code's new_eps
    step = eps.max() / 4 if mod.__name__ == "utils_frl2" else torch.tensor(s["configs"]["step_size"])
    signs = torch.stack([g.sign() for g in grads]).to(torch.int8)
    replayed = replay(its[0], signs, xb, eps, step)
    assert all(torch.equal(a, b) for a, b in zip(replayed, its + [x_adv])), "replay differs from the code's iterates"
    scale = torch.stack([g.flatten(1).abs().amax(1) for g in grads]).view(len(grads), -1, 1, 1, 1)
    noise = torch.stack(grads).abs() <= SIGN_NOISE * scale
    noise64 = torch.stack(grads).abs() <= SIGN_NOISE * U64 / U32 * scale
    return {"start": its[0].numpy(), "signs": signs.numpy(), "noise": np.packbits(noise.numpy()),
            "noise64": np.packbits(noise64.numpy()),
            "eps": eps.flatten().numpy(), "step": step.numpy(), "loss": losses[-1].numpy(),
            "weight_grad": opt.grads.numpy(), "weights": torch.stack([w0, w1, w2]).numpy()}


def generate(path, inp):
    import utils_frl
    import utils_frl2

    mods = {"utils_frl": utils_frl, "utils_frl2": utils_frl2}
    counts = made_up_counts()
    out = {}
    for name, (modname, script, over) in VARIANTS.items():
        s = script_settings(path, script)
        s["args"].update(over)
        s["val_per_class"] = val_per_class(path)
        mod = mods[modname]
        lams, diffs = run_updates(mod, s, counts)
        arrays = {"counts": counts, "lams": lams, "diffs": diffs}
        arrays.update(run_step(mod, s, inp, diffs[LOSS_EPOCH]))
        if name != "frl-rw":  # the batch misses the class whose margin is the largest: the step is the batch's max
            assert float(arrays["eps"].max()) < 8 / 255 * float(diffs[LOSS_EPOCH][2].max()) - 1e-6
        meta = {"file": f"{modname}.py + {script}", "function": "frl_train / train_model", "settings": s,
                "overrides": over,
                "sources": {"attack": {"file": f"{modname}.py", "function": "trades_adv"},
                            "loss": {"file": f"{modname}.py", "function": "train_model"},
                            "update": {"file": f"{modname}.py + {script}",
                                       "function": "frl_train (normalize_lambda, cost_sensitive; rate1 halving)"},
                            "defaults": {"file": script, "function": "argparse defaults, SGD, MultiStepLR, configs"}},
                "iterates": "start = x_0 (x + 0.001 N(0, I), recorded), signs = sign of the code's gradient at each "
                            "step; conformance_frl.replay rebuilds the code's iterates from them bit for bit "
                            "(checked when generated)"}
        out[name] = (arrays, meta)
    return out
