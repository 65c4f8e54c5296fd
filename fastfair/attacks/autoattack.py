"""AutoAttack, version 'standard', per class and resumable (Croce & Hein 2020, Sec. 5).

The standard L-inf version runs APGD-CE (100 iterations, 1 restart), APGD-T (DLR-targeted loss,
9 target classes, 100 iterations), FAB-T (9 targets, 100 iterations) and Square (5000 queries,
p_init 0.8), each only on the points every earlier attack left robust, always in fp32. The
numbers come from the official package's ``set_version('standard')``; its Square also turns
the query-schedule rescaling off (``resc_schedule=False``), which torchattacks turns on by default.

Three backends build the sub-attacks. ``pyautoattack`` (the default, a declared dependency) is
Croce & Hein's official code as published on PyPI; ``autoattack`` is the same code installed from
github.com/fra31/auto-attack; ``torchattacks`` (only when asked for) has every sub-attack
configured to the standard numbers (its own ``AutoAttack`` class runs 10 iterations and is not the
standard version). Each backend reports its package version, its seed and the settings read back
from the attack objects it built, and :func:`evaluate_split` records them with the result.

After the run, :func:`recheck` predicts once more on the returned adversarial images: every
prediction must equal the recorded one and every image must lie in the eps-ball and in [0, 1]
(users of the official code reported flags that a clean pass did not reproduce,
fra31/auto-attack issue 74). A disagreement is a :class:`~fastfair.errors.UserError`, never averaged in.

Long runs resume: after every batch the per-sample flags (still robust, prediction after
attack, which sub-attacks have tried the point) and the adversarial images found so far go
atomically to an ``.npz`` next to the evaluation JSON, keyed by a fingerprint of the weights,
all images and labels, eps, seed and settings.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fastfair import display
from fastfair.attacks.pgd import attack_mode, flag_masked
from fastfair.errors import UserError
from fastfair.evaluation import measures
from fastfair.progress import BACKWARD, FORWARD, PassMeter, Ticks, hms
from fastfair.registry import Registry
from fastfair.rundir import load_npz, write_npz_atomic

NAME = "aa"  # the attack name in ``fastfair eval --attacks``
SUBATTACKS = ("apgd-ce", "apgd-t", "fab-t", "square")
# float32 rounding of x + eps can land a few ulps outside the ball; anything beyond this is a real violation
BALL_TOLERANCE = 1e-6
# Standard-version settings per sub-attack (official autoattack.py, set_version('standard'),
# and the constructor defaults it relies on). n_target_classes is min(9, C - 1).
STANDARD = {
    "apgd-ce": {"n_iter": 100, "n_restarts": 1, "loss": "ce", "eot_iter": 1, "rho": 0.75},
    "apgd-t": {"n_iter": 100, "n_restarts": 1, "n_target_classes": 9, "loss": "dlr-targeted", "eot_iter": 1,
               "rho": 0.75},
    "fab-t": {"n_iter": 100, "n_restarts": 1, "n_target_classes": 9, "alpha_max": 0.1, "eta": 1.05, "beta": 0.9},
    "square": {"n_queries": 5000, "n_restarts": 1, "p_init": 0.8, "loss": "margin", "resc_schedule": False},
}


# APGD-T's targeted DLR loss divides by z_pi1 - (z_pi3 + z_pi4) / 2, the largest logit minus the mean of the third
# and fourth (Croce & Hein 2020, targeted DLR): a model of fewer classes has no fourth logit; the official code fails
MIN_CLASSES = 4


def check_classes(num_classes: int, where: str = "") -> None:
    """A UserError, before any attack runs, for a model of fewer classes than AutoAttack's targeted attack needs."""
    if num_classes < MIN_CLASSES:
        raise UserError(f"{where}AutoAttack (aa) needs a model of at least {MIN_CLASSES} classes (its APGD-T's "
                        f"targeted DLR loss reads the 4 largest logits) and this one has {num_classes}; fastfair has "
                        "no AutoAttack without its targeted attacks, so use pgd100 and cw100 (or pgd20, cw20)")


