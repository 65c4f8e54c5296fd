"""What ``fastfair train`` takes, known without importing torch: its flags, and a copy of the method and data-set
names, every config key with its type and the names a key may take (``known.json``).

Importing the registries that declare these loads torch (seconds, tens of them on a busy machine), so the CLI
checks a command against the copy first (:func:`check_train`): a mistyped method, key or value is the same
``fastfair: error:`` line the full check (:func:`fastfair.config.resolve`, :func:`fastfair.checks.check_config`)
says, at once. Only what the copy decides alone is refused there: a range, an option's or a method's own check
still runs where the config resolves, and where a command holds two mistakes the copy may name the other one.
``known.json`` is generated from the registries and the schema (:func:`table`; ``python -m fastfair.known``
rewrites it), and tests/test_known.py fails when it is stale.
"""
from __future__ import annotations

import functools
import json
import operator
from pathlib import Path
from typing import Any

from fastfair import schema
from fastfair.errors import UserError
from fastfair.preset_files import parse_set, read_preset
from fastfair.registry import unknown
from fastfair.rules import check_name
from fastfair.suggest import hint

FILE = Path(__file__).with_name("known.json")

# keyword -> config key: the long flags of `fastfair train`, by their Python names
TRAIN_FLAGS = {
    "method": "method.name", "dataset": "data.dataset", "data_dir": "data.data_dir", "model": "model.name",
    "epochs": "train.epochs", "seed": "train.seed", "device": "train.device", "kernels": "train.kernels",
    "compile": "train.compile", "cudagraphs": "train.cudagraphs", "cpp_wrapper": "train.cpp_wrapper",
    "loader": "data.loader",
    "beton_dir": "data.beton_dir", "quick": "data.train_per_class", "quick_test": "data.test_per_class",
    "track": "train.track", "progress_every": "train.progress_every_s", "init_from": "train.init_from",
    "classes": "data.classes", "adv_classes": "adv_classes.classes", "ccm": "ccm.enabled", "ccr": "ccr.enabled",
    "averaging": "train.averaging",
}


# the auto | on | off flags, which Python may also give as True / False
SWITCHES = ("compile", "cudagraphs", "cpp_wrapper")

# the keys whose value names a registry entry, refused as the registry refuses it while the config is built
REGISTRIES = ("method.name", "data.dataset")


def said_as(keys, cli: bool) -> dict[str, str]:
    """How the user gave each config key that ``fastfair train``'s flags set: ``--method`` on the command line,
    ``method=`` from Python (what the preset-overrides line names, config.overrides_line)."""
    flag = {key: name for name, key in TRAIN_FLAGS.items()}
    return {key: f"--{flag[key].replace('_', '-')}" if cli else f"{flag[key]}=" for key in keys if key in flag}


def flag_keys(**flags: Any) -> dict[str, Any]:
    """{config key: value} of ``fastfair train``'s flags given by their Python names (None: left out); an unknown
    name is a UserError with a suggestion."""
    unknown_names = [k for k in flags if k not in TRAIN_FLAGS]
    if unknown_names:
        name = unknown_names[0]
        raise UserError(f"fastfair.train() has no setting {name!r}.{hint(name, TRAIN_FLAGS)} Pass a flag of "
                        f"fastfair train ({', '.join(TRAIN_FLAGS)}) or any config key in sets={{'train.lr': 0.05}}")
    return {TRAIN_FLAGS[k]: ({True: "on", False: "off"}[v] if k in SWITCHES and isinstance(v, bool) else v)
            for k, v in flags.items()}


# -- the copy: written from the registries (torch), read without them --------------------------------------

_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


def type_name(typ: Any) -> str:
    """A key's field type as known.json writes it: bool, int, float, str, list[...], or such joined by ``|``."""
    origin = getattr(typ, "__origin__", None)
    if origin is list:
        return f"list[{type_name(typ.__args__[0])}]"
    if hasattr(typ, "__args__"):  # a union
        return " | ".join(type_name(t) for t in typ.__args__)
    name = {v: k for k, v in _TYPES.items()}.get(typ)
    if name is None:
        raise TypeError(f"known.json has no name for the key type {typ!r}; add it to fastfair.known._TYPES")
    return name


def type_of(name: str) -> Any:
    """The type :func:`type_name` wrote, as :func:`fastfair.schema.coerce` checks a value against it."""
    parts = [p.strip() for p in name.split("|")]
    if len(parts) > 1:
        return functools.reduce(operator.or_, (type_of(p) for p in parts))
    if parts[0].startswith("list[") and parts[0].endswith("]"):
        return list[type_of(parts[0][5:-1])]
    return _TYPES[parts[0]]


