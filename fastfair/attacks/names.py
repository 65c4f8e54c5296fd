"""Attacks a user names on the command line: ``clean``, ``fgsm``, ``pgdK``, ``pgdKxR``, ``cwK``,
``tpgdK@tT``, and the grid name ``tpgdK@grid``.

``tpgdK@grid`` is Temperature-PGD-K over Tian et al.'s 1/T grid (KDD 2021, Sec. 5, 'Overall
results': they search 1/T in {2, 5, 10, 50} and report the best attack, i.e. the temperature
giving the lowest robust accuracy). ``tpgd20@grid`` expands into ``tpgd20@t0.5``, ``@t0.2``,
``@t0.1`` and ``@t0.02`` (the parser takes T, not 1/T), and :func:`add_best` adds a
``tpgd20@grid`` entry equal to the one with the lowest average.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

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
    "cw-inf": "cw20 (CW-20: PGD on the margin loss)", "cw-linf": "cw20 (CW-20: PGD on the margin loss)",
    "mim": "pgd20 (no MI-FGSM; PGD-20 is the papers' white-box attack)",
    "tpgd": "tpgd20@grid (Temperature-PGD over Tian et al.'s 1/T grid) or tpgd20@tT for one T",
}
_NAME = re.compile(r"^(?P<kind>pgd|cw|fgsm|tpgd)(?P<steps>\d*)(?:x(?P<restarts>\d+))?(?:@t(?P<t>[\d.]+))?$")


@dataclass(frozen=True)
class EvalAttack:
    """An attack a user names on the command line: ``clean``, ``pgd20``, ``pgd20x5`` (5 restarts),
    ``cw20``, ``fgsm``, ``tpgd20@t0.1`` (Temperature-PGD, T = 0.1, i.e. 1/T = 10)."""

    name: str
    pgd: PGD | None  # None means clean accuracy
    step_is_eps: bool = False  # FGSM: one step of size eps

    def __call__(self, model, x, y, eps_c, alpha_c):
        if self.pgd is None:
            return x
        return self.pgd(model, x, y, eps_c, eps_c if self.step_is_eps else alpha_c)


def parses(name: str) -> bool:
    """Whether :func:`parse_attack` takes ``name`` (AutoAttack's ``aa`` aside)."""
    return name == "clean" or bool(_NAME.match(name))


def unknown_attack(name: str, autoattack: bool) -> UserError:
    """The error for a name no form parses: the hint (:data:`ALIASES`, another spelling), then every form;
    ``autoattack``: where AutoAttack (``aa``) is one of them (fastfair eval, eval.attacks)."""
    spelled = [normal(name)] if parses(normal(name)) else []  # PGD-20, pgd_20: pgd20
    return UserError(f"unknown attack {name!r}.{hint(name, spelled, ALIASES)} Use clean, fgsm, pgdK, pgdKxR "
                     f"(R restarts), cwK, tpgdK@tT{', aa (AutoAttack)' if autoattack else ''} (for example pgd20, "
                     "cw20, pgd50x5, tpgd20@t0.1)")


def parse_attack(name: str, cw_kappa: float = 50.0, clip_start: bool = True) -> EvalAttack:
    """Parse an evaluation attack name (see :class:`EvalAttack`); bad names list the forms.

    ``clip_start`` (``eval.clip_start``): the uniform random start is clipped to [0, 1] before the first
    step (Madry et al.); false takes the first gradient at x + U(-eps, eps) as the TRADES and MART
    code's ``_pgd_whitebox`` does."""
    if name == "clean":
        return EvalAttack(name, None)
    m = _NAME.match(name)
    if not m:
        raise unknown_attack(name, autoattack=False)
    kind, steps = m["kind"], int(m["steps"] or (1 if m["kind"] == "fgsm" else 20))
    restarts = int(m["restarts"] or 1)
    if kind == "fgsm":
        return EvalAttack(name, PGD(steps=1, objective="ce", init="none"), step_is_eps=True)
    base = PGD(steps=steps, restarts=restarts, objective="ce", init="uniform" if clip_start else "uniform_unclipped",
               bn_mode="eval")
    if kind == "cw":
        base = replace(base, objective="cw", kappa=cw_kappa)
    if kind == "tpgd":
        base = replace(base, temperature=float(m["t"] or 1.0))
    return EvalAttack(name, base)


INVERSE_TEMPERATURES = (2, 5, 10, 50)  # Tian et al. KDD 2021, Sec. 5: grid search over 1/T
_GRID = re.compile(r"^tpgd(?P<steps>\d*)@grid$")


def members(name: str) -> list[str]:
    """The attack names a (grid) name stands for; a plain name stands for itself."""
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
        if group == [name]:
            continue
        best = min(group, key=lambda n: results[n]["summary"]["avg"])
        results[name] = {**results[best], "chosen": best,
                         "inverse_temperature": round(1 / float(best.split("@t")[1]), 6)}
