"""Training methods, registered by name, and the class-wise options that combine with them.

A method is one small module (see :mod:`.base`); an option (CCM, CCR, cost-sensitive, HE,
adversarial classes) is one small module registering into :data:`.options.OPTIONS`.
"""
from .base import METHODS, Method
from .options import OPTIONS
from . import standard, at, trades, fat, mart, frl  # noqa: F401  (register methods)
from . import cfa, cost_sensitive, he, analysis  # noqa: F401  (register options)

__all__ = ["METHODS", "OPTIONS", "Method"]
