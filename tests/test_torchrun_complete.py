"""A stop signal to fastfair-torchrun after the run's final result is written stops nothing (issue 58, item 9): it
said "interrupted ... during the final evaluation" and exited 143, so a scheduler read a finished job as stopped."""
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from fastfair.rundir import RunDir
from test_signals import ended, held, start, wait_held

BARRIER = "fastfair.scaleout.distributed:barrier"
# a run's third barrier is its last: the first before rank 0 writes into the folder, the second before the final
# evaluation, the third after it, once its result is written (fastfair/api.py's fit)
AFTER_THE_RESULT = 3


@pytest.mark.slow
@pytest.mark.fault
def test_sigterm_to_fastfair_torchrun_after_the_final_result_stops_nothing_and_exits_0(tmp_path):
    env, markers = held(tmp_path, BARRIER, AFTER_THE_RESULT)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # fastfair-torchrun, as pip installs it
    out = tmp_path / "run"
    proc = start(["fastfair-torchrun", "--nproc-per-node", "2", "-m", "fastfair", "train", "--config", "demo",
                  "--epochs", "1", "--quick", "4", "--quick-test", "2", "--device", "cpu", "--quiet", "--set",
                  "model.width=2", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm", "--set",
                  "eval.attacks=['clean']", "--set", "data.batch_size=20", "--out", str(out)], env)
    wait_held(markers, proc, count=2)
    proc.send_signal(signal.SIGTERM)  # to the launcher, as SLURM at the time limit: it passes it to the ranks
    code, _, err = ended(proc)
    said = [line for line in err.splitlines() if line.startswith("fastfair:") and "warning" not in line]
    assert said == ["fastfair: SIGTERM came after the run was complete (its final result is written); nothing was "
                    "stopped"], err[-3000:]
    assert code == 0 and "Traceback" not in err, err[-3000:]
    (result,) = RunDir(out).eval_files()
    assert json.loads(result.read_text())["results"]["clean"]["per_class"]
