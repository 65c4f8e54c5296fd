"""AutoAttack, version 'standard', per class and resumable (Croce & Hein 2020, Sec. 5).

The standard L-inf version runs APGD-CE (100 iterations, 1 restart), APGD-T (DLR-targeted loss,
9 target classes, 100 iterations), FAB-T (9 targets, 100 iterations) and Square (5000 queries,
p_init 0.8), each only on the points every earlier attack left robust, always in fp32. The
numbers come from the official package's ``set_version('standard')``; its Square also turns
the query-schedule rescaling off (``resc_schedule=False``), which torchattacks turns on by default.

Two backends build the sub-attacks: the official ``autoattack`` package when it is importable
(it installs only from github.com/fra31/auto-attack), otherwise ``torchattacks`` with every
sub-attack configured to the standard numbers (its own ``AutoAttack`` class runs 10 iterations
and is not the standard version). Each backend reports the settings read back from the
attack objects it built, and :func:`evaluate_split` records them with the result.

Long runs resume: after every batch the per-sample flags (still robust, prediction after
attack, which sub-attacks have tried the point) go atomically to an ``.npz`` next to the
evaluation JSON, keyed by a fingerprint of the weights, data, eps and settings.
"""
from __future__ import annotations

import hashlib
import io
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from fastfair.attacks.pgd import attack_mode
from fastfair.errors import UserError
from fastfair.registry import Registry
from fastfair.rundir import write_bytes_atomic

NAME = "aa"  # the attack name in ``fastfair eval --attacks``
SUBATTACKS = ("apgd-ce", "apgd-t", "fab-t", "square")
PROGRESS_UNITS = 1 + len(SUBATTACKS)  # progress ticks per loader batch: the clean pass, then each sub-attack
SEED = 0
# Standard-version settings per sub-attack (official autoattack.py, set_version('standard'),
# and the constructor defaults it relies on). n_target_classes is min(9, C - 1).
STANDARD = {
    "apgd-ce": {"n_iter": 100, "n_restarts": 1, "loss": "ce", "eot_iter": 1, "rho": 0.75},
    "apgd-t": {"n_iter": 100, "n_restarts": 1, "n_target_classes": 9, "loss": "dlr-targeted", "eot_iter": 1,
               "rho": 0.75},
    "fab-t": {"n_iter": 100, "n_restarts": 1, "n_target_classes": 9, "alpha_max": 0.1, "eta": 1.05, "beta": 0.9},
    "square": {"n_queries": 5000, "n_restarts": 1, "p_init": 0.8, "loss": "margin", "resc_schedule": False},
}


def standard_settings(num_classes: int) -> dict[str, dict]:
    """The standard settings for a ``num_classes``-way model (fewer targets when C < 10)."""
    out = {k: dict(v) for k, v in STANDARD.items()}
    for k in ("apgd-t", "fab-t"):
        out[k]["n_target_classes"] = min(9, num_classes - 1)
    return out


@dataclass
class Backend:
    """Sub-attacks by name, each ``(x, y) -> x_adv``, and the settings read back from them."""

    name: str
    attacks: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    settings: dict[str, dict]


BACKENDS: Registry[Callable[[torch.nn.Module, float, int], Backend]] = Registry("AutoAttack backend")


@BACKENDS.register("autoattack", "the official package (pip install git+https://github.com/fra31/auto-attack)")
def _official(model, eps: float, num_classes: int) -> Backend:
    from autoattack import AutoAttack

    dev = next(model.parameters()).device
    aa = AutoAttack(model, norm="Linf", eps=eps, version="standard", seed=SEED, verbose=False, device=str(dev))
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
    return Backend("autoattack", attacks, settings)