def standard_settings(num_classes: int) -> dict[str, dict]:
    """The standard settings for a ``num_classes``-way model (fewer targets when C < 10)."""
    out = {k: dict(v) for k, v in STANDARD.items()}
    for k in ("apgd-t", "fab-t"):
        out[k]["n_target_classes"] = min(9, num_classes - 1)
    return out


def plans(settings: dict[str, dict]) -> dict[str, int]:
    """Progress units (model passes: :data:`~fastfair.progress.FORWARD`, :data:`~fastfair.progress.BACKWARD`) each
    sub-attack plans for one batch of points, from its settings as the official code runs them: APGD a forward and a
    backward per iteration, per restart and (APGD-T) per target class (autopgd_base.py); FAB-T per target class and
    iteration a forward and a backward (the gradient of the logit difference) and a forward (is the point adversarial
    yet; fab_base.py); Square a forward per query (square.py). A sub-attack that breaks every point early uses less."""
    step = FORWARD + BACKWARD
    a, t, f, s = (settings[k] for k in SUBATTACKS)
    return {"apgd-ce": a["n_restarts"] * a["n_iter"] * step,
            "apgd-t": t["n_target_classes"] * t["n_restarts"] * t["n_iter"] * step,
            "fab-t": f["n_target_classes"] * f["n_restarts"] * f["n_iter"] * (step + FORWARD),
            "square": s["n_restarts"] * s["n_queries"] * FORWARD}


def image_passes(images: int, points: int, num_classes: int) -> int:
    """Model passes times the images in each that AutoAttack plans on ``images``, ``points`` of them classified
    correctly (the clean pass finds them; the sub-attacks attack them): its work wherever a pass costs in proportion
    to its batch, for an estimate before it runs."""
    return images * FORWARD + points * sum(plans(standard_settings(num_classes)).values())


def planned_units(num_classes: int) -> int:
    """The progress units :func:`evaluate_split` plans per loader batch: the clean pass, then every sub-attack on
    every point (points the clean pass or an earlier sub-attack settles are dropped from the plan as it runs)."""
    return FORWARD + sum(plans(standard_settings(num_classes)).values())


@dataclass
class Backend:
    """Sub-attacks by name, each ``(x, y) -> x_adv``; the package version, and the seed and settings
    read back from the attack objects."""

    name: str
    attacks: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    settings: dict[str, dict]
    version: str
    seed: int


BACKENDS: Registry[Callable[[torch.nn.Module, float, int, int], Backend]] = Registry("AutoAttack backend")


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path, not installed
        return "unknown"


def _croce_hein(module: str, model, eps: float, num_classes: int, seed: int) -> Backend:
    """The official runner's sub-attacks, called as its ``run_standard_evaluation`` calls them."""
    official = importlib.import_module(module)
    dev = next(model.parameters()).device
    # keywords only: pyautoattack makes them keyword-only, the git package accepts them as keywords
    aa = official.AutoAttack(model, norm="Linf", eps=eps, version="standard", seed=seed, device=str(dev))
    n_t = min(9, num_classes - 1)
    aa.apgd_targeted.n_target_classes = n_t
    aa.fab.n_target_classes = n_t
    aa.apgd.loss = "ce"

    def fab_t(x, y):
        aa.fab.targeted = True  # the official runner sets this before every FAB-T call
        aa.fab.n_restarts = 1
        return aa.fab.perturb(x, y)

    attacks = {"apgd-ce": aa.apgd.perturb, "apgd-t": aa.apgd_targeted.perturb, "fab-t": fab_t,
               "square": aa.square.perturb}
    a, t, f, s = aa.apgd, aa.apgd_targeted, aa.fab, aa.square
    settings = {
        "apgd-ce": {"n_iter": a.n_iter, "n_restarts": a.n_restarts, "loss": a.loss, "eot_iter": a.eot_iter,
                    "rho": a.thr_decr},
        "apgd-t": {"n_iter": t.n_iter, "n_restarts": t.n_restarts, "n_target_classes": t.n_target_classes,
                   "loss": "dlr-targeted", "eot_iter": t.eot_iter, "rho": t.thr_decr},
        "fab-t": {"n_iter": f.n_iter, "n_restarts": 1, "n_target_classes": f.n_target_classes,
                  "alpha_max": f.alpha_max, "eta": f.eta, "beta": f.beta},
        "square": {"n_queries": s.n_queries, "n_restarts": s.n_restarts, "p_init": s.p_init, "loss": s.loss,
                   "resc_schedule": s.rescale_schedule},
    }
    seeds = {x.seed for x in (aa, a, t, f, s)}
    if seeds != {seed}:
        raise RuntimeError(f"{module} did not take seed {seed}: its attack objects hold {sorted(seeds)}")
    return Backend(module, attacks, settings, _version(module), aa.seed)


