"""fastfair: class-wise fair adversarial training, and per-class robustness evaluation of any model.

The Python API (docs/api.md); each name is imported when first used, so ``import fastfair`` is instant:

    evaluate(model, (x, y), attacks=[...])  per-class accuracy of any nn.Module (images in [0, 1] -> logits)
                                            under clean, fgsm, pgdK, cwK, tpgdK@tT and AutoAttack: a Result
    Result                                  the per-class table; avg, overall, worst, cv, mcd per attack;
                                            save, load, to_pandas
    load_result(path)                       a Result from a JSON of fastfair eval or evaluate
    load_robustbench(name, ...)             (model, source) of a RobustBench model file, read without unpickling
    train(config, out=..., **flags)         fastfair train from Python; returns the run directory
    tune(methods, config=..., **options)    fastfair tune from Python: each method's front; returns the study folder
    method(name, num_classes=...)           (a training method, its per-class state) for your own training loop
    PGD                                     the L-inf PGD engine with per-class eps (fastfair.attacks)
    per_class(value, num_classes, device)   a radius or step, one float or one per class, as a (C,) tensor
    measures                                per-class measures: per_class_accuracy, cv, mcd, summary, ...
    UserError                               what a wrong argument raises; its message names the fix
"""
from __future__ import annotations

import importlib

# public name -> "module:attribute" ("module" alone: the module itself)
_PUBLIC = {
    "evaluate": "fastfair.api:evaluate",
    "Result": "fastfair.evaluation.result:Result",
    "load_result": "fastfair.api:load_result",
    "load_robustbench": "fastfair.evaluation.robustbench:load",
    "train": "fastfair.api:train",
    "tune": "fastfair.api:tune",
    "method": "fastfair.api:method",
    "PGD": "fastfair.attacks.pgd:PGD",
    "per_class": "fastfair.attacks.pgd:per_class",
    "measures": "fastfair.evaluation.measures",
    "UserError": "fastfair.errors:UserError",
}
__all__ = list(_PUBLIC)


def __getattr__(name: str):
    if name not in _PUBLIC:
        raise AttributeError(f"module 'fastfair' has no attribute {name!r}")
    module, _, attribute = _PUBLIC[name].partition(":")
    value = importlib.import_module(module)
    value = getattr(value, attribute) if attribute else value
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
