"""Attacks a user names on the command line: ``clean``, ``fgsm``, ``pgdK``, ``pgdKxR``, ``cwK``,
``tpgdK@tT``, the grid name ``tpgdK@grid``, ``fgsmrs`` (FGSM from a uniform random start), C&W's L-inf
optimisation attack ``cwinf`` (``cwinfK``), the query-based ``nattack`` (``nattackK``), ``transfer:NAME``
(NAME run on a substitute model, evaluated on the target), ``NAME/N``: NAME on the first N test images
of each class (Tian et al. run CW-inf and NATTACK on 200 images a class: ``cwinf/200``), and ``corrupt:NAME@S``: a
natural corruption of CIFAR-10-C at severity S instead of an attack (:mod:`fastfair.attacks.corruptions`; Benz et
al. 2021, Sec. 3.4), ``corrupt:all@S`` every implemented one of CIFAR-10-C's 15 (all but frost) and
``corrupt:extra@S`` of its 4 extra, each run, then their mean added as the group's entry.

``tpgdK@grid`` is Temperature-PGD-K over Tian et al.'s 1/T grid (KDD 2021, Sec. 5, 'Overall
results': they search 1/T in {2, 5, 10, 50} and report the best attack, i.e. the temperature
giving the lowest robust accuracy). ``tpgd20@grid`` expands into ``tpgd20@t0.5``, ``@t0.2``,
``@t0.1`` and ``@t0.02`` (the parser takes T, not 1/T), and :func:`add_best` adds a
``tpgd20@grid`` entry equal to the one with the lowest average.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Callable

from fastfair.attacks.corruptions import ALIASES as CORRUPTION_ALIASES
from fastfair.attacks.corruptions import CORRUPTIONS, GROUPS, REFUSED, SEVERITIES, Corrupt
from fastfair.attacks.cwinf import CWInf
from fastfair.attacks.nattack import NAttack
from fastfair.attacks.pgd import PGD
from fastfair.errors import UserError
from fastfair.suggest import hint, normal

_AA = "aa (AutoAttack, the standard version)"
# what papers and other code bases call an evaluation attack (case, '-' and '_' aside: PGD-20 finds pgd20 by itself)
ALIASES = {
    "autoattack": _AA, "auto-attack": _AA, "aa-standard": _AA, "standard-aa": _AA, "torchattacks-autoattack": _AA,
    **dict.fromkeys(("apgd", "apgd-ce", "apgd-t", "apgd-dlr", "fab", "fab-t", "square"),
                    "aa (AutoAttack: APGD-CE, APGD-T, FAB-T and Square together; none runs alone)"),
    "natural": "clean", "nat": "clean", "none": "clean", "clean-acc": "clean", "standard": "clean",
    **dict.fromkeys(("cw-inf", "cw-linf", "cwlinf", "carlini-wagner"),
                    "cwinf (C&W's L-inf optimisation attack) or cw20 (CW-20: PGD on the margin loss)"),
    "n-attack": "nattack", "natattack": "nattack",
    "transfer": "transfer:pgd20 (PGD-20 on the substitute model given by --substitute)",
    "transfer-based": "transfer:pgd20 (PGD-20 on the substitute model given by --substitute)",
    "mim": "pgd20 (no MI-FGSM; PGD-20 is the papers' white-box attack)",
    "tpgd": "tpgd20@grid (Temperature-PGD over Tian et al.'s 1/T grid) or tpgd20@tT for one T",
    **dict.fromkeys(("corrupt", "corruption", "corruptions", "cifar-10-c", "cifar10c", "common-corruptions"),
                    "corrupt:all@S (CIFAR-10-C's corruptions at severity S = 1..5) or corrupt:NAME@S for one"),
    **{name: f"corrupt:{name}@S (a natural corruption at severity S = 1..5)" for name in CORRUPTIONS},
}
_NAME = re.compile(r"^(?P<kind>pgd|cwinf|cw|fgsmrs|fgsm|tpgd|nattack)(?P<steps>\d*)(?:x(?P<restarts>\d+))?"
                   r"(?:@t(?P<t>[\d.]+))?$")
TRANSFER = "transfer:"
CORRUPT = "corrupt:"
_CORRUPTION = re.compile(r"^corrupt:(?P<what>[^@/]*)(?:@(?P<severity>[^/]*))?$")
_GROUP = re.compile(r"^corrupt:(?P<what>[^@/]*)@(?P<severity>\d+)(?P<cap>/\d+)?$")
_CAP = re.compile(r"^(?P<name>.+)/(?P<n>\d+)$")


@dataclass(frozen=True)
class EvalAttack:
    """An attack a user names on the command line: ``clean``, ``pgd20``, ``pgd20x5`` (5 restarts),
    ``cw20``, ``fgsm``, ``tpgd20@t0.1`` (Temperature-PGD, T = 0.1, i.e. 1/T = 10), ``cwinf``, ``nattack``,
    ``transfer:pgd20``, ``cwinf/200`` (see the module docstring)."""

    name: str
    pgd: PGD | None  # None (and no search) means clean accuracy
    step_is_eps: bool = False  # FGSM: one step of size eps
    search: Callable | None = None  # cwinf, nattack: (model, x, y, eps_c) -> a point in the ball
    transfer: bool = False  # made on the substitute model, evaluated on the target
    per_class: int = 0  # /N: on the first N images of each class; 0: on every image

    @property
    def seed_name(self) -> str:
        """The name its random draws are seeded by: a transfer attack draws the starts of the attack it runs, so
        ``transfer:pgd20`` with the target as substitute is ``pgd20``, image by image."""
        return self.name[len(TRANSFER):] if self.transfer else self.name

    @property
    def differentiates(self) -> bool:
        """Whether it steps along input gradients (PGD's forms, CW-inf), whose non-finite entries it counts
        (:func:`fastfair.attacks.pgd.flag_masked`); clean, NATTACK (queries alone) and corruptions take none."""
        return self.pgd is not None or isinstance(self.search, CWInf)

    def __call__(self, model, x, y, eps_c, alpha_c, substitute=None, masked=None):
        """Its points for ``(x, y)``; ``masked`` ((N,) bool, on the device) gains the images whose input gradient was
        not finite at some step, where it :attr:`differentiates` (a transfer attack's: the substitute's)."""
        if self.transfer:
            if substitute is None:
                raise UserError(f"{self.name} makes its examples on a substitute model; give one with --substitute "
                                "RUN_DIR|CHECKPOINT (eval.substitute)")
            model = substitute
        if isinstance(self.search, CWInf):
            return self.search(model, x, y, eps_c, masked=masked)
        if self.search is not None:
            return self.search(model, x, y, eps_c)
        if self.pgd is None:
            return x
        return self.pgd(model, x, y, eps_c, eps_c if self.step_is_eps else alpha_c, masked=masked)


def parses(name: str) -> bool:
    """Whether :func:`parse_attack` takes ``name`` (AutoAttack's ``aa`` aside)."""
    try:
        parse_attack(name)
    except UserError:
        return False
    return True


def is_transfer(name: str) -> bool:
    return name.startswith(TRANSFER)


class UnknownAttack(UserError):
    """A name no form parses (rather than a form with a wrong part)."""


def unknown_attack(name: str, autoattack: bool) -> UserError:
    """The error for a name no form parses: the hint (:data:`ALIASES`, another spelling), then every form;
    ``autoattack``: where AutoAttack (``aa``) is one of them (fastfair eval, eval.attacks)."""
    spelled = [normal(name)] if normal(name) != name and parses(normal(name)) else []  # PGD-20, pgd_20: pgd20
    return UnknownAttack(f"unknown attack {name!r}.{hint(name, spelled, ALIASES)} Use clean, fgsm, pgdK, pgdKxR "
                     f"(R restarts), cwK, tpgdK@tT, fgsmrs, cwinf[K], nattack[K], transfer:NAME, NAME/N (the first N "
                     f"images of each class), corrupt:NAME@S (a natural corruption at severity 1-5)"
                     f"{', aa (AutoAttack)' if autoattack else ''} (for example pgd20, cw20, pgd50x5, tpgd20@t0.1, "
                     "cwinf/200, transfer:pgd20, corrupt:fog@3)")


def parse_attack(name: str, cw_kappa: float = 50.0, clip_start: bool = True) -> EvalAttack:
    """Parse an evaluation attack name (see :class:`EvalAttack`); bad names list the forms.

    ``clip_start`` (``eval.clip_start``): the uniform random start is clipped to [0, 1] before the first
    step (Madry et al.); false takes the first gradient at x + U(-eps, eps) as the TRADES and MART
    code's ``_pgd_whitebox`` does."""
    capped = _CAP.match(name)
    if capped:
        n = int(capped["n"])
        if capped["name"] == "aa":
            raise UserError(f"{name}: AutoAttack runs on the whole evaluated set; fastfair eval --per-class {n} caps "
                            "every attack to the first N images of each class")
        if n < 1:
            raise UserError(f"{name}: /N takes the number of images of each class, 1 or more")
        return replace(parse_attack(capped["name"], cw_kappa, clip_start), name=name, per_class=n)
    if is_transfer(name):
        inner = parse_attack(name[len(TRANSFER):], cw_kappa, clip_start)
        if inner.transfer or inner.per_class or (inner.pgd is None and inner.search is None) \
                or isinstance(inner.search, (NAttack, Corrupt)):
            raise UserError(f"{name}: transfer: takes a white-box attack (fgsm, fgsmrs, pgdK, cwK, tpgdK@tT, cwinf), "
                            "e.g. transfer:pgd20; /N goes last (transfer:pgd20/200)")
        return replace(inner, name=name, transfer=True)
    if name.startswith(CORRUPT):
        return _corruption(name)
    if name == "clean":
        return EvalAttack(name, None)
    m = _NAME.match(name)
    if not m:
        raise unknown_attack(name, autoattack=False)
    kind = m["kind"]
    if (m["restarts"] and kind in ("fgsm", "fgsmrs", "cwinf", "nattack")) or (m["t"] and kind != "tpgd") \
            or (m["steps"] and kind in ("fgsm", "fgsmrs")):
        what = "xR restarts" if m["restarts"] else "@tT (a temperature)" if m["t"] else "a step count"
        raise UserError(f"{name}: {what} does not apply to {kind}; restarts go with pgd, cw and tpgd, temperatures "
                        "with tpgd, and FGSM takes one step")
    zero = [(what, like) for what, part, like in (("the step count", "steps", f"{kind}20"),
                                                  ("xR, the restarts,", "restarts", f"{kind}{m['steps']}x5"))
            if m[part] and not int(m[part])]
    if zero:  # pgd0 would be its random start alone
        raise UserError(f"{name}: {zero[0][0]} must be 1 or more, e.g. {zero[0][1]}")
    if kind == "cwinf":
        return EvalAttack(name, None, search=CWInf(iterations=int(m["steps"] or CWInf.iterations)))
    if kind == "nattack":
        return EvalAttack(name, None, search=NAttack(iterations=int(m["steps"] or NAttack.iterations)))
    steps = int(m["steps"] or (1 if kind == "fgsm" else 20))
    restarts = int(m["restarts"] or 1)
    if kind == "fgsm":
        return EvalAttack(name, PGD(steps=1, objective="ce", init="none"), step_is_eps=True)
    if kind == "fgsmrs":  # FGSM from a uniform random start in the ball (Tian et al. App. E: "random start")
        return EvalAttack(name, PGD(steps=1, objective="ce", init="uniform" if clip_start else "uniform_unclipped",
                                    bn_mode="eval"), step_is_eps=True)
    base = PGD(steps=steps, restarts=restarts, objective="ce", init="uniform" if clip_start else "uniform_unclipped",
               bn_mode="eval")
    if kind == "cw":
        base = replace(base, objective="cw", kappa=cw_kappa)
    if kind == "tpgd":
        base = replace(base, temperature=float(m["t"] or 1.0))
    return EvalAttack(name, base)


def _corruption(name: str) -> EvalAttack:
    """``corrupt:NAME@S``: the corruption NAME at severity S, or a UserError saying what to type."""
    m = _CORRUPTION.match(name)
    what, severity = (m["what"], m["severity"]) if m else (name[len(CORRUPT):], None)
    known = [*CORRUPTIONS, *GROUPS]
    if what in REFUSED:
        raise UserError(f"{name}: fastfair does not implement {what}: it {REFUSED[what]}. Implemented: "
                        f"{', '.join(CORRUPTIONS)}")
    if what not in known:
        raise UserError(f"{name}: unknown corruption {what!r}.{hint(what, known, CORRUPTION_ALIASES)} Use "
                        f"corrupt:NAME@S with NAME one of {', '.join(known)} and S a severity 1 to 5")
    if severity not in [str(s) for s in SEVERITIES]:
        raise UserError(f"{name}: give a severity 1 to 5 after @, as CIFAR-10-C has them, e.g. corrupt:{what}@3")
    if what in GROUPS:  # members() expands it where a command runs groups
        raise UserError(f"{name} stands for {len(GROUPS[what])} corruptions and their mean, which fastfair "
                        "eval runs; name one here, e.g. corrupt:fog@3")
    return EvalAttack(name, None, search=Corrupt(what, int(severity)))


def is_corruption_group(name: str) -> bool:
    """``corrupt:all@S`` or ``corrupt:extra@S`` (with an optional ``/N``), severity S in 1..5."""
    m = _GROUP.match(name)
    return bool(m) and m["what"] in GROUPS and int(m["severity"]) in SEVERITIES


INVERSE_TEMPERATURES = (2, 5, 10, 50)  # Tian et al. KDD 2021, Sec. 5: grid search over 1/T
_GRID = re.compile(r"^tpgd(?P<steps>\d*)@grid$")


def members(name: str) -> list[str]:
    """The attack names a (grid or corruption group) name stands for; a plain name stands for itself."""
    if is_corruption_group(name):
        g = _GROUP.match(name)
        return [f"{CORRUPT}{c}@{g['severity']}{g['cap'] or ''}" for c in GROUPS[g["what"]]]
    m = _GRID.match(name)
    if not m:
        return [name]
    return [f"tpgd{m['steps']}@t{1 / it:g}" for it in INVERSE_TEMPERATURES]


def expand(names: list[str]) -> list[str]:
    """All names to run, grids expanded, each once, in order."""
    return list(dict.fromkeys(n for name in names for n in members(name)))


def add_best(results: dict[str, dict], names: list[str]) -> None:
    """For each grid name, add the member entry with the lowest average accuracy, naming it in ``chosen``."""
    for name in names:
        group = members(name)
        if group == [name] or is_corruption_group(name):  # a group of corruptions adds its mean (per_class)
            continue
        best = min(group, key=lambda n: results[n]["summary"]["avg"])
        results[name] = {**results[best], "chosen": best,
                         "inverse_temperature": round(1 / float(best.split("@t")[1]), 6)}
