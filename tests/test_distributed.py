"""torchrun DDP with gloo on CPU: 2 processes give what 1 process gives on the same global batch, and each
rank ends its process group before its interpreter exits.

A torchrun costs its launcher's and each rank's interpreter and torch import (about 5 CPU s a process), which is
what these tests pay, once: one launch (:func:`launched`, once per test run) trains both tests' runs in turn, each
rank running one command after the other (tests/torchrun_rank.py); the training is the demo's cut to 20 images a
class (a few steps a rank), the one-process run in this process (helpers.fastfair): the process boundary is what
the torchrun side tests."""
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import fastfair, once_per_run

ROOT = Path(__file__).parents[1]
# No BN (per-rank batch statistics would differ; SyncBatchNorm needs CUDA) and no random PGD start
# (ranks draw their own streams): what is left must match up to float summation order, so fp32 (bf16
# autocast, auto on a CPU with native bf16, rounds a half batch differently from the whole one).
ARGS = ["train", "--config", "demo", "--method", "pgd-at", "--device", "cpu", "--quiet", "--set", "train.amp=off",
        "--set", "train.epochs=2", "--set", "model.norm=none", "--set", "model.width=8",
        "--set", "attack.init=none", "--set", "attack.steps=2", "--set", "train.val_attack=fgsm",
        "--set", 'eval.attacks=["clean", "fgsm"]', "--set", "data.train_per_class=20"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _port() -> int:
    # a port free now, not a fixed one: two checkouts testing at once on one machine must not meet
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun() -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(_port())]


# test_a_loss_with_two_forwards_through_batchnorm_trains_under_torchrun's run: the demo preset's TRADES, BatchNorm on
TRADES_BN = ["train", "--config", "demo", "--epochs", "1", "--device", "cpu", "--quiet", "--set", "model.width=4",
             "--set", "attack.steps=1", "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean']",
             "--set", "data.train_per_class=20"]


def launched() -> tuple[subprocess.CompletedProcess, Path]:
    """(the one torchrun launch of these tests, as finished, the folder holding its runs): ARGS into ``two``, then
    TRADES_BN into ``run``, then test_signals' RANKS into ``one-go`` (the 2-rank run trained in one go that its
    torchrun test's stopped and resumed one must end as), in the same two ranks; launched once per test run
    (helpers.once_per_run), its exit code and stderr kept for each test to check."""
    def launch(folder: Path) -> None:
        from test_signals import RANKS

        proc = subprocess.run([*_torchrun(), str(ROOT / "tests" / "torchrun_rank.py"), *ARGS, "--out",
                               str(folder / "two"), "--then", *TRADES_BN, "--out", str(folder / "run"), "--then",
                               *RANKS, "--out", str(folder / "one-go")],
                              env={**_env(), "FASTFAIR_TEST_PORTS": f"{_port()} {_port()}"}, cwd=ROOT,
                              capture_output=True, text=True)
        (folder / "returncode").write_text(str(proc.returncode))
        (folder / "stderr").write_text(proc.stderr)

    folder = once_per_run("torchrun-launch", launch)
    return subprocess.CompletedProcess("torchrun", int((folder / "returncode").read_text()), "",
                                       (folder / "stderr").read_text()), folder


def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.fault
def test_two_processes_match_one_process(tmp_path):
    one = tmp_path / "one"
    done = fastfair(*ARGS, "--out", one)
    assert done.returncode == 0, done.stderr[-3000:]
    proc, runs = launched()
    two = runs / "two"
    assert proc.returncode == 0, proc.stderr[-3000:]
    # no process-group thread outlives fastfair: one left at interpreter exit is what aborted rank 1 under load
    # ("terminate called without an active exception"; fastfair/scaleout/distributed.py, init). This run is the
    # launch's first: the lines of its end, before the second starts
    assert sorted(re.findall(r"^run 1: rank (\d) threads left: (\[.*?\])", proc.stderr, re.M)) == [
        ("0", "[]"), ("1", "[]")], proc.stderr[-3000:]

    m1, m2 = _metrics(one), _metrics(two)
    assert len(m1) == len(m2) == 2  # rank 1 wrote no second copy of the log
    for a, b in zip(m1, m2):
        # per-class training counters all-reduced over ranks: identical percentages of identical totals
        assert a["train_robust_acc_per_class"] == pytest.approx(b["train_robust_acc_per_class"], abs=1e-9)
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        # validation split across ranks, confusion matrices summed
        for attack in ("clean", "fgsm"):
            assert a["val"][attack]["per_class"] == pytest.approx(b["val"][attack]["per_class"], abs=1e-9)
    assert m1[1]["loss"] != pytest.approx(m1[0]["loss"], rel=1e-3)  # the model did train
    e1, e2 = (json.loads((r / "eval" / "best_pgd-test.json").read_text())["results"] for r in (one, two))
    for attack in ("clean", "fgsm"):
        assert e1[attack]["confusion"] == e2[attack]["confusion"]
        assert sum(map(sum, e2[attack]["confusion"])) == 360  # the whole digits test split, once
        assert e1[attack]["per_image"] == e2[attack]["per_image"]  # each rank's images put back in the split's order


@pytest.mark.slow
def test_a_loss_with_two_forwards_through_batchnorm_trains_under_torchrun():
    """TRADES' loss runs the model twice (clean, adversarial). With DDP broadcasting rank 0's BatchNorm statistics
    into every rank's at each forward, the second broadcast changed what the first forward saved for its backward,
    and torch 2.11 stopped the run ("modified by an inplace operation"; .ci/run runs this file on 2.11 too)."""
    proc, runs = launched()  # its run is the launch's second, after test_two_processes_match_one_process's
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(_metrics(runs / "run")) == 1
