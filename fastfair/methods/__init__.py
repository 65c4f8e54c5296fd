"""Training methods, registered by name. A method is one small module: see :mod:`.base`."""
from .base import METHODS, Method
from . import standard, at, trades  # noqa: F401  (register methods)

__all__ = ["METHODS", "Method"]
