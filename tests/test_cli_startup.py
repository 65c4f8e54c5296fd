"""A mistake costs no seconds of imports (issue 57, item 6): a refused command says its one ``fastfair: error:`` line
without importing what it does not need, checked in a fresh process (one for every refused command) by what it
imported (deterministic, unlike a timing; bench/cli_startup.py measures the seconds)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "matplotlib", "fastfair.training.trainer")
REFUSED = [
    (["eval", "runs/nosuch"], "no checkpoint at runs/nosuch; pass a run directory or a .pt file"),
    (["eval", "runs/nosuch", "--attacks", "aa", "--per-class", "20"], "no checkpoint at runs/nosuch"),
    (["eval", "runs/nosuch/checkpoints/last.pt", "--checkpoint", "last"], "no checkpoint at runs/nosuch/checkpoints"),
    (["diagnose", "nosuch.pt"], "no checkpoint at nosuch.pt"),
    (["data", "features", "robust", "runs/nosuch", "--out", "f.npz"], "no checkpoint at runs/nosuch"),
    (["train", "--bogus"], "No such option: --bogus"),
    (["trian"], "No such command 'trian'"),
    (["eval"], "Missing argument"),
]
REFUSED_TRAINING = [
    (["train", "--method", "nosuch"], "unknown method 'nosuch'. Known: absld"),
    (["train", "--method", "me-trade"], "unknown method 'me-trade'. Did you mean me-trades"),
    (["train", "--config", "demo", "--set", "train.lrr=0.1"], "unknown config key 'train.lrr' (from --set). Did you "
                                                               "mean train.lr"),
    (["train", "--set", "nosuch.key=1"], "unknown config key 'nosuch.key' (from --set)."),
    (["train", "--method", "trades", "--set", "method.klweight=6"], "Did you mean method.kl_weight?"),
    (["train", "--config", "demo", "--set", "train.amp=fp16"], "train.amp='fp16' is not one of auto, bf16, off. Did "
                                                                "you mean bf16?"),
    (["train", "--model", "resnet"], "model.name='resnet' is not one of"),
    (["train", "--set", "train.lr=fast"], "train.lr takes a float; got 'fast'"),
    (["train", "--epochs", "two"], "train.epochs takes an integer; got 'two'"),
]
# Every refused command in one fresh process (one interpreter start, not 17), each in a folder of its own: its exit
# code, its stderr and the heavy modules imported so far, as JSON on stdout's last line. Imports only accumulate, so a
# command that imports torch shows as the first whose list is not empty.
PROBE = """\
import contextlib, io, json, os, sys
from fastfair import cli
said = []
for i, args in enumerate(json.loads(sys.argv[1])):
    os.makedirs(str(i)); os.chdir(str(i))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = cli.main(args)
    os.chdir("..")
    said.append([code, err.getvalue(), sorted(m for m in HEAVY if m in sys.modules)])
print(json.dumps(said))
""".replace("HEAVY", repr(HEAVY))


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> dict:
    """{args: (its exit code, its stderr, the heavy modules imported by then, the folder it ran in)} of every
    ``fastfair ARGS`` above."""
    cases = [args for args, _ in REFUSED + REFUSED_TRAINING]
    where = tmp_path_factory.mktemp("refused")
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(cases)], capture_output=True, text=True, cwd=where,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    return {tuple(args): (*result, where / str(i)) for i, (args, result) in enumerate(zip(cases, said))}


def _one_error_line(code: int, stderr: str) -> str:
    err = stderr.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("fastfair: error: "), stderr
    return err[0]


@pytest.mark.parametrize("args, says", REFUSED)
def test_a_refused_command_says_so_without_importing_torch(args, says, refused):
    code, stderr, imported, _ = refused[tuple(args)]
    line = _one_error_line(code, stderr)
    assert says in line and imported == [], (line, imported)


@pytest.mark.parametrize("args, says", REFUSED_TRAINING)
def test_a_refused_training_says_so_without_importing_torch(args, says, refused):
    """A mistyped method, key or value is refused from fastfair/known.json (tests/test_known.py: the registries' copy,
    the full check's line) before torch loads."""
    code, stderr, imported, where = refused[tuple(args)]
    line = _one_error_line(code, stderr)
    assert says in line and imported == [], (line, imported)
    assert not (where / "runs").exists()


def test_import_fastfair_is_instant_and_its_names_still_load():
    probe = ("import sys, fastfair; assert 'torch' not in sys.modules; fastfair.UserError; "
             "assert 'torch' not in sys.modules; fastfair.evaluate; print(fastfair.evaluate.__module__, "
             "'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["fastfair.api", "True"], done.stderr
