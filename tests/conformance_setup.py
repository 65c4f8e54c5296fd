"""The training setup each code-following preset copies from its authors' code (issue 25, Build item 2, last
bullet): the learning rate of every epoch, the training hyper-parameters (batch, last partial batch, SGD,
epochs, attack, augmentation, where the input is normalised), the validation split and the checkpoint rule.

The golden values (``tests/golden/setup_*.npz|json``, one generator per repository: ``gen_setup_*.py``) come
from running the code's own schedule, argparse defaults, optimiser, loader, transform and checkpoint statements
(taken from the scripts' syntax trees where they are scripts). fastfair's side is driven through its real code:
the learning rates come from the schedule a real :class:`Trainer` builds, read as ``Trainer.run_epoch`` reads
it (a real 3-epoch run checks that reading); the kept checkpoint from
``Trainer._keep_best`` fed the same made-up validation results; drop_last from the real training loader.

Presets are read from this checkout: ``conftest`` puts its ``fastfair.presets`` finder first (``make.py doc``
does not load conftest, so it is imported here, before any preset is read).
"""
from __future__ import annotations

import ast
import functools
import importlib
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

import conftest  # noqa: F401  (this checkout's presets, also under make.py doc)
from conformance import (Check, case, differs, exact, golden)

_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# every run folder and checkpoint these checks write, removed when the process ends
_TMP = tempfile.TemporaryDirectory(prefix="fastfair-setup-")


def scratch(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=_TMP.name)


def own_presets() -> None:
    """``fastfair.presets`` must be this checkout's ``configs/`` (an editable install may have loaded another's)."""
    mod = sys.modules.get("fastfair.presets")
    if mod is not None and Path(mod.__file__).resolve().parent != _CONFIGS:
        del sys.modules["fastfair.presets"]
    importlib.invalidate_caches()
    import fastfair.presets as presets

    assert Path(presets.__file__).resolve().parent == _CONFIGS, presets.__file__


own_presets()


# -- what the generators share ----------------------------------------------------------------------------------

def statements(body, *sources):
    """The statements of ``body`` whose source starts with one of ``sources`` (each exactly once), compiled."""
    nodes = [n for n in body if any(ast.unparse(n).startswith(s) for s in sources)]
    assert len(nodes) == len(sources), [ast.unparse(n)[:50] for n in nodes]
    return compile(ast.Module(body=nodes, type_ignores=[]), "<authors' statements>", "exec")


def parse_args(body, argv, namespace=None):
    """Run a script's top-level argparse statements (``parser = ...``, ``parser.add_argument(...)``,
    ``args = parser.parse_args()``; any parser variable name) with ``argv``: the code's own defaults."""
    nodes = [n for n in body if "argparse.ArgumentParser" in ast.unparse(n) or ".add_argument(" in ast.unparse(n)
             or ".parse_args()" in ast.unparse(n)]
    ns = dict(namespace or {})
    import argparse

    ns["argparse"] = argparse
    saved = sys.argv
    sys.argv = ["script.py", *argv]
    try:
        exec(compile(ast.Module(body=nodes, type_ignores=[]), "<argparse>", "exec"), ns)
    finally:
        sys.argv = saved
    return ns["args"]


def loader_facts(loader) -> dict:
    return {"batch_size": int(loader.batch_size), "drop_last": bool(loader.drop_last)}


def transform_facts(transform) -> dict:
    """Crop padding, its fill and the flip of a torchvision training transform."""
    from torchvision import transforms

    crop = [t for t in transform.transforms if isinstance(t, transforms.RandomCrop)]
    flip = [t for t in transform.transforms if isinstance(t, transforms.RandomHorizontalFlip)]
    normalize = [t for t in transform.transforms if isinstance(t, transforms.Normalize)]
    assert not normalize, "a Normalize in the loader: not handled"
    pad = crop[0].padding if crop else 0
    return {"crop_padding": int(pad if isinstance(pad, int) else pad[0]),
            "crop_mode": {"constant": "zeros"}.get(crop[0].padding_mode, crop[0].padding_mode) if crop else "zeros",
            "flip": bool(flip) and flip[0].p == 0.5}


