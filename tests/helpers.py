"""Shared test helpers: the real CIFAR-10 subset, cut small for fast CPU runs."""
from __future__ import annotations

import contextlib
import fcntl
import importlib
import importlib.metadata
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import pytest
from packaging.requirements import Requirement

from fastfair import config
from fastfair.methods import METHODS
from fastfair.training.class_state import ClassState

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

# FASTFAIR_SHARED_DATA, else ../shared/data next to the checkout; worktrees one level deeper
# (/work/wt/NAME) find it further up.
_BESIDE = [p / "shared" / "data" for p in Path(__file__).resolve().parents[1:4]]
SHARED = (Path(os.environ["FASTFAIR_SHARED_DATA"]) if os.environ.get("FASTFAIR_SHARED_DATA") else
          next((p for p in _BESIDE if p.is_dir()), _BESIDE[1]))  # default: ../shared/data
CIFAR_SUBSET = SHARED / "cifar10-subset.npz"
# Every skip for want of the real data says this first; conftest counts them into one line after the run.
NO_REAL_DATA = "no real data"
# what an end-to-end `reproduce --scale subset` test trains and scores: the plumbing, not the learning (one epoch of
# a width-4 model, 10 training and 5 test images a class, where the subset scale's own are 100 and 50, in two
# batches; 5 is also what a NAME/N attack scores at that scale)
TINY_SUBSET = ["train.epochs=1", "model.width=4", "data.train_per_class=10", "data.test_per_class=5",
               "data.batch_size=50"]


def real_data(name: str = "cifar10-subset.npz") -> Path:
    """``SHARED/name``; skips the test (reason starting with :data:`NO_REAL_DATA`) when it is absent."""
    path = SHARED / name
    if not path.is_file():
        pytest.skip(f"{NO_REAL_DATA}: {path} not found")
    return path


