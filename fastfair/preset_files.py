"""The presets shipped in ``configs/`` (installed as ``fastfair.presets``): their names and TOML text.

Kept apart from :mod:`fastfair.config`, which imports the method and data registries (and so torch),
so that ``fastfair presets`` lists them at once."""
from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

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
