"""What a non-editable install ships: the wheel built from pyproject.toml holds every package, kernel, preset and
data file of the checkout at its installed name."""
from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# the checkout's folders and the names they install under (pyproject.toml, [tool.setuptools] package-dir)
INSTALLED_AS = {"fastfair": "fastfair", "kernels": "fastfair/kernels", "configs": "fastfair/presets"}


def shipped_files() -> set[str]:
    """Every file of the three folders, at the path it must have in the wheel."""
    return {f"{INSTALLED_AS[folder]}/{path.relative_to(ROOT / folder).as_posix()}"
            for folder in INSTALLED_AS for path in (ROOT / folder).rglob("*")
            if path.is_file() and "__pycache__" not in path.parts}


def test_the_wheel_holds_every_package_kernel_preset_and_data_file(tmp_path):
    """An editable install finds every module whatever pyproject lists; a wheel holds only the listed packages and
    package data (fastfair.tuning and fastfair.reproduce.figures were once missing from it). Built with setuptools
    directly, from a copy of the checkout, so no build/ or egg-info lands in it."""
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__")
    for folder in INSTALLED_AS:
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                            "print(build_meta.build_wheel(sys.argv[1]))", str(tmp_path / "dist")],
                           cwd=source, capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr[-3000:]
    with zipfile.ZipFile(tmp_path / "dist" / built.stdout.strip().splitlines()[-1]) as wheel:
        names = set(wheel.namelist())
    expected = shipped_files()
    assert {"fastfair/tuning/__init__.py", "fastfair/reproduce/figures/__init__.py", "fastfair/kernels/__init__.py",
            "fastfair/presets/demo.toml", "fastfair/presets/grids/me-table2-lambda.toml",
            "fastfair/gpu_figures.json"} <= expected  # what the comparison below covers
    assert not expected - names, f"missing from the wheel: {sorted(expected - names)}"
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"fastfair"}, tops  # no top-level kernels or configs

