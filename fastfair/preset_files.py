"""The presets shipped in ``configs/`` (installed as ``fastfair.presets``): their names and TOML text, a preset's
keys, and ``--set`` values read as TOML.

Kept apart from :mod:`fastfair.config`, which imports the method and data registries (and so torch),
so that ``fastfair presets`` lists them at once and ``fastfair train`` refuses a mistyped key before torch loads
(:mod:`fastfair.known`)."""
from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Any

from fastfair.errors import UserError
from fastfair.suggest import hint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _names(folder) -> list[str]:
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def preset_names() -> list[str]:
    return _names(resources.files("fastfair.presets"))


def grid_names() -> list[str]:
    """The grids shipped in ``configs/grids/`` (``fastfair grid NAME``)."""
    return _names(resources.files("fastfair.presets") / "grids")


def grid_file(name: str):
    """The shipped grid ``configs/grids/NAME.toml`` (a resource; ``.is_file()`` says whether it exists)."""
    return resources.files("fastfair.presets") / "grids" / f"{name.removesuffix('.toml')}.toml"


def grid_title(name: str) -> str:
    """What a shipped grid sweeps and after which paper (its top-level ``preset`` line)."""
    return str(tomllib.loads(grid_file(name).read_text()).get("preset", ""))


def preset_text(name_or_path: str) -> str:
    """The TOML text of a file path, or of a preset shipped in ``configs/`` (``fastfair presets``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path.read_text()
    res = resources.files("fastfair.presets") / f"{name_or_path.removesuffix('.toml')}.toml"
    if not res.is_file():
        raise UserError(f"no config file or preset {name_or_path!r}.{hint(name_or_path, preset_names())} "
                        "List presets with: fastfair presets")
    return res.read_text()


def preset_title(name: str) -> str:
    """The paper table and row a shipped preset reproduces (its top-level ``preset`` line)."""
    return str(tomllib.loads(preset_text(name)).get("preset", ""))


def flatten(nested: dict[str, Any]) -> dict[str, Any]:
    """``{section: {key: value}}`` as ``{"section.key": value}`` (a top-level key stays as it is)."""
    out = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` strings; the value is read as TOML (numbers, true/false, [lists]), else as text."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set takes key=value (for example --set train.lr=0.05); got {item!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw
    return out


def read_preset(name_or_path: str) -> dict[str, Any]:
    """A TOML file path, or the name of a preset shipped in ``configs/`` (``fastfair presets``), as flat
    run keys. Its ``[paper]`` section (the paper's numbers, :func:`read_paper`) describes the run and
    is no part of it."""
    data = _read_toml(name_or_path)
    data.pop("paper", None)
    return flatten(data)


def read_paper(name_or_path: str) -> dict[str, Any]:
    """A preset's ``[paper]`` section as written (``fastfair.reproduce.paper`` checks it); {} if none."""
    return _read_toml(name_or_path).get("paper", {})


def _read_toml(name_or_path: str) -> dict[str, Any]:
    text = preset_text(name_or_path)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{name_or_path}: not valid TOML ({err})") from None