def table() -> dict[str, Any]:
    """known.json's content, from the registries and the schema (imports them, and so torch)."""
    from fastfair import checks, config
    from fastfair.data import DATASETS
    from fastfair.methods import METHODS

    probe = config.Config()

    def fields(section) -> dict[str, str]:
        return {k: type_name(t) for k, t in schema.field_types(section).items()}

    registries = {"method.name": METHODS, "data.dataset": DATASETS}
    return {
        "written_by": "python -m fastfair.known (tests/test_known.py fails when this file is stale)",
        "defaults": {key: config.value_of(probe, key) for key in REGISTRIES},
        "registries": {key: {"kind": r.kind, "names": list(r), "aliases": r.alias_table}
                       for key, r in registries.items()},
        # every section in the order a config holds them; the method's are under "methods"
        "sections": {s: ({} if s == "method" else fields(sec)) for s, sec in probe.sections.items()},
        "methods": {m: fields(METHODS.get(m).section()) for m in METHODS},
        "choices": {key: list(names) for key, names in checks.NAMES.items() if key not in REGISTRIES},
        "renamed": {k: list(v) for k, v in config.RENAMED.items()},
        "synonyms": config.SYNONYMS,
        "were_boolean": list(config.WERE_BOOLEAN),
    }


def write() -> None:
    FILE.write_text(json.dumps(table(), indent=1) + "\n")


@functools.cache
def load() -> dict[str, Any]:
    return json.loads(FILE.read_text())


# -- the checks --------------------------------------------------------------------------------------------

def _fields(known: dict, method: str) -> dict[str, dict[str, str]]:
    """{section: {key: type name}} of a config of ``method``."""
    return {s: (known["methods"][method] if s == "method" else keys) for s, keys in known["sections"].items()}


def _method_keys(known: dict) -> dict[str, list[str]]:
    """Every method's own keys (its section's, less ``name``)."""
    return {m: [k for k in keys if k != "name"] for m, keys in known["methods"].items()}


def check_value(key: str, value: Any) -> None:
    """A value of ``key`` (of a core or an option's section) read as its type, and one of its names where the key
    names them: what fastfair.cli says of a flag's value that click refused."""
    known = load()
    section, _, name = key.partition(".")
    value = schema.coerce(key, value, type_of(known["sections"][section][name]))
    if key in known["choices"]:
        check_name(key, value, known["choices"][key])


def check_train(preset: str | None, flags: dict[str, Any], sets: list[str],
                flag_names: dict[str, str] | None = None) -> None:
    """Refuse what :func:`fastfair.config.resolve` and :func:`fastfair.checks.check_config` would refuse of a new
    run's layers (the preset, the flags, ``--set``) and known.json decides: an unknown method or data set, an
    unknown or ambiguous key, a value not of its key's type or not one of its names, in the order they check them.
    A preset that cannot be read is left to them."""
    known = load()
    try:
        from_preset = read_preset(preset) if preset else {}
    except UserError:
        return
    given = {k: v for k, v in flags.items() if v is not None}
    layers = [("the preset", from_preset),
              *(((flag_names or {}).get(k, "the command line"), {k: v}) for k, v in given.items()),
              ("--set", parse_set(sets))]
    synonyms, defaults = known["synonyms"], known["defaults"]
    probe = _fields(known, defaults["method.name"])
    merged = {schema.qualified(probe, k, synonyms): v for _, layer in layers for k, v in layer.items()}
    method = merged.get("method.name", defaults["method.name"])
    _registered(known, "method.name", method)
    schema.coerce("data.dataset", merged.get("data.dataset", defaults["data.dataset"]), str)
    _registered(known, "data.dataset", merged.get("data.dataset", defaults["data.dataset"]))
    fields, final = _fields(known, method), {}
    for origin, layer in layers:
        for raw_key, value in layer.items():
            key = schema.qualified(fields, raw_key, synonyms)
            section, _, name = key.partition(".")
            if key in ("preset", "method.name"):
                continue
            if name not in fields.get(section, {}):
                hint_ = schema.unknown_key_hint(fields, key, method, _method_keys(known), known["renamed"], synonyms)
                raise UserError(f"unknown config key {raw_key!r} (from {origin}).{hint_}")
            if key in known["were_boolean"] and isinstance(value, bool):
                value = "on" if value else "off"
            final[key] = schema.coerce(key, value, type_of(fields[section][name]))
    for key, names in known["choices"].items():
        if key in final:
            check_name(key, final[key], names)


def _registered(known: dict, key: str, name: Any) -> None:
    registry = known["registries"][key]
    if name not in registry["names"]:
        raise unknown(registry["kind"], name, registry["names"], registry["aliases"])


if __name__ == "__main__":
    write()
    print(f"wrote {FILE}")
