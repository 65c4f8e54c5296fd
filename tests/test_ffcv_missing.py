"""Without the ffcv extra: fastfair imports fine and the FFCV entry points say how to install it."""
from __future__ import annotations

import importlib
import sys

import pytest

from fastfair.data import ffcv as fl
from fastfair.errors import UserError

# numba's dispatcher finaliser raises a harmless KeyError when FFCV's generated pipelines are freed
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def no_ffcv(monkeypatch):
    """Make every ``import ffcv...`` fail as it does when the package is not installed."""
    for name in [m for m in sys.modules if m == "ffcv" or m.startswith("ffcv.")] + ["ffcv"]:
        monkeypatch.setitem(sys.modules, name, None)


def test_missing_ffcv_names_the_fix(no_ffcv, tmp_path):
    assert not fl.available()
    for call in (lambda: fl.convert({}, tmp_path),
                 lambda: fl.FFCVLoader(tmp_path / "train.beton", 8, device="cpu", train=True)):
        with pytest.raises(UserError) as err:
            call()
        msg = str(err.value)
        assert "pip install 'fastfair[ffcv]'" in msg and "libturbojpeg0-dev" in msg and "libopencv-dev" in msg


def test_importing_fastfair_does_not_import_ffcv(no_ffcv):
    importlib.reload(fl)  # re-runs the module's top level with every ffcv import failing
    assert fl.INSTALL_HINT and not fl.available()
