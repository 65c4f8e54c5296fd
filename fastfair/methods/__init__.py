"""Training methods and the class-wise options that combine with them, registered by name.

A method is one module here (see :mod:`fastfair.methods.base` and ``docs/methods.md``); an
option (CCM, CCR, cost-sensitive weights, HE, adversarial classes) is one module registering
into :data:`fastfair.methods.options.OPTIONS`. Every module of this package is imported below,
so a new method's module registers itself without a central list to edit.
"""
import importlib
import pkgutil

from fastfair.methods.base import METHODS, Method
from fastfair.methods.options import OPTIONS, Option

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "OPTIONS", "Method", "Option"]