# pyproject.toml's optional extras (``test`` aside: every test needs it), each with the distributions it installs
EXTRAS = {name: [Requirement(r).name for r in reqs] for name, reqs in tomllib.loads(
    (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]["optional-dependencies"].items()
    if name != "test"}
# a skip for want of an extra has its install line as its reason, and only that (conftest counts them, and .ci/run's
# second leg runs exactly these tests once the extras are in)
INSTALL_LINE = re.compile(r'pip install -e "\.\[([\w,]+)\]"')


def install_line(extra: str) -> str:
    return f'pip install -e ".[{extra}]"'


def extra_installed(extra: str) -> bool:
    """Whether every distribution of pyproject's ``extra`` is installed (installed, not merely importable:
    torchattacks' wheel carries a partial ``robustbench`` folder)."""
    try:
        return all(importlib.metadata.version(dist) for dist in EXTRAS[extra])
    except importlib.metadata.PackageNotFoundError:
        return False


def needs_extra(extra: str, module: str | None = None):
    """Skips the test, or the module when called at its top level, with the extra's install line as the reason,
    unless the extra is installed; then returns ``module`` imported, if named."""
    if not extra_installed(extra):
        pytest.skip(install_line(extra), allow_module_level=True)
    return importlib.import_module(module) if module else None


CIFAR10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def cifar_subset_npz(tmp_path: Path, n_train: int = 600, n_test: int = 200) -> Path:
    """The first n images of the real CIFAR-10 subset, with class names, as a small npz."""
    with np.load(real_data()) as f:
        out = tmp_path / "cifar10-small.npz"
        np.savez(out, x_train=f["x_train"][:n_train], y_train=f["y_train"][:n_train],
                 x_test=f["x_test"][:n_test], y_test=f["y_test"][:n_test], class_names=np.array(CIFAR10))
    return out


def make_method(method: str, *sets: str, classes: int = 3, dataset: str = "digits"):
    """(method, its ClassState) for ``method`` on ``dataset``'s config with ``sets`` applied, on the CPU."""
    cfg = config.resolve(None, {"method.name": method, "data.dataset": dataset}, list(sets))
    m = METHODS.get(method)(cfg)
    state = ClassState(classes, "cpu")
    m.setup(state)
    return m, state


# the demo preset (scikit-learn digits) cut to seconds: a 4-channel CNN, one attack step, FGSM validation, clean + FGSM
# evaluation
DEMO_FAST = ["--quiet", "--set", "model.width=4", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm",
             "--set", "eval.attacks=['clean', 'fgsm']", "--set", "data.batch_size=256"]
DEMO_TRAIN = ["train", "--config", "demo", "--epochs", "1", *DEMO_FAST]


def demo_train(out, *extra) -> list[str]:
    """``fastfair train``'s arguments for a :data:`DEMO_FAST` run of one epoch into ``out``, then ``extra``."""
    return [*DEMO_TRAIN, "--out", str(out), *extra]


def small_npz(tmp: Path, **change) -> Path:
    """``tmp/data.npz``: 200 training and 40 test 8x8 grey images of 4 classes, with ``change`` (an array, or None
    to leave it out) over them; the bad data sets of the input tests."""
    rng = np.random.default_rng(0)
    arrays = {"x_train": rng.integers(0, 256, (200, 8, 8), dtype=np.uint8), "y_train": np.arange(200) % 4,
              "x_test": rng.integers(0, 256, (40, 8, 8), dtype=np.uint8), "y_test": np.arange(40) % 4}
    arrays.update(change)
    path = tmp / "data.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


# fastfair train's arguments for the data set small_npz writes in {tmp}
NPZ_TRAIN = ["--dataset", "npz", "--data-dir", "{tmp}/data.npz", "--set", "data.val_per_class=5",
             "--set", "data.batch_size=32", "--model", "tiny-cnn"]


def trained_demo() -> Path:
    """A finished one-epoch demo run (checkpoints, metrics, the final evaluation's JSON), trained once per test run
    (:func:`once_per_run`) for the tests to read or copy, never to write into."""
    from fastfair import cli

    def train(folder):
        assert cli.main(demo_train(folder / "run")) == 0

    return once_per_run("trained-demo", train) / "run"


# a training run on the CIFAR-10 subset cut to seconds: a tiny CNN, 2 PGD steps, 5 validation images per class
SMALL_RUN = ["model.name=tiny-cnn", "model.width=8", "data.batch_size=64", "data.val_per_class=5", "attack.steps=2",
             "train.val_attack=pgd2", "train.progress=false", "train.lr_milestones=[]",
             'eval.attacks=["clean", "pgd2"]']


def small_run_config(npz: Path, method: str, *sets: str):
    """The config of a :data:`SMALL_RUN` of ``method`` on the data set in ``npz``, with ``sets`` applied."""
    return config.resolve(None, {"method.name": method, "data.dataset": "npz", "data.data_dir": str(npz)},
                          SMALL_RUN + list(sets))


def cifar_layout_npz(tmp_path, test_per_class: int = 2):
    """Made-up images in CIFAR-10's layout and class names: enough training images for the validation split."""
    rng = np.random.default_rng(0)
    path = tmp_path / "cifar10-made-up.npz"
    np.savez(path, x_train=rng.integers(0, 256, (600, 32, 32, 3), dtype=np.uint8), y_train=np.repeat(np.arange(10), 60),
             x_test=rng.integers(0, 256, (10 * test_per_class, 32, 32, 3), dtype=np.uint8),
             y_test=np.repeat(np.arange(10), test_per_class), class_names=np.array(CIFAR10))
    return path


def write_model(model_dir, name: str, seed: int = 0) -> torch.nn.Module:
    """RobustBench's architecture for ``name``, randomly initialised, saved as its files are (in its layout under
    ``model_dir``, under state_dict, with DataParallel's ``module.`` prefix); needs fastfair[robustbench]."""
    torch.manual_seed(seed)
    from fastfair.evaluation import robustbench as rb

    model = rb.entry(name, "cifar10", "Linf")["model"]()
    path = rb.model_file(name, "cifar10", "Linf", model_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    return model.eval()


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def block_network(monkeypatch) -> None:
    """No network but this machine, as a machine without one answers (no name lookup; no route), so a test that
    would download (RobustBench's weights) cannot reach the real one."""
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def getaddrinfo(host, *args, **kw):
        if host not in LOCAL_HOSTS:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return lookup(host, *args, **kw)

    def only_local(sock, address):
        if address[0] not in LOCAL_HOSTS:
            raise OSError(101, "Network is unreachable")
        return connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", only_local)


def tiny_npz(path, test_classes):
    """An .npz of 10 classes of random 8x8 grey images: 8 train images each, 3 test images of each of
    ``test_classes`` (a test set that lacks some classes)."""
    rng = np.random.default_rng(0)
    y_test = np.repeat(np.asarray(test_classes), 3)
    np.savez(path, x_train=rng.integers(0, 256, (80, 8, 8), dtype=np.uint8), y_train=np.arange(80) % 10,
             x_test=rng.integers(0, 256, (len(y_test), 8, 8), dtype=np.uint8), y_test=y_test)
    return path


def run_without_some_classes(folder: Path, test_classes) -> Path:
    """FOLDER/run: one tiny epoch of PGD-AT on :func:`tiny_npz`, whose test split holds ``test_classes`` only."""
    from fastfair import cli  # the CLI as a user types it

    data, run = tiny_npz(folder / "part.npz", test_classes), folder / "run"
    assert cli.main(["train", "--dataset", "npz", "--data-dir", str(data), "--out", str(run), "--method", "pgd-at",
                     "--epochs", "1", "--model", "tiny-cnn", "--set", "model.width=4", "--set", "attack.steps=1",
                     "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean', 'fgsm']", "--set",
                     "data.batch_size=16", "--set", "data.val_per_class=2", "--set", "train.lr_milestones=[]",
                     "--set", "train.progress=false", "--quiet"]) == 0
    return run


def compile_cheaply(monkeypatch, backend: str = "aot_eager") -> None:
    """Trainers made after this compile through Dynamo with ``backend`` rather than Inductor: the same Dynamo graphs,
    graph breaks, guards and recompiles (Dynamo counts them before any backend runs) and, with ``aot_eager``,
    AOTAutograd's traced backward and functionalized input mutations (BatchNorm's statistics), without Inductor's
    code generation and C++ builds, tens of CPU seconds a graph. A test about those properties needs no more; one
    that compares Inductor's code with eager (test_compiled_step's whole steps, test_compile) compiles for real."""
    from fastfair import build

    compiles = build.compiles
    monkeypatch.setattr(build, "compiler", lambda cfg, dev, graphs=False:
                        (lambda fn: torch.compile(fn, backend=backend)) if compiles(cfg, dev) else None)


def fastfair(*args: str) -> subprocess.CompletedProcess:
    """``fastfair ARGS`` in this process (``cli.main``, what ``python -m fastfair`` calls): its exit code and what it
    printed. A process of its own costs about 7 CPU s a command (an interpreter and torch's import): a test starts
    one only where the process is what it tests (a signal sent to it, what it imports, a variable read at start)."""
    from fastfair import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main([str(a) for a in args])
    return subprocess.CompletedProcess(["fastfair", *map(str, args)], code, out.getvalue(), err.getvalue())


def shared_folder(name: str) -> Path:
    """A folder every worker of this pytest run sees under one name (xdist gives its workers one run id); without
    xdist a new one of this process's own, so a recycled process id never finds an older run's files."""
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run_id:
        return Path(tempfile.mkdtemp(prefix=f"fastfair-tests-{name}-"))
    folder = Path(tempfile.gettempdir()) / f"fastfair-tests-{run_id}" / name
    folder.mkdir(parents=True, exist_ok=True)
    return folder


_ONCE: dict[str, Path] = {}


def once_per_run(name: str, make) -> Path:
    """The folder that ``make(folder)`` fills, made once per pytest run by whichever xdist worker asks first (the
    others wait on its lock, then find it done): its users read it or copy it, never write into it. A worker whose
    ``make`` raised leaves no mark, so the next one tries again (and fails the same way, in its own test)."""
    if name not in _ONCE:
        folder = shared_folder(name)
        out, done = folder / "out", folder / "done"
        with open(folder / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not done.is_file():
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                make(out)
                done.touch()
        _ONCE[name] = out
    return _ONCE[name]


def jobs_in_process(monkeypatch, where) -> None:
    """``where.run_job`` (``fastfair.scaleout.launchers`` for grid's runs, ``fastfair.tuning.study`` for tune's trials)
    runs a job's fastfair command through ``cli.main`` in this process instead of a child process (~7 CPU s of
    interpreter and imports each), one job at a time, its output in its train.log and its state (attempt, command,
    status, return code, error line) as :func:`fastfair.scaleout.jobs.run_job` records a child's: for the tests of
    what a grid or study does with its runs, not of the children's processes (no process to signal or kill)."""
    import threading
    import traceback

    from fastfair import cli
    from fastfair.rundir import RunDir, append_text
    from fastfair.scaleout import jobs

    lock, mine = threading.Lock(), threading.local()

    class Split:  # this thread's writes go to its job's log while it runs one; the others' where they went
        def __init__(self, other):
            self.other = other

        def __getattr__(self, name):
            return getattr(getattr(mine, "log", None) or self.other, name)

    def run_here(job, env=None, ignored=()):
        run = RunDir(job.run_dir)
        run.path.mkdir(parents=True, exist_ok=True)
        command = job.command()
        state = {"status": "running", "attempt": jobs.read_state(run.path).get("attempt", 0) + 1, "command": command}
        jobs._write_state(run.path, state)
        append_text(f"\n# attempt {state['attempt']}: {' '.join(command)}\n", run.train_log)
        with lock, open(run.train_log, "a") as log:
            start, streams, mine.log = log.tell(), (sys.stdout, sys.stderr), log
            sys.stdout, sys.stderr = Split(streams[0]), Split(streams[1])
            try:
                code = cli.main(command[3:])  # after [python, -m, fastfair]
            except Exception:  # noqa: BLE001 -- a crash: its traceback and exit code 1, as a process ends
                traceback.print_exc(file=log)
                code = 1
            finally:
                sys.stdout, sys.stderr = streams
                mine.log = None
        state.update(status="done" if code == 0 else "interrupted" if code in jobs._STOPPED_CODES else "failed",
                     returncode=code)
        if code:
            state["error"] = jobs._why(run.train_log, start, code)
        jobs._write_state(run.path, state)
        return state["status"]

    monkeypatch.setattr(where, "run_job", run_here)


def gpu_suite_smoke_command(out: Path, pack: Path) -> tuple[list[str], dict]:
    """``bench/lease/gpu_suite.py --smoke --out OUT --pack PACK`` and its environment: no GPU, one thread (OpenMP,
    MKL, Inductor's compilation: threads that spin on a shared 2-core machine burn CPU for nothing), the real CIFAR-10
    subset found where the tests find it."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "TORCHINDUCTOR_COMPILE_THREADS": "1", "CUDA_VISIBLE_DEVICES": "", "FASTFAIR_SHARED_DATA": str(SHARED)}
    return [sys.executable, str(root / "bench" / "lease" / "gpu_suite.py"), "--smoke", "--out", str(out),
            "--pack", str(pack)], env


def gpu_suite_smoke() -> tuple[Path, subprocess.CompletedProcess]:
    """One GPU suite --smoke per pytest run (every bench part at tiny sizes; tests/test_gpu_suite.py and
    tests/test_bench_smoke.py read its files): (its --out folder, the process). Its --pack folder is beside --out."""
    import json

    def make(folder: Path) -> None:
        cmd, env = gpu_suite_smoke_command(folder / "r", folder / "packed")
        proc = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True, text=True,
                              timeout=1800)
        (folder / "proc.json").write_text(json.dumps({"args": cmd, "returncode": proc.returncode,
                                                      "stdout": proc.stdout, "stderr": proc.stderr}))

    folder = once_per_run("gpu-suite-smoke", make)
    return folder / "r", subprocess.CompletedProcess(**json.loads((folder / "proc.json").read_text()))