@BACKENDS.register("pyautoattack", "the official code by Croce & Hein from PyPI (pyautoattack, installed with "
                                   "fastfair; the default)")
def _pyautoattack(model, eps: float, num_classes: int, seed: int) -> Backend:
    return _croce_hein("pyautoattack", model, eps, num_classes, seed)


@BACKENDS.register("autoattack", "the official code from git (pip install git+https://github.com/fra31/auto-attack)")
def _official_git(model, eps: float, num_classes: int, seed: int) -> Backend:
    return _croce_hein("autoattack", model, eps, num_classes, seed)


@BACKENDS.register("torchattacks", "torchattacks 3.5 sub-attacks configured to the standard numbers")
def _torchattacks(model, eps: float, num_classes: int, seed: int) -> Backend:
    import torchattacks as ta

    std = standard_settings(num_classes)
    a, t, f, s = std["apgd-ce"], std["apgd-t"], std["fab-t"], std["square"]
    # torchattacks derives n_target_classes as n_classes - 1, so n_classes here is targets + 1.
    apgd = ta.APGD(model, norm="Linf", eps=eps, steps=a["n_iter"], n_restarts=a["n_restarts"], seed=seed,
                   loss=a["loss"], eot_iter=a["eot_iter"], rho=a["rho"])
    apgdt = ta.APGDT(model, norm="Linf", eps=eps, steps=t["n_iter"], n_restarts=t["n_restarts"], seed=seed,
                     eot_iter=t["eot_iter"], rho=t["rho"], n_classes=t["n_target_classes"] + 1)
    fab = ta.FAB(model, norm="Linf", eps=eps, steps=f["n_iter"], n_restarts=f["n_restarts"], alpha_max=f["alpha_max"],
                 eta=f["eta"], beta=f["beta"], seed=seed, multi_targeted=True, n_classes=f["n_target_classes"] + 1)
    square = ta.Square(model, norm="Linf", eps=eps, n_queries=s["n_queries"], n_restarts=s["n_restarts"],
                       p_init=s["p_init"], loss=s["loss"], resc_schedule=s["resc_schedule"], seed=seed)
    settings = {
        "apgd-ce": {"n_iter": apgd.steps, "n_restarts": apgd.n_restarts, "loss": apgd.loss,
                    "eot_iter": apgd.eot_iter, "rho": apgd.thr_decr},
        "apgd-t": {"n_iter": apgdt.steps, "n_restarts": apgdt.n_restarts,
                   "n_target_classes": apgdt.n_target_classes, "loss": "dlr-targeted",
                   "eot_iter": apgdt.eot_iter, "rho": apgdt.thr_decr},
        "fab-t": {"n_iter": fab.steps, "n_restarts": fab.n_restarts,
                  "n_target_classes": fab.n_target_classes if fab.multi_targeted else 0,
                  "alpha_max": fab.alpha_max, "eta": fab.eta, "beta": fab.beta},
        "square": {"n_queries": square.n_queries, "n_restarts": square.n_restarts, "p_init": square.p_init,
                   "loss": square.loss, "resc_schedule": square.rescale_schedule},
    }
    seeds = {x.seed for x in (apgd, apgdt, fab, square)}
    if seeds != {seed}:
        raise RuntimeError(f"torchattacks did not take seed {seed}: its attack objects hold {sorted(seeds)}")
    return Backend("torchattacks", {"apgd-ce": apgd, "apgd-t": apgdt, "fab-t": fab, "square": square}, settings,
                   ta.__version__, seed)


