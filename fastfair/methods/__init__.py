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


def declared_keys() -> list[tuple[str, str, object, str, schema.Tune | None]]:
    """(owner, key, default, doc, tune) of every key a method or option declares; a method's default is the one its
    ``defaults`` set, ``tune`` the range ``fastfair tune`` searches it over (None: not a knob of that owner). What
    ``fastfair methods`` and ``docs/keys.md`` show."""
    rows = []
    for name in METHODS:
        method = METHODS.get(name)
        fresh, tunes = method.section()(name=name), method.tunes()
        for key, doc in schema.field_docs(method.section()).items():
            if key != "name":
                rows.append((name, f"method.{key}", method.defaults.get(f"method.{key}", getattr(fresh, key)), doc,
                             tunes.get(key)))
    for name in OPTIONS:
        option = OPTIONS.get(name)
        section = option.section()
        rows += [(name, f"{name}.{key}", getattr(section(), key), doc, option.keys[key].tune)
                 for key, doc in schema.field_docs(section).items()]
    return rows


def tune_note(tune: schema.Tune | None) -> str:
    """`` (tune: log [1, 20], SOURCE)`` after a key's default; '' for a key no method searches."""
    return f" (tune: {tune.span}, {tune.source})" if tune else ""


def untuned() -> list[tuple[str, str]]:
    """(method, why it has no search space of its own) for each method without one."""
    return [(name, METHODS.get(name).why_untuned()) for name in METHODS if not METHODS.get(name).tunes()]


def _valid(owner: str, key: str) -> str:
    """The valid range a key declares (``Key(valid=...)``), as its refusal says it; '' for any value of its type."""
    section, _, name = key.partition(".")
    declared = METHODS.get(owner).keys_all() if section == "method" else OPTIONS.get(owner).keys
    rule = declared[name].valid
    return rule.good if rule is not None else ""


def keys_markdown() -> str:
    """``docs/keys.md``: every declared key, generated from the registries (tests/test_extension_points.py)."""
    lines = ["# Config keys of methods and options", "",
             "Generated from the registries by `fastfair methods --markdown`; each key is declared beside the code "
             "that reads it (`fastfair/methods/`). A key with a tune range is a knob `fastfair tune` searches by "
             "default, over that range (`--space FILE.toml` overrides it). A key with a valid range is refused "
             "outside it wherever a value arrives (`--set`, a config file, the Python API, a tune space).", "",
             "| method or option | key | default | valid | tune | what it is |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {owner} | `{key}` | `{default!r}` | {_valid(owner, key)} | "
              f"{f'{tune.span}: {tune.source}' if tune else ''} | {doc} |"
              for owner, key, default, doc, tune in declared_keys()]
    lines += ["", "## Methods without a default search space", ""]
    lines += [f"- {name}: {why}" for name, why in untuned()]
    return "\n".join(lines) + "\n"
