"""Training methods and the class-wise options that combine with them, registered by name.

A method is one module here (see :mod:`fastfair.methods.base` and ``docs/methods.md``); an
option (CCM, CCR, cost-sensitive weights, HE, adversarial classes) is one module registering
into :data:`fastfair.methods.options.OPTIONS`. Every module of this package is imported below,
so a new method's module registers itself without a central list to edit.
"""
import importlib
import pkgutil

from fastfair import schema
from fastfair.methods.base import METHODS, Method
from fastfair.methods.options import OPTIONS, Option

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["METHODS", "OPTIONS", "Method", "Option"]


def declared_keys() -> list[tuple[str, str, object, str]]:
    """(owner, key, default, doc) of every key a method or option declares; a method's default is
    the one its ``defaults`` set. What ``fastfair methods`` and ``docs/keys.md`` show."""
    rows = []
    for name in METHODS:
        method = METHODS.get(name)
        fresh = method.section()(name=name)
        for key, doc in schema.field_docs(method.section()).items():
            if key != "name":
                rows.append((name, f"method.{key}", method.defaults.get(f"method.{key}", getattr(fresh, key)), doc))
    for name in OPTIONS:
        section = OPTIONS.get(name).section()
        rows += [(name, f"{name}.{key}", getattr(section(), key), doc)
                 for key, doc in schema.field_docs(section).items()]
    return rows


def keys_markdown() -> str:
    """``docs/keys.md``: every declared key, generated from the registries (tests/test_extension_points.py)."""
    lines = ["# Config keys of methods and options", "",
             "Generated from the registries by `fastfair methods --markdown`; each key is declared beside the code "
             "that reads it (`fastfair/methods/`).", "", "| method or option | key | default | what it is |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {owner} | `{key}` | `{default!r}` | {doc} |" for owner, key, default, doc in declared_keys()]
    return "\n".join(lines) + "\n"