def optimiser_facts(opt) -> dict:
    d = opt.defaults
    return {"lr": float(d["lr"]), "momentum": float(d["momentum"]), "weight_decay": float(d["weight_decay"]),
            "nesterov": bool(d["nesterov"])}


def first_conv_input(model, x) -> torch.Tensor:
    """What the model's first convolution reads when the model is given ``x`` (is the input normalised?)."""
    seen = []
    conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
    handle = conv.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        model.eval()(x)
    handle.remove()
    return seen[0]


def normalisation(model, x, before=lambda t: t) -> str:
    """'none' if the first convolution reads the [0, 1] pixels, else 'mean/std' (``before`` is the code's
    own transform in front of the model, e.g. CFA's normalize_cifar)."""
    return "none" if torch.equal(first_conv_input(model, before(x)), x) else "mean/std"


class Saved:
    """Stands for ``torch`` in a checkpoint block: ``save`` records the file name instead of writing."""

    def __init__(self):
        self.files = []

    def save(self, obj, name, *a, **k):
        self.files.append(str(name))

    def __getattr__(self, name):
        return getattr(torch, name)


def fake_cifar10(labels: np.ndarray):
    """A torchvision.datasets.CIFAR10 stand-in: image i is one pixel holding i (base 256), the given labels."""
    idx = np.arange(len(labels))
    data = np.stack([idx % 256, (idx // 256) % 256, idx // 65536], 1).astype(np.uint8).reshape(-1, 1, 1, 3)

    class CIFAR10:
        def __init__(self, root, train=True, download=False, transform=None, **_):
            self.data = data if train else data[:100]
            self.targets = list(labels) if train else list(labels[:100])
            self.transform = transform

        def __len__(self):
            return len(self.targets)

    return CIFAR10


def image_index(data: np.ndarray) -> np.ndarray:
    d = data.reshape(len(data), 3).astype(np.int64)
    return d[:, 0] + 256 * d[:, 1] + 65536 * d[:, 2]


def split_record(train, valid) -> np.ndarray:
    """The validation images of a code's (train, valid) loaders over :func:`fake_cifar10`, as uint16 indices
    (the other images all train: checked)."""
    val, tr = image_index(valid.dataset.data), image_index(train.dataset.data)
    assert len(np.intersect1d(val, tr)) == 0 and len(val) + len(tr) == 50_000
    return val.astype(np.uint16)


def made_up_labels(seed: int = 5) -> np.ndarray:
    """50,000 labels, 5,000 of each class (as CIFAR-10's training set), in a made-up order."""
    g = np.random.default_rng(seed)
    return g.permutation(np.repeat(np.arange(10), 5000)).astype(np.int64)


def made_up_results(epochs: int, seed: int, peak: int | None = None) -> np.ndarray:
    """(epochs, 10) per-class robust accuracies in [0, 1] rising over training, with noise; ``peak``: an early
    epoch made the best of all by far (tells a rule that skips early epochs from one that does not)."""
    g = np.random.default_rng(seed)
    trend = 0.2 + 0.3 * np.arange(epochs)[:, None] / max(epochs - 1, 1)
    acc = np.clip(trend + g.uniform(-0.08, 0.08, (epochs, 10)), 0.01, 0.99)
    if peak is not None:
        acc[peak] = np.clip(acc[peak] + 0.4, 0, 0.99)
    return acc


# -- fastfair's side ---------------------------------------------------------------------------------------------

# A Trainer on scikit-learn's digits with a tiny CNN: what it builds from train.* is the preset's own
CHEAP = ["data.dataset=digits", "data.data_dir=", "model.name=tiny-cnn", "model.width=8", "train.device=cpu",
         "train.compile=off", "train.progress=false", "train.init_from=", "data.val_per_class=5",
         "data.loader=device", "train.amp=off", "train.kernels=torch", "train.track=none", "data.classes=[]",
         "data.train_per_class=0", "data.test_per_class=0", "data.batch_size=16"]


def resolve(name: str, *sets: str):
    """A preset's config, or ``grid:NAME/RUN`` (a run of a shipped grid), with ``sets`` applied."""
    from fastfair import config
    from fastfair.scaleout import grid

    own_presets()
    if not name.startswith("grid:"):
        return config.resolve(name, None, list(sets))
    gname, _, run = name[5:].partition("/")
    g, _ = grid.load(gname)
    (r,) = [r for r in g.runs() if r.name == run]
    args = [f"{k}={grid.toml_value(v)}" for k, v in r.sets.items()]
    return config.resolve(g.base or None, None, args + list(sets))


def grid_runs(gname: str) -> list[str]:
    from fastfair.scaleout import grid

    own_presets()
    g, _ = grid.load(gname)
    return [f"grid:{gname}/{r.name}" for r in g.runs()]


@functools.cache
def start_checkpoint() -> str:
    """A CHEAP model's checkpoint, for the presets that fine-tune (train.init_from: FRL, FAAL)."""
    from fastfair.rundir import save_atomic
    from fastfair.training.trainer import Trainer

    t = Trainer(resolve("demo", *CHEAP), scratch("run-"), quiet=True)
    path = Path(t.out) / "start.pt"
    save_atomic(t._state(0), path)
    return str(path)


def cheap(name: str, *sets: str):
    """``name``'s config on CHEAP data and model (a fine-tune starts from :func:`start_checkpoint`)."""
    return resolve(name, *CHEAP, f"train.init_from={start_checkpoint()}", *sets)


def trainer(name: str, *sets: str):
    from fastfair.training.trainer import Trainer

    return Trainer(cheap(name, *sets), scratch("run-"), quiet=True)


def lr_per_epoch(name: str) -> list[float]:
    """The lr of each epoch (0-based index) as a run of ``name`` trains it (:func:`lr_per_epoch_cfg`)."""
    return lr_per_epoch_cfg(cheap(name))


def fastfair_facts(name: str) -> dict:
    """The training setup a preset gives, in the generators' terms."""
    from fastfair import build

    cfg = resolve(name)
    t = trainer(name, f"data.batch_size={cfg.data.batch_size}")
    # drop_last as the real training loader does it: one image more than a batch gives one batch or two
    x, y = t.bundle.x_train[: cfg.data.batch_size + 1], t.bundle.y_train[: cfg.data.batch_size + 1]
    loader = build.train_loader(t.cfg, (x, y), torch.device("cpu"), False)
    a = cfg.attack
    return {"batch_size": cfg.data.batch_size, "drop_last": len(loader) == 1, "epochs": cfg.train.epochs,
            "lr": cfg.train.lr, "momentum": t.opt.defaults["momentum"], "weight_decay": t.opt.defaults["weight_decay"],
            "nesterov": t.opt.defaults["nesterov"], "eps": a.eps, "alpha": a.alpha, "steps": a.steps,
            "crop_padding": cfg.data.crop_padding, "crop_mode": cfg.data.crop_mode, "flip": cfg.data.flip,
            # fastfair's models normalise inside by the training images' mean and std (models/base.py)
            "normalise": "mean/std"}


def kept_epoch(name: str, results: np.ndarray, *sets: str) -> int:
    """The epoch (0-based) whose model ``train.select`` evaluates, when validation gives ``results`` (epochs x
    classes, in [0, 1]) each epoch: Trainer._keep_best on them, as each epoch's end calls it."""
    from fastfair.evaluation.measures import summary
    from fastfair.rundir import RunDir, load_checkpoint
    from fastfair.training.trainer import Trainer

    cfg = resolve(name, *sets)
    if cfg.train.select == "last":
        return len(results) - 1
    out = Path(scratch("select-"))
    run = RunDir(out)
    run.checkpoints.mkdir(parents=True)
    # no run id: the checkpoints are written as an older fastfair's run writes them
    fake = SimpleNamespace(cfg=cfg, best={}, spec={}, run=run, _identity=lambda key=None: {})
    model = torch.nn.Linear(1, 1)
    for epoch, per_class in enumerate(results):
        Trainer._keep_best(fake, model, epoch, summary((100 * per_class).tolist()))
    return load_checkpoint(run.best(cfg.train.select))["epoch"] - 1


# -- the comparisons ---------------------------------------------------------------------------------------------

def lr_check(label: str, g, presets: list[str]) -> Check:
    theirs = g.t("lr", torch.float64).tolist()
    bad, detail = 0, []
    for p in presets:
        ours = lr_per_epoch(p)
        if len(ours) != len(theirs):
            bad += max(len(ours), len(theirs))
            detail.append(f"{p}: {len(ours)} epochs")
            continue
        wrong = [e + 1 for e, (a, b) in enumerate(zip(ours, theirs)) if abs(a - b) > 1e-9 * b]
        bad += len(wrong)
        if wrong:
            detail.append(f"{p}: epochs {wrong[:3]}")
    return Check(label, f"lr of every epoch ({len(theirs)} epochs, {len(presets)} configs)", g.ref("lr"),
                 float(bad), exact("epochs counted (a rate within 1e-9 of the code's float64 one: a match)"),
                 "epochs differing", "; ".join(detail))


def facts_check(label: str, g, presets: list[str], deliberate: dict[str, str]) -> Check:
    """The code's setup against each preset's; keys in ``deliberate`` are recorded differences (not counted)."""
    theirs = g.meta["setup"]
    bad, detail, known = 0, [], set()
    for p in presets:
        ours = fastfair_facts(p)
        for k, v in theirs.items():
            same = abs(ours[k] - v) <= 1e-12 if isinstance(v, float) else ours[k] == v
            if k in deliberate and same:  # a recorded difference that no longer holds: the record is stale
                bad += 1
                detail.append(f"{p}: {k} now as the code's (recorded as differing)")
            elif k in deliberate:
                known.add(k)
            elif not same:
                bad += 1
                detail.append(f"{p}: {k} {ours[k]!r} (code {v!r})")
    detail += [f"recorded: {', '.join(sorted(known))}"] if known else []
    return Check(label, f"training setup: {', '.join(theirs)} ({len(presets)} configs)", g.ref("setup"), float(bad),
                 exact("settings compared as written"), "values differing", "; ".join(detail))


def selection_check(label: str, g, presets: list[str], *sets: str) -> Check:
    results, code = g.t("select.results", torch.float64).numpy(), int(g.arrays["select.kept"])
    wrong = [p for p in presets if kept_epoch(p, results, *sets) != code]
    return Check(label, f"epoch kept by the checkpoint rule ({len(results)} made-up epochs, {len(presets)} configs)",
                 g.ref("select"), float(len(wrong)), exact("an epoch chosen from the same float64 results"),
                 "configs differing", ", ".join(wrong))


def split_check(label: str, g, presets: list[str]) -> Check:
    """Images per class on each side of the code's split against fastfair's data.split (each preset's
    data.val_per_class) on the same made-up labels; the detail says how many validation images are the same."""
    from fastfair.data.datasets import DataBundle, split

    labels = torch.from_numpy(made_up_labels())
    val = torch.from_numpy(g.arrays["split.val"].astype(np.int64))
    is_val = torch.zeros(len(labels), dtype=torch.bool)
    is_val[val] = True
    theirs = [torch.bincount(labels[is_val], minlength=10), torch.bincount(labels[~is_val], minlength=10)]
    bundle = DataBundle("made-up", torch.arange(len(labels)), labels, torch.arange(10), torch.arange(10),
                        [str(k) for k in range(10)])
    diff, same = 0, set()
    for p in presets:
        parts = split(bundle, resolve(p).data.val_per_class)
        ours = [torch.bincount(parts[s][1], minlength=10) for s in ("val", "train")]
        diff += sum(int((a != b).sum()) for a, b in zip(ours, theirs))
        same.add(int(is_val[parts["val"][0]].sum()))
    return Check(label, f"validation split: images per class on each side (made-up labels, 50,000 images, "
                 f"{len(presets)} configs)", g.ref("split"), float(diff), exact("counts of images"),
                 "class counts differing",
                 f"validation images in common: {', '.join(map(str, sorted(same)))} of {len(val)} (recorded)")


def lr_per_epoch_cfg(cfg) -> list[float]:
    """The rate the real Trainer sets for the first step of each epoch (Trainer.rate, as Trainer.run_epoch reads
    it)."""
    from fastfair.training.trainer import Trainer

    t = Trainer(cfg, scratch("run-"), quiet=True)
    steps = len(t.train_loader)
    return [t.rate(epoch, 1 / steps) for epoch in range(cfg.train.epochs)]


def run_epoch_order() -> Check:
    """The lr a real run records each epoch (metrics.jsonl, written by run_epoch) against lr_per_epoch's reading."""
    import json

    sets = ["train.epochs=3", "train.lr_milestones=[1, 2]", "attack.steps=1", "train.val_attack=pgd1",
            "data.train_per_class=4", "data.val_per_class=1"]
    from fastfair.training.trainer import Trainer

    t = Trainer(resolve("demo", *CHEAP, *sets), scratch("run-"), quiet=True)
    t.fit()
    recorded = [json.loads(line)["lr"] for line in t.run.metrics.read_text().splitlines()]
    stepped = lr_per_epoch_cfg(t.cfg)
    return Check("setup: fastfair's trainer", "lr recorded by Trainer.run_epoch = the rate of each epoch's first "
                 "step (3 epochs, milestones 1, 2)", "fastfair/training/trainer.py::Trainer.run_epoch",
                 max(abs(a - b) for a, b in zip(recorded, stepped)) + abs(len(recorded) - len(stepped)),
                 exact("the same float64 rate, read twice"))


@case("setup-order", arithmetic=False)
def order():
    return [run_epoch_order()]


# -- the repositories --------------------------------------------------------------------------------------------

CFA_CODE = ["cfa-t1-at-cfa-code", "cfa-t1-at-ema-code", "cfa-t1-fat-cfa-code", "cfa-t1-fat-ema-code",
            "cfa-t1-trades-cfa-code", "cfa-t1-trades-ema-code", "cfa-t1-trades-code", "cfa-t2-fat-ccm-code",
            "cfa-t2-trades-ccm-ccr-code", "cfa-t2-trades-ccm-code", "cfa-t3-at-fawa-code", "cfa-t3-fat-fawa-code",
            "cfa-t3-trades-fawa-code"]
FRL_CODE = ["cfa-t1-frl", "cfa-t1-frl-ema"]
DAFA_CODE = ["dafa-t1-trades", "dafa-t1-trades-dafa", "dafa-t1-trades-wat"]
TRIX_CODE = ["trix-rebuttal-t1-trades", "trix-rebuttal-t1-trades-dafa", "trix-rebuttal-t1-trades-trix",
             "trix-rebuttal-t1-trades-wat"]

# Recorded differences shared by every repository below (each repository's check counts them apart)
LAST_BATCH = ("the code keeps the last partial batch of each epoch; fastfair's training loaders drop it (one fixed "
              "batch shape for torch.compile and CUDA graphs; at most batch_size - 1 images of an epoch unseen)")
RAW_PIXELS = ("the code's model reads [0, 1] pixels; fastfair's models normalise inside by the training images' "
              "mean and std (models/base.py Classifier; no key)")
ON_TEST = "the code picks its checkpoint on the test set; fastfair on its validation split (never the test set)"

differs("setup: all code presets", LAST_BATCH, "(no key)")


def configs(*names: str) -> list[str]:
    out = []
    for n in names:
        out += grid_runs(n[5:]) if n.startswith("grid:") and "/" not in n else [n]
    return out


@case("setup-cfa", arithmetic=False)
def cfa():
    g = golden("setup_cfa")
    label = "setup: CFA code presets"
    return [lr_check(label, g, CFA_CODE),
            facts_check(label, g, CFA_CODE, {"drop_last": LAST_BATCH}),
            selection_check(label, g, CFA_CODE)]


differs("setup: CFA code presets", ON_TEST + "; the code saves every model within 0.02 of the best so far and "
        "the last 5, fastfair the best alone", "train.select")


@case("setup-dafa", arithmetic=False)
def dafa():
    g = golden("setup_dafa")
    label = "setup: DAFA code presets"
    every = configs(*DAFA_CODE, "grid:dafa-code-lambda")
    return [lr_check(label, g, every),
            facts_check(label, g, every, {"drop_last": LAST_BATCH, "normalise": RAW_PIXELS}),
            selection_check(label, g, every)]


differs("setup: DAFA code presets", RAW_PIXELS, "(no key)")
differs("setup: DAFA code presets", "the code trains on all 50,000 images; fastfair holds out data.val_per_class "
        "per class for its per-epoch validation (the kept checkpoint is the last epoch's, as the code's)",
        "data.val_per_class")


@case("setup-trix", arithmetic=False)
def trix():
    g = golden("setup_trix")
    label = "setup: TRIX code presets"
    every = configs(*TRIX_CODE, "grid:trix-code-trades-trix", "grid:trix-code-components")
    code_rule = configs("grid:trix-code-trades-trix", "grid:trix-code-components")
    return [lr_check(label, g, every),
            facts_check(label, g, every, {"drop_last": LAST_BATCH, "normalise": RAW_PIXELS}),
            selection_check(label + " (grids)", g, code_rule)]


differs("setup: TRIX code presets", RAW_PIXELS, "(no key)")
differs("setup: TRIX code presets", "trix-rebuttal-t1-*: the best worst-class checkpoint on the validation split "
        "(the rebuttal's Table 1 rule); the code evaluates its last epoch (scripts/evaluation.sh, epoch 150), as "
        "the trix-code-* grids do", "train.select")
differs("setup: TRIX code presets", "the code trains on all 50,000 images; fastfair holds out data.val_per_class "
        "per class for its per-epoch validation", "data.val_per_class")


@case("setup-frl", arithmetic=False)
def frl():
    g = golden("setup_frl")
    label = "setup: FRL code presets"
    return [lr_check(label, g, FRL_CODE),
            facts_check(label, g, FRL_CODE, {"drop_last": LAST_BATCH, "normalise": FRL_PIXELS}),
            split_check(label, g, FRL_CODE)]


FRL_PIXELS = ("frlrmrw.py fine-tunes its PreActResNet18 on [0, 1] pixels; fastfair fine-tunes a fastfair model "
              "(train.init_from), which normalises inside and keeps its start model's mean and std")
differs("setup: FRL code presets", FRL_PIXELS, "train.init_from")


@case("setup-wat", arithmetic=False)
def wat():
    g = golden("setup_wat")
    label = "setup: WAT code grids"
    every = configs("grid:wat-code-eta", "grid:wat-code-trades-wat")
    return [lr_check(label, g, every),
            facts_check(label, g, every, {"drop_last": LAST_BATCH, "normalise": RAW_PIXELS}),
            split_check(label, g, every)]


differs("setup: WAT code grids", RAW_PIXELS, "(no key)")
differs("setup: WAT code grids", "validation split: the code takes each class's last 300 training images "
        "(data_loader.py), fastfair its first data.val_per_class (300); the same sizes, other images",
        "data.val_per_class")
differs("setup: WAT code grids", "the code saves every third epoch (3, ..., 99) and logs test accuracy each epoch "
        "without choosing one; fastfair evaluates the last epoch (100)", "train.select")


@case("setup-faal", arithmetic=False)
def faal():
    g = golden("setup_faal")
    label = "setup: FAAL code grid"
    every = configs("grid:faal-code-prn")
    return [lr_check(label, g, every),
            facts_check(label, g, every, {"drop_last": LAST_BATCH}),
            selection_check(label, g, every)]


differs("setup: FAAL code grid", "the code picks its checkpoint on the test set's first 20 batches; fastfair on its "
        "validation split (never the test set)", "train.select")
differs("setup: FAAL code grid", "equal scores: the code keeps the later epoch (`>=`); fastfair's worst policy the "
        "better average, then the earlier epoch (untested: the made-up results have no ties)", "train.select")


@case("setup-he", arithmetic=False)
def he():
    """tian-iclr-t5-he says it follows Pang et al.'s PGD-HE code for s and m (and nothing else)."""
    g = golden("setup_he")
    cfg = resolve("tian-iclr-t5-he")
    ours = {"s": cfg.model.head_scale, "m": cfg.sections["he"].margin}
    return [Check("setup: tian-iclr-t5-he", "HE scale s and margin m (the README's PGD-AT + HE command)", g.ref("he"),
                  max(abs(ours[k] - g.meta["he"][k]) for k in ours), exact("settings as written"))]