OFFICIAL = ("pyautoattack", "autoattack")  # the official code, in the order ``auto`` tries it


def default_backend() -> str:
    """The official code: pyautoattack (a dependency of fastfair), else a git-installed autoattack."""
    for name in OFFICIAL:
        if importlib.util.find_spec(name) is not None:
            return name
    raise UserError("AutoAttack needs the official package, which installs with fastfair: pip install "
                    "pyautoattack==0.2.0 (or pick --aa-backend torchattacks)")


def build_backend(model, eps: float, num_classes: int, name: str = "auto", seed: int = 0) -> Backend:
    """Build and check a backend: its read-back settings must equal the standard version's."""
    name = default_backend() if name == "auto" else name
    try:
        backend = BACKENDS.get(name)(model, eps, num_classes, seed)
    except ImportError as err:
        raise UserError(f"AutoAttack backend {name!r} is not installed ({err}); pip install pyautoattack==0.2.0 "
                        "(the default), or pip install 'fastfair[torchattacks]', or pick another with --aa-backend"
                        ) from None
    want = standard_settings(num_classes)
    if backend.settings != want:
        raise RuntimeError(f"{name} built a non-standard AutoAttack: {backend.settings} != {want}")
    return backend


def uniform_eps(eps_c: torch.Tensor) -> float:
    """AutoAttack takes one radius; per-class radii are a training-time idea, so refuse them here."""
    values = torch.unique(eps_c.float().cpu())
    if len(values) != 1:
        raise UserError(f"AutoAttack needs one eps for all classes; got {values.tolist()}. Set eval.eps to a number")
    return float(values[0])


# ---- resumable per-sample state -------------------------------------------------------------

def _fingerprint(model, y: torch.Tensor, x: torch.Tensor, eps: float, backend: Backend) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    h.update(y.cpu().numpy().tobytes())
    h.update(x.cpu().numpy().tobytes())  # every image: a sample could miss a changed one
    h.update(repr((float(eps), backend.name, backend.version, backend.seed,
                   sorted((k, sorted(v.items())) for k, v in backend.settings.items()))).encode())
    return h.hexdigest()


ROBUST, CLEAN_WRONG = -1, 0


@dataclass
class Flags:
    """Per-sample state of one AutoAttack run: who broke each point, prediction after attack, tried[k],
    and the images the attack returned (the clean image for points nothing broke)."""

    broken_by: np.ndarray  # int8 (N,): ROBUST, CLEAN_WRONG, or 1 + index of the first sub-attack that fooled it
    pred: np.ndarray  # int64 (N,): clean prediction, replaced by the first successful attack's
    tried: np.ndarray  # bool (len(SUBATTACKS), N): sub-attack k has attacked the point
    adv: np.ndarray  # float32 (N, ...): adversarial image of each point an attack broke, else the clean one
    fingerprint: str

    def save(self, path: Path) -> None:
        broken = np.flatnonzero(self.broken_by > CLEAN_WRONG)  # only these differ from the clean images
        write_npz_atomic({"broken_by": self.broken_by, "pred": self.pred, "tried": self.tried, "adv_index": broken,
                          "adv": self.adv[broken], "fingerprint": np.array(self.fingerprint)}, path)

    @classmethod
    def load(cls, path: Path, fingerprint: str, clean: np.ndarray) -> "Flags | None":
        """The saved flags if they belong to this model, data and settings; otherwise None."""
        if not path.is_file():
            return None
        f = load_npz(path, "delete it, and AutoAttack starts again from its first point")
        if "adv" not in f or str(f["fingerprint"]) != fingerprint:
            return None
        adv = clean.copy()
        adv[f["adv_index"]] = f["adv"]
        return cls(f["broken_by"], f["pred"], f["tried"], adv, fingerprint)


# ---- the run ---------------------------------------------------------------------------------

