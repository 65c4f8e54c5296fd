"""Holds a fastfair process at a chosen call until a stop signal arrives, so a test signals it at a known point.

Python imports ``sitecustomize`` at start-up from the first folder of ``sys.path`` holding one; the tests put
this folder on PYTHONPATH with ``FASTFAIR_TEST_HOLD=module:function:N:DIR`` (``test_signals.held``), and so does
every process the held one starts (a grid's children, torchrun's ranks). The N-th call of ``function`` in a
process first writes ``DIR/<pid>``, then waits until the process has received a stop signal (a signal that
raises, as outside a training epoch, ends the wait by its exception); the call then runs as usual. Once the
test has written ``DIR/released``, no process holds (a resumed run goes through).
"""
import importlib
import os
import time
from pathlib import Path

_spec = os.environ.get("FASTFAIR_TEST_HOLD")
if _spec:
    from fastfair import stopping

    _module, _function, _n, _markers = _spec.split(":", 3)
    _owner = importlib.import_module(_module)
    *_path, _name = _function.split(".")
    for _part in _path:
        _owner = getattr(_owner, _part)
    _original = getattr(_owner, _name)
    _calls = [0]

    def _held(*args, **kwargs):
        _calls[0] += 1
        if _calls[0] == int(_n) and not (Path(_markers) / "released").exists():
            (Path(_markers) / str(os.getpid())).write_text("")
            while not stopping.requested():
                time.sleep(0.005)
        return _original(*args, **kwargs)

    setattr(_owner, _name, _held)