@BACKENDS.register("torchattacks", "torchattacks 3.5 sub-attacks configured to the standard numbers")
def _torchattacks(model, eps: float, num_classes: int) -> Backend:
    import torchattacks as ta

    std = standard_settings(num_classes)
    a, t, f, s = std["apgd-ce"], std["apgd-t"], std["fab-t"], std["square"]
    # torchattacks derives n_target_classes as n_classes - 1, so n_classes here is targets + 1.
    apgd = ta.APGD(model, norm="Linf", eps=eps, steps=a["n_iter"], n_restarts=a["n_restarts"], seed=SEED,
                   loss=a["loss"], eot_iter=a["eot_iter"], rho=a["rho"])
    apgdt = ta.APGDT(model, norm="Linf", eps=eps, steps=t["n_iter"], n_restarts=t["n_restarts"], seed=SEED,
                     eot_iter=t["eot_iter"], rho=t["rho"], n_classes=t["n_target_classes"] + 1)
    fab = ta.FAB(model, norm="Linf", eps=eps, steps=f["n_iter"], n_restarts=f["n_restarts"], alpha_max=f["alpha_max"],
                 eta=f["eta"], beta=f["beta"], seed=SEED, multi_targeted=True, n_classes=f["n_target_classes"] + 1)
    square = ta.Square(model, norm="Linf", eps=eps, n_queries=s["n_queries"], n_restarts=s["n_restarts"],
                       p_init=s["p_init"], loss=s["loss"], resc_schedule=s["resc_schedule"], seed=SEED)
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
    return Backend("torchattacks", {"apgd-ce": apgd, "apgd-t": apgdt, "fab-t": fab, "square": square}, settings)


def default_backend() -> str:
    """The official package when importable, else torchattacks."""
    try:
        import autoattack  # noqa: F401
    except ImportError:
        return "torchattacks"
    return "autoattack"


