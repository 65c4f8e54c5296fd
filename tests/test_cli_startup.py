"""A mistake costs no seconds of imports (issue 57, item 6): a refused command says its one ``fastfair: error:`` line
without importing what it does not need, checked in a fresh process by what it imported (deterministic, unlike a
timing; bench/cli_startup.py measures the seconds)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# the CLI in a fresh process, then which of the heavy modules it imported: stdout's last line, as JSON
HEAVY = ("torch", "matplotlib", "fastfair.training.trainer")
PROBE = ("import json, sys; from fastfair import cli; code = cli.main(sys.argv[1:]); "
         f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules))); sys.exit(code)")


def _refused(args: list[str], tmp_path: Path) -> tuple[str, list[str]]:
    """(the one error line, the heavy modules imported) of ``fastfair ARGS`` run in ``tmp_path``."""
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and err[0].startswith("fastfair: error: "), (args, done.stderr)
    return err[0], json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args, says", [
    (["eval", "runs/nosuch"], "no checkpoint at runs/nosuch; pass a run directory or a .pt file"),
    (["eval", "runs/nosuch", "--attacks", "aa", "--per-class", "20"], "no checkpoint at runs/nosuch"),
    (["eval", "runs/nosuch/checkpoints/last.pt", "--checkpoint", "last"], "no checkpoint at runs/nosuch/checkpoints"),
    (["diagnose", "nosuch.pt"], "no checkpoint at nosuch.pt"),
    (["data", "features", "robust", "runs/nosuch", "--out", "f.npz"], "no checkpoint at runs/nosuch"),
    (["train", "--bogus"], "No such option: --bogus"),
    (["trian"], "No such command 'trian'"),
    (["eval"], "Missing argument"),
])
def test_a_refused_command_says_so_without_importing_torch(args, says, tmp_path):
    line, imported = _refused(args, tmp_path)
    assert says in line and imported == [], (line, imported)


@pytest.mark.parametrize("args, says", [
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
])
def test_a_refused_training_says_so_without_importing_torch(args, says, tmp_path):
    """A mistyped method, key or value is refused from fastfair/known.json (tests/test_known.py: the registries' copy,
    the full check's line) before torch loads."""
    line, imported = _refused(args, tmp_path)
    assert says in line and imported == [], (line, imported)
    assert not (tmp_path / "runs").exists()


def test_import_fastfair_is_instant_and_its_names_still_load():
    probe = ("import sys, fastfair; assert 'torch' not in sys.modules; fastfair.UserError; "
             "assert 'torch' not in sys.modules; fastfair.evaluate; print(fastfair.evaluate.__module__, "
             "'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0 and done.stdout.split() == ["fastfair.api", "True"], done.stderr