def _collect(loader) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*[(x, y) for x, y in loader])
    return torch.cat(xs).float().contiguous(), torch.cat(ys)


@torch.no_grad()
def _predict(model, x: torch.Tensor, batch: int) -> torch.Tensor:
    """The model's class for each image; a UserError when any image's logits hold a NaN or inf (their argmax means
    nothing), checked once after the pass."""
    nonfinite = torch.zeros((), dtype=torch.long, device=x.device)
    preds = []
    for i in range(0, len(x), batch):
        logits = model(x[i:i + batch])
        nonfinite += (~torch.isfinite(logits)).any(1).sum()
        preds.append(logits.argmax(1))
    measures.check_finite(int(nonfinite), len(x), "AutoAttack")
    return torch.cat(preds)


def _robust_after(broken_by: np.ndarray, k: int) -> float:
    """Robust accuracy (%) after sub-attacks 0..k: points nothing up to k has broken."""
    return 100.0 * float(((broken_by == ROBUST) | (broken_by > 1 + k)).mean())


def _worst_class_after(broken_by: np.ndarray, y: np.ndarray, k: int, num_classes: int) -> tuple[int, float]:
    """(class, its robust accuracy in %) of the least robust class after sub-attacks 0..k."""
    robust = (broken_by == ROBUST) | (broken_by > 1 + k)
    counts = np.bincount(y, minlength=num_classes)
    acc = 100.0 * np.bincount(y, weights=robust, minlength=num_classes) / np.maximum(counts, 1)
    acc = np.where(counts > 0, acc, np.inf)  # a class absent from the split is nobody's worst
    return int(acc.argmin()), float(acc.min())


