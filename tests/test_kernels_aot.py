"""bench/lease/kernels_aot.py: every kernel specialisation the wrappers launch compiles for sm_80 and sm_90 (no GPU),
within the register ceiling, and the enumeration covers what a real training step launches.

The script's --smoke runs once in a subprocess without the Triton interpreter: it enumerates every specialisation
from the training steps but compiles one per kernel (6 compiles, not 68: 70 CPU s less). Every specialisation's
compile, registers and spills are the committed results' (bench/results/kernels-aot-triton<version>.json), checked
here to be today's: the same kernels' sources, the same specialisations, the same registers for the sample compiled
now. The coverage test runs real training steps here, under the interpreter, and compares the kernels' own launch
arguments with the compiled specialisations.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastfair import config
from fastfair.attacks.pgd import OBJECTIVES
from fastfair.methods import METHODS
from fastfair.training.trainer import Trainer
from helpers import once_per_run

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow

BLOCKS = ("BLOCK_R", "BLOCK_C")  # tile sizes: the interpreter picks bigger tiles than a GPU (kernels/fused_loss.py)
SMS = {"sm_80": 108, "sm_90": 132}  # A100, H100 SXM
REGENERATE = "run `python bench/lease/kernels_aot.py` and commit bench/results/kernels-aot-triton*"


@pytest.fixture(scope="module")
def smoke():
    """(the --smoke process, its record), made once per pytest run (helpers.once_per_run)."""
    def make(out: Path) -> None:
        # one thread: the traced steps are a tiny CNN's, and OpenMP threads that spin on a shared machine burn CPU for
        # nothing (tests/test_bench_smoke.py's ONE_THREAD)
        env = {**{k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}, "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}
        script = ROOT / "bench" / "lease" / "kernels_aot.py"
        proc = subprocess.run([sys.executable, str(script), "--smoke", "--out", str(out)], env=env,
                              capture_output=True, text=True, timeout=1200)
        (out / "proc.json").write_text(json.dumps({"args": proc.args, "returncode": proc.returncode,
                                                   "stdout": proc.stdout, "stderr": proc.stderr}))

    out = once_per_run("kernels-aot-smoke", make)
    proc = subprocess.CompletedProcess(**json.loads((out / "proc.json").read_text()))
    files = list(out.glob("kernels-aot-smoke-triton*.json"))
    assert files, proc.stdout + proc.stderr
    return proc, json.loads(files[0].read_text())


@pytest.fixture(scope="module")
def aot(smoke):
    """The committed results of every specialisation, for this triton; the smoke process and record checked first."""
    proc, record = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert not [r for r in record["rows"] if "error" in r]
    triton = record["header"]["triton"]
    path = ROOT / "bench" / "results" / f"kernels-aot-triton{triton}.json"
    assert path.is_file(), f"no committed results for triton {triton}: {REGENERATE}"
    return json.loads(path.read_text())


def test_the_committed_results_are_todays(smoke, aot):
    """The committed rows hold for today's kernels: every specialisation's registers and spills follow from the
    kernel's source (its JIT cache key: its jitted callees too), the specialisation (signature, constexprs, alignment,
    warps, stages), the target and triton's version (ptxas is triton's own)."""
    _, record = smoke
    assert aot.get("kernel_sources") == record["kernel_sources"], f"a kernel changed: {REGENERATE}"
    assert aot.get("specialisations") == record["specialisations"], f"the launches changed: {REGENERATE}"
    assert aot["derived"]["row_loss"] == record["derived"]["row_loss"]
    # the sample compiled now: one specialisation of each kernel for both targets, as committed
    usage = ("registers", "spill_stores", "spill_loads", "stack_frame", "shared_bytes", "num_warps", "constexprs")
    committed = {(r["specialisation"], r["target"]): {k: r[k] for k in usage} for r in aot["rows"]}
    now = {(r["specialisation"], r["target"]): {k: r[k] for k in usage} for r in record["rows"]}
    assert {r["kernel"] for r in record["rows"]} == {"_row_loss_kernel", "_pgd_step_kernel", "_random_start_kernel"}
    assert len(now) == 6 and all(committed[key] == value for key, value in now.items()), now


def test_every_specialisation_compiles_for_both_targets(aot):
    assert not [r for r in aot["rows"] if "error" in r]
    targets = {}
    for r in aot["rows"]:
        targets.setdefault(r["specialisation"], set()).add(r["target"])
    assert set(map(frozenset, targets.values())) == {frozenset({"sm_80", "sm_90"})}
    assert sorted(targets) == list(range(len(aot["specialisations"])))  # every one enumerated today
    assert aot["header"]["device"].startswith("none")


def ceiling(target, warps, ctas):
    """Registers at which the grid is resident in one wave, or the SM full: 65536 registers, 2048 threads, 32 CTAs."""
    per_sm = min(-(-ctas // SMS[target]), 2048 // (32 * warps), 32)
    return min(255, 65536 // (per_sm * 32 * warps) // 8 * 8)


def failures(record):
    out = set()
    for r in record["rows"]:
        key = (r["launch"], r["N"], r.get("C"), r["dtype"], r["target"])
        if r["spill_stores"] or r["spill_loads"]:
            out.add((*key, "spill"))
        if r["registers"] > ceiling(r["target"], r["num_warps"], r["ctas"]):
            out.add((*key, "registers"))
    return out


def test_the_script_applies_the_stated_ceiling(aot, smoke):
    for record in (aot, smoke[1]):
        assert all(r["ceiling"] == ceiling(r["target"], r["num_warps"], r["ctas"]) for r in record["rows"])
        assert len(record["failures"]) == len(failures(record))


def test_no_spills_and_registers_within_the_ceiling(aot):
    assert not failures(aot)


@pytest.fixture
def launched(monkeypatch):
    """The keyword arguments (constexprs) of every kernel launch that runs, by kernel name."""
    from fastfair.kernels import fused_loss, pgd

    seen = []
    for module in (fused_loss, pgd):
        wrap = module.launcher

        def recording(kernel, wrap=wrap):
            launch = wrap(kernel)
            name = getattr(kernel, "__name__", None) or kernel.fn.__name__

            class Grid:
                def __getitem__(self, grid):
                    def run(*args, **kwargs):
                        seen.append((name, {k: v for k, v in kwargs.items() if k not in BLOCKS and k != "num_warps"}))
                        return launch[grid](*args, **kwargs)
                    return run
            return Grid()

        monkeypatch.setattr(module, "launcher", recording)
    return seen


def test_enumeration_covers_what_training_launches(aot, launched, tmp_path):
    """Real training steps of every method (and PGD-AT with every attack objective) launch only compiled
    specialisations: their constexprs, tiles aside, are those of a row the script compiled."""
    compiled = [(r["kernel"], r["constexprs"]) for r in aot["rows"]]
    runs = [(m, []) for m in METHODS] + [("pgd-at", [f"attack.objective={o}"]) for o in OBJECTIVES]
    for i, (method, sets) in enumerate(runs):
        if method.startswith("frl"):
            continue  # fine-tunes from a checkpoint; its term sets are TRADES' (the script covers it)
        small = ["train.kernels=triton", "train.compile=off", "train.progress=false", "attack.steps=1",
                 "data.batch_size=8", "model.width=4"]
        if method == "absld":  # distils: a teacher of the same model, its weights as they start
            start = Trainer(config.resolve("demo", {"method.name": "pgd-at", "model.name": "tiny-cnn"}, small),
                            tmp_path / f"{i}-teacher", quiet=True)
            torch.save(start._state(0), tmp_path / f"{i}-teacher.pt")
            sets = [f"method.teacher={tmp_path / f'{i}-teacher.pt'}"]
        cfg = config.resolve(None, {"method.name": method, "data.dataset": "digits", "model.name": "tiny-cnn"},
                             [*small, *sets])
        trainer = Trainer(cfg, tmp_path / str(i), quiet=True)
        trainer.model.train()
        trainer.train_step(*next(iter(trainer.train_loader)))
    assert {name for name, _ in launched} == {"_row_loss_kernel", "_pgd_step_kernel", "_random_start_kernel"}
    missing = [(name, kw) for name, kw in launched
               if not any(k == name and all(c.get(a) == v for a, v in kw.items()) for k, c in compiled)]
    assert not missing
