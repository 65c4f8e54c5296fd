"""The robust and non-robust data sets of Ilyas et al. (NeurIPS 2019, "Adversarial examples are not bugs, they are
features", Sec. 3), built from a fastfair run, as the ``.npz`` fastfair trains on (``--dataset npz``).

* ``robust`` (D_R, Sec. 3.1) and ``non-robust`` (D_NR, Sec. 3.1): every training image x is replaced by the x_r
  that minimises ||g(x_r) - g(x)||_2, g the model's penultimate representation, found by L2 normalised-gradient
  descent from another training image x0 drawn at random; the label stays y. D_R takes an adversarially trained
  model, D_NR a standard one.
* ``det`` (D_det) and ``rand`` (D_rand, Sec. 3.2): every training image is moved by a targeted L2 PGD on a standard
  model, x' = argmin_{||x' - x||_2 <= eps} CE(f(x'), t), and labelled t: t = (y + 1) mod C for D_det, t drawn
  uniformly from the C classes (y included, so t carries no information about y) for D_rand.

Default settings, as recalled from Ilyas et al., App. C (its text could not be read here, so they are not checked
against it; each is a flag): step 0.1 and 1000 steps for D_R/D_NR (no ball around x0; only [0, 1]); eps 0.5, step 0.1
and 100 steps for D_det/D_rand. The test split is the
data set's original test set, on which Ilyas et al. evaluate.

Storage (fastfair's choice; Ilyas et al. keep float tensors): fastfair's data sets are uint8, so each pixel is
rounded to the nearest 1/255. For D_det/D_rand the attack ends on the eps sphere, and rounding pushes most images just
outside it; there the fewest pixels needed are rounded towards the source instead (:func:`quantise`), so every stored
image lies within eps. The fraction of images the source model assigns to their new label, before and after
rounding, is measured and recorded (``features_params``).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fastfair import build
from fastfair.attacks.l2 import l2_descend
from fastfair.config import load_saved_text
from fastfair.errors import UserError
from fastfair.evaluation.per_class import weights_sha256
from fastfair.progress import Progress
from fastfair.registry import Registry
from fastfair.rundir import write_npz_atomic

PAPER = "Ilyas et al., NeurIPS 2019, Sec. 3"


@dataclass(frozen=True)
class Kind:
    """One of Ilyas et al.'s data sets: its name there, how it is built, and its default settings (as recalled from
    App. C)."""

    symbol: str  # D_R, D_NR, D_det, D_rand
    robust_source: bool  # built from an adversarially trained model (D_R) or a standard one
    target: str  # "" keeps y (representation inversion); "det" or "rand": the targeted attack's label
    steps: int
    step_size: float
    eps: float  # math.inf: no ball, only [0, 1]


KINDS: Registry[Kind] = Registry("feature data set")
KINDS.register("robust", "D_R (Ilyas et al. 2019, Sec. 3.1): images matching an adversarially trained model's "
                         "representation of each training image, from another image, label y")(
    Kind("D_R", True, "", 1000, 0.1, math.inf))
KINDS.register("non-robust", "D_NR (Ilyas et al. 2019, Sec. 3.1): the same inversion through a standard model")(
    Kind("D_NR", False, "", 1000, 0.1, math.inf))
KINDS.register("det", "D_det (Ilyas et al. 2019, Sec. 3.2): targeted L2 PGD on a standard model to t = y+1 mod C, "
                      "labelled t")(Kind("D_det", False, "det", 100, 0.1, 0.5))
KINDS.register("rand", "D_rand (Ilyas et al. 2019, Sec. 3.2): targeted L2 PGD on a standard model to a uniformly "
                       "drawn t, labelled t")(Kind("D_rand", False, "rand", 100, 0.1, 0.5))

QUANT = 1.0 / 255.0  # the grid of a stored uint8 image


def representation_distance(model, x: torch.Tensor, target_rep: torch.Tensor) -> torch.Tensor:
    """||g(x) - g(x_target)||_2 per image, g the penultimate representation (Ilyas et al. 2019, Sec. 3.1)."""
    return (model.forward_features(x) - target_rep).flatten(1).norm(dim=1)


def invert(model, x: torch.Tensor, start: torch.Tensor, *, steps: int, step_size: float) -> torch.Tensor:
    """x_r = argmin ||g(x_r) - g(x)||_2 from ``start`` by L2 normalised-gradient descent in [0, 1] (Ilyas et al. 2019,
    Sec. 3.1, D_R / D_NR); ``model`` in eval mode."""
    with torch.no_grad():
        rep = model.forward_features(x)
    return l2_descend(model, lambda z: representation_distance(model, z, rep), start, start, eps=math.inf,
                      step_size=step_size, steps=steps)[0]


def targeted(model, x: torch.Tensor, t: torch.Tensor, *, eps: float, steps: int, step_size: float) -> torch.Tensor:
    """x' = argmin_{||x' - x||_2 <= eps} CE(f(x'), t) by L2 PGD (Ilyas et al. 2019, Sec. 3.2, D_det / D_rand)."""
    return l2_descend(model, lambda z: F.cross_entropy(model(z), t, reduction="none"), x, x, eps=eps,
                      step_size=step_size, steps=steps)[0]


def quantise(x: torch.Tensor, source: torch.Tensor | None = None, eps: float = math.inf) -> torch.Tensor:
    """Images in [0, 1] as uint8, each pixel rounded to the nearest 1/255 (fastfair's storage rule). With ``source``
    (uint8-valued, in [0, 1]), where that rounding leaves the ``eps`` L2 ball around it, the fewest pixels that bring
    the image back inside are rounded towards ``source`` instead: those whose rounding away added the most."""
    nearest = torch.round(x * 255)
    if source is None or math.isinf(eps):
        return nearest.to(torch.uint8)
    s = torch.round(source * 255)
    away = (nearest - s).flatten(1).to(torch.int64)  # the perturbation in steps of 1/255: integers, summed exactly
    toward = torch.trunc(x * 255 - s).flatten(1).to(torch.int64)  # never longer than the float perturbation
    excess = away.square().sum(1, keepdim=True) - (eps * 255) ** 2  # > 0: outside the ball
    saving, order = (away.square() - toward.square()).sort(dim=1, descending=True)
    # switch pixels in that order while the ones before them have not yet covered the excess; switching all of them
    # gives ``toward``, inside the ball, so the switched prefix always ends inside it
    switch = torch.zeros_like(away, dtype=torch.bool).scatter_(1, order, (saving.cumsum(1) - saving) < excess)
    stored = s.flatten(1) + torch.where(switch, toward, away)
    return stored.view_as(x).to(torch.uint8)


def first_per_class(y: np.ndarray, num_classes: int, n: int | None) -> np.ndarray:
    """Indices of the first ``n`` images of each class, in file order (all images for ``None``)."""
    if n is None:
        return np.arange(len(y))
    return np.sort(np.concatenate([np.flatnonzero(y == c)[:n] for c in range(num_classes)]))


def check(kind: str, out: Path, *, steps: int | None, step_size: float | None, eps: float | None,
          per_class: int | None, force: bool) -> Kind:
    """Every setting a user gives, checked before the model loads; returns the kind."""
    k = KINDS.get(kind)
    if out.suffix != ".npz":
        raise UserError(f"--out {out}: the data set is written as an .npz (np.savez adds .npz to any other name)")
    if out.exists() and not force:
        raise UserError(f"--out {out} exists; add --force to replace it, or name another file")
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; name the .npz file to write")
    if steps is not None and steps < 1:
        raise UserError(f"--steps takes the number of descent steps, 1 or more; got {steps}")
    if step_size is not None and not step_size > 0:
        raise UserError(f"--step-size takes a positive L2 step; got {step_size}")
    if eps is not None and not k.target:
        raise UserError(f"--eps: {kind} (Ilyas et al.'s {k.symbol}) has no ball around its start, only [0, 1]; "
                        "--eps bounds the targeted attack of det and rand")
    if eps is not None and not eps > 0:
        raise UserError(f"--eps takes a positive L2 radius; got {eps}")
    if per_class is not None and per_class < 1:
        raise UserError(f"--per-class takes the number of training images of each class to build, 1 or more; got "
                        f"{per_class} (leave it out for the whole training set)")
    return k


def write_features(target, kind: str, out: str | Path, *, checkpoint: str = "auto", steps: int | None = None,
                   step_size: float | None = None, eps: float | None = None, seed: int = 0,
                   per_class: int | None = None, device: str = "auto", data_dir: str | None = None,
                   batch_size: int | None = None, force: bool = False, quiet: bool = False) -> dict:
    """Build Ilyas et al.'s data set ``kind`` from the run or checkpoint ``target`` and write it to ``out``; returns
    the recorded parameters (also in the file as ``features_params``, JSON)."""
    out = Path(out)
    k = check(kind, out, steps=steps, step_size=step_size, eps=eps, per_class=per_class, force=force)
    steps, step_size = steps or k.steps, step_size or k.step_size
    eps = k.eps if eps is None else eps
    path = build.checkpoint_path(target, checkpoint)
    ck, cfg, dev, model, bundle, _ = build.from_checkpoint(path, split="test", device_name=device, data_dir=data_dir,
                                                           batch_size=batch_size, channels_last_ok=False)
    model.eval()  # BN's running statistics: the model as evaluated, and no forward here updates them
    method = load_saved_text(ck["config"]).method.name
    prog = Progress(enabled=not quiet)
    if k.robust_source and method == "standard":
        raise UserError(f"{path} was trained by method standard; {kind} ({k.symbol}) inverts an adversarially "
                        "trained model's representation; give such a run, or build non-robust (D_NR) from this one")
    if not k.robust_source and method != "standard":
        prog.warn(f"{path} was trained by method {method}, not standard; Ilyas et al. build {k.symbol} from a "
                  "standard model")
    y_all = bundle.y_train.numpy()
    largest = int(np.bincount(y_all, minlength=bundle.num_classes).max())
    if per_class is not None and per_class >= largest:  # a cap that keeps everything would still be recorded as one
        raise UserError(f"--per-class {per_class} keeps every image: {bundle.name} has at most {largest} training "
                        f"images per class; pass fewer, or leave --per-class out for the whole training set")
    index = first_per_class(y_all, bundle.num_classes, per_class)
    n, c = len(index), bundle.num_classes
    if n < 2:
        raise UserError(f"{n} training image(s) selected; {kind} needs at least 2")
    y = y_all[index]
    rng = np.random.default_rng(seed)
    start = np.arange(n)
    if not k.target:  # x0: another training image than x, drawn uniformly
        start = (start + rng.integers(1, n, n)) % n
    label = {"": y, "det": (y + 1) % c}.get(k.target)
    if label is None:  # rand: uniform over the C classes, independent of y
        label = rng.integers(0, c, n)
    x_src = bundle.x_train[torch.from_numpy(index)]
    bs = cfg.data.eval_batch_size
    stored, float_ok, stored_ok, moved, toward = [], [], [], [], []
    with prog.task(f"{kind} ({k.symbol}) from {path.name}", math.ceil(n / bs)) as advance:
        for lo in range(0, n, bs):
            rows = slice(lo, lo + bs)
            x = x_src[rows].to(dev).float().div_(255)
            t = torch.as_tensor(label[rows], device=dev)
            if k.target:
                x_new = targeted(model, x, t, eps=eps, steps=steps, step_size=step_size)
            else:
                x0 = x_src[torch.from_numpy(start[rows])].to(dev).float().div_(255)
                x_new = invert(model, x, x0, steps=steps, step_size=step_size)
            q = quantise(x_new, x if k.target else None, eps)
            with torch.no_grad():
                if k.target:  # success: the source model assigns the new label
                    float_ok.append((model(x_new).argmax(1) == t).cpu())
                    stored_ok.append((model(q.float() / 255).argmax(1) == t).cpu())
                    moved.append((q.float() / 255 - x).flatten(1).norm(dim=1).cpu())
                    toward.append((q != quantise(x_new)).flatten(1).float().mean(1).cpu())
                else:  # how far the representation moved towards x's, relative to where it started
                    rep = model.forward_features(x)
                    d0 = representation_distance(model, x0, rep)
                    float_ok.append((representation_distance(model, x_new, rep) / d0).cpu())
                    stored_ok.append((representation_distance(model, q.float() / 255, rep) / d0).cpu())
            stored.append(q.cpu())
            advance()
    x_train = torch.cat(stored).numpy()
    measured = ({"target_rate_float": float(torch.cat(float_ok).float().mean()),
                 "target_rate_stored": float(torch.cat(stored_ok).float().mean()),
                 "perturbation_l2_max": float(torch.cat(moved).max()),
                 "pixels_rounded_toward_source": float(torch.cat(toward).mean())} if k.target else
                {"distance_ratio_float": float(torch.cat(float_ok).mean()),
                 "distance_ratio_stored": float(torch.cat(stored_ok).mean())})
    params = {"paper": PAPER, "kind": kind, "dataset": k.symbol, "source": str(path), "epoch": ck["epoch"],
              "method": method, "weights_sha256": weights_sha256(model), "data": bundle.name,
              "classes": list(bundle.classes),
              "train_sha256": _sha256(x_src.numpy(), y), "per_class": per_class, "images": n, "steps": steps,
              "step_size": step_size, "eps": None if math.isinf(eps) else eps, "target": k.target or "y",
              "seed": seed, "keep": "each image's iterate of lowest loss",
              "storage": "uint8, nearest 1/255" + (", the fewest pixels towards the source where nearest leaves "
                                                   "the eps ball" if k.target else ""),
              "test": "the original test set", **measured}
    write_npz_atomic({"x_train": x_train, "y_train": label.astype(np.int64), "x_test": bundle.x_test.numpy(),
                      "y_test": bundle.y_test.numpy(), "class_names": np.array(bundle.classes),
                      "features_index": index.astype(np.int64), "features_start": index[start].astype(np.int64),
                      "features_label": y.astype(np.int64), "features_params": json.dumps(params)},
                     out, compressed=True)
    return params


def _sha256(x: np.ndarray, y: np.ndarray) -> str:
    """SHA-256 of the source training images and labels the data set was built from, in order."""
    h = hashlib.sha256(np.ascontiguousarray(x).tobytes())
    h.update(np.ascontiguousarray(y, dtype=np.int64).tobytes())
    return h.hexdigest()