def _inside(adv: torch.Tensor, x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per image: (within eps of x in L-inf, within [0, 1])."""
    a, c = adv.flatten(1), x.flatten(1)
    return (a - c).abs().amax(1) <= eps + BALL_TOLERANCE, (a.amin(1) >= 0) & (a.amax(1) <= 1)


def recheck(model, x: torch.Tensor, flags: Flags, eps: float, batch: int) -> dict:
    """One clean pass over the returned images: predictions must equal the recorded ones, images must lie
    in the eps-ball and [0, 1] (fra31/auto-attack issue 74); a UserError names any disagreement."""
    adv = torch.from_numpy(flags.adv).to(x.device)
    pred = _predict(model, adv, batch).cpu().numpy()
    in_ball, in_range = (t.cpu().numpy() for t in _inside(adv, x, eps))
    mismatch = np.flatnonzero(pred != flags.pred)
    out = {"images": len(pred), "prediction_mismatches": len(mismatch), "outside_eps_ball": int((~in_ball).sum()),
           "outside_0_1": int((~in_range).sum()),
           "max_linf": float((adv - x).flatten(1).abs().amax(1).max()) if len(pred) else 0.0}
    if out["prediction_mismatches"] or out["outside_eps_ball"] or out["outside_0_1"]:
        raise UserError(
            f"AutoAttack's result failed its re-check: of {len(pred)} returned images, {len(mismatch)} predict "
            f"differently in a clean pass than the attack recorded (first indices {mismatch[:5].tolist()}), "
            f"{out['outside_eps_ball']} lie outside the eps-ball and {out['outside_0_1']} outside [0, 1]; no result "
            "was written. Make the model deterministic in eval mode (no dropout or test-time randomness) or "
            "report the backend's bug")
    return out


def evaluate_split(model, loader, *, eps: float, num_classes: int, state_path: str | Path | None = None,
                   backend: str = "auto", seed: int = 0, progress: Ticks | None = None,
                   log: Callable[[str], None] | None = None,
                   classes: list[str] | None = None) -> tuple[torch.Tensor, dict, np.ndarray]:
    """Run standard AutoAttack over a split: ((C, C) confusion after attack, record of the run, whether each image,
    in loader order, is classified correctly after it).

    The record names the backend, its version, seed and settings, the robust accuracy after each
    sub-attack and the re-check. ``progress`` counts the model's passes, :func:`planned_units` per loader batch, less
    the plan of points nothing needs to attack. ``log`` hears what AutoAttack will attack and its plan, each
    sub-attack's result as it ends and the time the rest will take at the pace measured so far.
    The official sub-attacks reseed torch's generators; the caller's stream is restored afterwards.
    ``classes`` names the classes in the log lines (their indices without it).
    """
    model.eval()
    x, y = _collect(loader)
    meter = PassMeter(progress) if progress is not None else None
    hook = model.register_forward_hook(meter) if meter is not None else None
    try:
        return _evaluate_split(model, x, y, loader.batch_size, eps, num_classes, state_path, backend, seed, meter,
                               log or (lambda line: None), classes)
    finally:
        if hook is not None:
            hook.remove()


def _evaluate_split(model, x, y, batch, eps, num_classes, state_path, backend, seed, meter, log,
                    classes) -> tuple[torch.Tensor, dict, np.ndarray]:
    n = len(y)
    n_batches = -(-n // batch)
    piece = meter.piece if meter is not None else lambda planned: contextlib.nullcontext()
    drop = meter.ticks.drop if meter is not None else lambda units: None
    devices = [x.device] if x.device.type == "cuda" else []
    with attack_mode(model, "eval"), torch.autocast(x.device.type, enabled=False), \
            torch.random.fork_rng(devices=devices):
        bk = build_backend(model, eps, num_classes, backend, seed)
        plan = plans(bk.settings)
        fp = _fingerprint(model, y, x, eps, bk)
        path = Path(state_path) if state_path else None
        if path:
            path.parent.mkdir(parents=True, exist_ok=True)
        clean, y_np = x.cpu().numpy(), y.cpu().numpy()
        flags = Flags.load(path, fp, clean) if path else None
        resumed = flags is not None
        if resumed:  # the fingerprint covers the weights, every image and label, eps and the backend's seed
            drop(n_batches * FORWARD)
            finished = sum(not ((flags.broken_by == ROBUST) & ~flags.tried[k]).any() for k in range(len(SUBATTACKS)))
            log(f"AutoAttack: {'reused' if finished == len(SUBATTACKS) else 'resuming'} {path} (same model, data, "
                f"attack, seed; {finished} of {len(SUBATTACKS)} sub-attacks finished)")
        else:
            with piece(n_batches * FORWARD):
                pred = _predict(model, x, batch)
            broken = np.where((pred == y).cpu().numpy(), ROBUST, CLEAN_WRONG).astype(np.int8)
            flags = Flags(broken, pred.cpu().numpy(), np.zeros((len(SUBATTACKS), n), bool), clean.copy(), fp)
            if path:
                flags.save(path)
        masked = masked_at_start(model, x, y, batch)
        left = _left(flags, plan, batch)
        if left:
            first, points = next(iter(left)), int(((flags.broken_by == ROBUST) & ~flags.tried.all(0)).sum())
            log(f"AutoAttack, standard version ({bk.name} {bk.version}), on {points} of {n} images (the others "
                f"{'settled in the saved run' if resumed else 'misclassified already'}): {sum(left.values()):,} model "
                f"passes planned, {first} the first {left[first]:,}; the time left is said as each sub-attack ends")
        seconds, t_start, done_start = {}, time.perf_counter(), meter.done if meter is not None else 0
        for k, name in enumerate(SUBATTACKS):
            t0 = time.perf_counter()
            todo = _todo(flags, k)
            chunks = [todo[i:i + batch] for i in range(0, len(todo), batch)]
            drop((n_batches - len(chunks)) * plan[name])  # points settled already: no work planned for them
            for idx_np in chunks:
                idx = torch.from_numpy(idx_np).to(x.device)
                xb, yb = x[idx], y[idx]
                with piece(plan[name]):
                    with torch.enable_grad():
                        adv = bk.attacks[name](xb, yb).detach()
                    p = _predict(model, adv, batch)
                # a success must stay in the eps-ball and the image range, whatever the backend did
                in_ball, in_range = _inside(adv, xb, eps)
                fooled = ((p != yb) & in_ball & in_range).cpu().numpy()
                flags.broken_by[idx_np[fooled]] = 1 + k
                flags.pred[idx_np[fooled]] = p.cpu().numpy()[fooled]
                flags.adv[idx_np[fooled]] = adv.cpu().numpy()[fooled]
                flags.tried[k, idx_np] = True
                if path:
                    flags.save(path)
            seconds[name] = round(time.perf_counter() - t0, 3)
            # each sub-attack can take many minutes: say what it left standing as soon as it ends
            worst, worst_acc = _worst_class_after(flags.broken_by, y_np, k, num_classes)
            how = "reused" if resumed and not chunks else f"done in {seconds[name]:.0f} s"
            log(f"AutoAttack {name} ({k + 1}/{len(SUBATTACKS)}) {how}: robust accuracy "
                f"{_robust_after(flags.broken_by, k):.2f}%, "
                f"{display.worst_class_text(classes[worst] if classes else f'class {worst}', worst_acc)}")
            left = _left(flags, plan, batch)
            done = (meter.done if meter is not None else 0) - done_start
            if left and done:  # the pace of the passes run so far, in this call
                pace = done / (time.perf_counter() - t_start)
                log(f"AutoAttack: {', '.join(left)} left, {sum(left.values()):,} model passes: about "
                    f"{hms(sum(left.values()) / pace)} at this pace ({pace:,.0f} passes/s)")
        checked = recheck(model, x, flags, eps, batch)
    after = {"clean": 100.0 * float((flags.broken_by != CLEAN_WRONG).mean()),
             **{name: _robust_after(flags.broken_by, k) for k, name in enumerate(SUBATTACKS)}}
    conf = torch.zeros(num_classes * num_classes, dtype=torch.long)
    conf.index_add_(0, y.cpu() * num_classes + torch.from_numpy(flags.pred), torch.ones(n, dtype=torch.long))
    record = {"version": "standard", "norm": "Linf", "eps": float(eps), "backend": bk.name,
              "backend_version": bk.version, "seed": bk.seed, "precision": "fp32", "settings": bk.settings,
              "robust_after": after, "recheck": checked, "seconds_this_call": seconds, "resumed": resumed,
              measures.MASKED: masked, "gradient_check": GRADIENT_CHECK}
    return conf.view(num_classes, num_classes), record, flags.pred == y_np


GRADIENT_CHECK = ("one input gradient of the cross-entropy at each clean image, before AutoAttack ran: its own steps "
                  "run inside the package, whose gradients fastfair does not see")


def masked_at_start(model, x: torch.Tensor, y: torch.Tensor, batch: int) -> int:
    """How many images have an input gradient of the cross-entropy holding a NaN or inf at the clean image
    (:data:`GRADIENT_CHECK`): one backward a batch, counted on the device and read once. AutoAttack's APGD steps
    along such gradients as PGD does, and stalls where they are not finite (issue 58)."""
    masked = torch.zeros(len(x), dtype=torch.bool, device=x.device)
    with torch.enable_grad():
        for i in range(0, len(x), batch):
            xb = x[i:i + batch].clone().requires_grad_(True)
            loss = torch.nn.functional.cross_entropy(model(xb).float(), y[i:i + batch], reduction="sum")
            (grad,) = torch.autograd.grad(loss, xb)
            flag_masked(masked[i:i + batch], grad)
    return int(masked.sum())


def _todo(flags: Flags, k: int) -> np.ndarray:
    """Indices of the points sub-attack ``k`` still has to attack: robust so far and not yet tried by it."""
    return np.flatnonzero((flags.broken_by == ROBUST) & ~flags.tried[k])


def _left(flags: Flags, plan: dict[str, int], batch: int) -> dict[str, int]:
    """{sub-attack: the passes it plans for the points it has still to attack}, for those with any: an estimate, as
    a later sub-attack attacks only the points the earlier ones leave robust."""
    chunks = {name: -(-_todo(flags, k).size // batch) for k, name in enumerate(SUBATTACKS)}
    return {name: chunks[name] * plan[name] for name in SUBATTACKS if chunks[name]}
