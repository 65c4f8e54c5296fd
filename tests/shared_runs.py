"""Results several test files compare against, computed once a test run (whichever xdist worker asks first; the
others wait on its lock, then read it): their users read them, never write into them."""
from __future__ import annotations

import functools
import pickle

import numpy as np
import torch

from helpers import once_per_run


def tiny_linear_case(n=10):
    """A 10-class linear model on 3x4x4 images with a few clean mistakes; one batch holds every image."""
    from fastfair.data import DeviceLoader

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 10)).eval()
    x = torch.randint(0, 256, (n, 3, 4, 4), dtype=torch.uint8)
    with torch.no_grad():
        y = model(x.float() / 255).argmax(1)
    y[::5] = (y[::5] + 1) % 10
    return model, x, y, DeviceLoader(x, y, n, device="cpu", train=False)


# the standard AutoAttack of the tiny linear case: eps 0.02 breaks some of its images, not all
TINY_AA = {"eps": 0.02, "alpha": 0.01, "classes": [str(c) for c in range(10)]}


@functools.lru_cache(maxsize=1)
def tiny_linear_aa():
    """(fastfair eval's ``aa`` result for :func:`tiny_linear_case` with the official backend, the state prefix its
    flags and adversarial images were saved under): the reference that the official package's own run
    (test_autoattack) and ``fastfair.evaluate`` (test_api) are compared with; an AutoAttack costs ~10 CPU s."""
    from fastfair.evaluation.per_class import evaluate

    def make(folder):
        model, _, _, loader = tiny_linear_case()
        result = evaluate(model, loader, ["aa"], state_prefix=folder / "ff", **TINY_AA)["aa"]
        (folder / "result.pkl").write_bytes(pickle.dumps(result))

    folder = once_per_run("tiny-linear-aa", make)
    prefix, saved = folder / "ff", folder / "result.pkl"
    return pickle.loads(saved.read_bytes()), prefix


def trials_in_process(monkeypatch) -> None:
    """fastfair tune trains its trials through ``fastfair.cli.main`` in this process instead of a ``fastfair train``
    process each (~7 CPU s of interpreter and imports a trial): for a test whose subject is what a study computes
    and writes, not the trials' processes (tests/test_tune*.py keep those real). What a trial's state says is what
    :func:`fastfair.scaleout.jobs.run_job` says of a process that ended with the same exit code; no trial here has a
    process to stop early (no pruning)."""
    from fastfair import cli
    from fastfair.scaleout import jobs
    from fastfair.tuning import study

    def run_here(job, env=None, ignored=()):
        command = job.command()
        state = {"status": "running", "attempt": jobs.read_state(job.run_dir).get("attempt", 0) + 1,
                 "command": command}
        jobs._write_state(job.run_dir, state)
        code = cli.main(command[3:])  # after [python, -m, fastfair]
        state.update(status="done" if code == 0 else "failed", returncode=code)
        jobs._write_state(job.run_dir, state)
        return state["status"]

    monkeypatch.setattr(study, "run_job", run_here)


def figures_unrendered(monkeypatch, render=()) -> None:
    """fastfair report's figures are made as the report makes them, titles and all, and written as a 1x1 PNG instead
    of laid out and rendered (most of a report's CPU time, ~1-2 s a figure): for the tests of what a report says and
    where its files go. The files named in ``render`` (the figures a test checks) are laid out and rendered still.
    test_report's figure tests and test_report_of_a_real_cifar10_run render theirs."""
    import io
    from pathlib import Path

    import matplotlib.pyplot as plt

    from fastfair.reports import figures

    real = {"_save": figures._save, "save_figure": figures.save_figure}
    render = set(render)

    def unrendered(name):
        def save(fig, path):
            if Path(path).name in render:
                return real[name](fig, path)
            plt.close(fig)
            buf = io.BytesIO()
            plt.imsave(buf, np.zeros((1, 1, 3)), format="png")
            Path(path).write_bytes(buf.getvalue())
            return path
        return save
    monkeypatch.setattr(figures, "_save", unrendered("_save"))
    monkeypatch.setattr(figures, "save_figure", unrendered("save_figure"))