def build_backend(model, eps: float, num_classes: int, name: str = "auto") -> Backend:
    """Build and check a backend: its read-back settings must equal the standard version's."""
    name = default_backend() if name == "auto" else name
    try:
        backend = BACKENDS.get(name)(model, eps, num_classes)
    except ImportError as err:
        raise UserError(f"AutoAttack backend {name!r} is not installed ({err}); install it "
                        "(pip install torchattacks, or the official package from its git repository) "
                        "or pick the other with --aa-backend") from None
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
    h.update(x[:: max(1, len(x) // 64)].cpu().numpy().tobytes())  # a sample of the images, not all of them
    h.update(repr((float(eps), backend.name, sorted((k, sorted(v.items())) for k, v in backend.settings.items()),
                   SEED)).encode())
    return h.hexdigest()


ROBUST, CLEAN_WRONG = -1, 0


@dataclass
class Flags:
    """Per-sample state of one AutoAttack run: who broke each point, prediction after attack, tried[k]."""

    broken_by: np.ndarray  # int8 (N,): ROBUST, CLEAN_WRONG, or 1 + index of the first sub-attack that fooled it
    pred: np.ndarray  # int64 (N,): clean prediction, replaced by the first successful attack's
    tried: np.ndarray  # bool (len(SUBATTACKS), N): sub-attack k has attacked the point
    fingerprint: str

    def save(self, path: Path) -> None:
        buf = io.BytesIO()
        np.savez(buf, broken_by=self.broken_by, pred=self.pred, tried=self.tried,
                 fingerprint=np.array(self.fingerprint))
        write_bytes_atomic(buf.getvalue(), path)

    @classmethod
    def load(cls, path: Path, fingerprint: str) -> "Flags | None":
        """The saved flags if they belong to this model, data and settings; otherwise None."""
        if not path.is_file():
            return None
        with np.load(path, allow_pickle=False) as f:
            if str(f["fingerprint"]) != fingerprint:
                return None
            return cls(f["broken_by"].copy(), f["pred"].copy(), f["tried"].copy(), fingerprint)


# ---- the run ---------------------------------------------------------------------------------

def _collect(loader) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys = zip(*[(x, y) for x, y in loader])
    return torch.cat(xs).float().contiguous(), torch.cat(ys)


@torch.no_grad()
def _predict(model, x: torch.Tensor, batch: int) -> torch.Tensor:
    return torch.cat([model(x[i:i + batch]).argmax(1) for i in range(0, len(x), batch)])


def _robust_after(broken_by: np.ndarray, k: int) -> float:
    """Robust accuracy (%) after sub-attacks 0..k: points nothing up to k has broken."""
    return 100.0 * float(((broken_by == ROBUST) | (broken_by > 1 + k)).mean())


def evaluate_split(model, loader, *, eps: float, num_classes: int, state_path: str | Path | None = None,
                   backend: str = "auto", progress: Callable[[], None] | None = None,
                   log: Callable[[str], None] | None = None) -> tuple[torch.Tensor, dict]:
    """Run standard AutoAttack over a split: ((C, C) confusion after attack, record of the run).

    The record names the backend and its settings, and the robust accuracy after each
    sub-attack. ``progress`` is called ``PROGRESS_UNITS * len(loader)`` times in total.
    """
    model.eval()
    x, y = _collect(loader)
    n, batch = len(y), loader.batch_size
    n_batches = -(-n // batch)
    tick = progress or (lambda: None)
    with attack_mode(model, "eval"), torch.autocast(x.device.type, enabled=False):
        bk = build_backend(model, eps, num_classes, backend)
        fp = _fingerprint(model, y, x, eps, bk)
        path = Path(state_path) if state_path else None
        flags = Flags.load(path, fp) if path else None
        resumed = flags is not None
        if flags is None:
            pred = _predict(model, x, batch)
            broken = np.where((pred == y).cpu().numpy(), ROBUST, CLEAN_WRONG).astype(np.int8)
            flags = Flags(broken, pred.cpu().numpy(), np.zeros((len(SUBATTACKS), n), bool), fp)
            if path:
                flags.save(path)
        for _ in range(n_batches):
            tick()
        seconds = {}
        for k, name in enumerate(SUBATTACKS):
            t0 = time.perf_counter()
            todo = np.flatnonzero((flags.broken_by == ROBUST) & ~flags.tried[k])
            chunks = [todo[i:i + batch] for i in range(0, len(todo), batch)]
            for idx_np in chunks:
                idx = torch.from_numpy(idx_np).to(x.device)
                xb, yb = x[idx], y[idx]
                with torch.enable_grad():
                    adv = bk.attacks[name](xb, yb).detach()
                # a success must stay in the eps-ball and the image range, whatever the backend did
                flat = adv.flatten(1)
                inside = (((flat - xb.flatten(1)).abs().amax(1) <= eps + 1e-6)
                          & (flat.amin(1) >= 0) & (flat.amax(1) <= 1))
                p = _predict(model, adv, batch)
                fooled = ((p != yb) & inside).cpu().numpy()
                flags.broken_by[idx_np[fooled]] = 1 + k
                flags.pred[idx_np[fooled]] = p.cpu().numpy()[fooled]
                flags.tried[k, idx_np] = True
                if path:
                    flags.save(path)
                tick()
            for _ in range(n_batches - len(chunks)):
                tick()
            seconds[name] = round(time.perf_counter() - t0, 3)
            if log:
                log(f"AutoAttack {name}: robust accuracy {_robust_after(flags.broken_by, k):.2f}%")
    after = {"clean": 100.0 * float((flags.broken_by != CLEAN_WRONG).mean()),
             **{name: _robust_after(flags.broken_by, k) for k, name in enumerate(SUBATTACKS)}}
    conf = torch.zeros(num_classes * num_classes, dtype=torch.long)
    conf.index_add_(0, y.cpu() * num_classes + torch.from_numpy(flags.pred), torch.ones(n, dtype=torch.long))
    record = {"version": "standard", "norm": "Linf", "eps": float(eps), "backend": bk.name, "seed": SEED,
              "precision": "fp32", "settings": bk.settings, "robust_after": after,
              "seconds_this_call": seconds, "resumed": resumed}
    return conf.view(num_classes, num_classes), record
