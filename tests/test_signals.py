"""Stop signals (issue 40): SIGTERM and SIGUSR1 end every command as Ctrl-C does (one line saying what was kept,
the lock released, exit code 128 + the signal), training stops at a step boundary and saves there, and
``--resume`` continues to the weights of an uninterrupted run, in one process and under torchrun; grid and
reproduce stop their children, say what each kept and resume them; a submitit array task requeues itself. A second
Ctrl-C ends a process whose training step is stuck in native code (issue 57), naming the checkpoint to resume.

The subprocess tests signal a real ``fastfair`` process at a point the test controls: ``tests/hold`` holds the
N-th call of a function until a signal arrives (:func:`held`), and the test signals once the holder's marker
file is there.
"""
import importlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from fastfair import cli, stopping
from fastfair.errors import UserError
from fastfair.rundir import RunDir
from fastfair.scaleout.grid import run_grid
from fastfair.scaleout.jobs import read_state
import helpers
from helpers import needs_extra
from shared_runs import figures_unrendered

from test_distributed import launched
from test_grid import _alive

ROOT = Path(__file__).parents[1]
HOLD = Path(__file__).parent / "hold"
STEP = "fastfair.training.trainer:Trainer.train_step"
# the demo preset (learning-rate milestones at epochs 10 and 13) cut to a 4-channel tiny CNN, one attack step and 2
# epochs of 4 steps (ME-TRADES: its random start draws from the global stream the resume restores), the final
# evaluation clean on 2 test images a class: a process costs its imports and little more. --epochs 2 puts the
# milestones past its end, a warning when it starts, which --resume (every setting from the run folder) must not
# refuse (test_printed_commands)
TRAIN = ["train", "--config", "demo", "--epochs", "2", "--quick", "10", "--quick-test", "2", "--device", "cpu",
         "--quiet", "--set", "model.width=4", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm",
         "--set", "eval.attacks=['clean']", "--set", "data.batch_size=25"]


def held(tmp_path: Path, target: str, n: int, name: str = "held") -> tuple[dict, Path]:
    """(the environment of a process whose ``n``-th call of ``target`` (module:function) waits for a stop signal,
    the folder where each such process writes its pid as it starts waiting). One thread: equal sums every run."""
    markers = tmp_path / name
    markers.mkdir()
    return {**os.environ, "PYTHONPATH": f"{HOLD}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1",
            "FASTFAIR_TEST_HOLD": f"{target}:{n}:{markers}"}, markers


def wait_held(markers: Path, starter: subprocess.Popen | threading.Thread, count: int = 1,
              timeout: float = 300) -> list[int]:
    """The pids of the ``count`` processes held, once all are waiting; ``starter`` (the process or thread that
    starts them) must not end meanwhile."""
    deadline = time.time() + timeout
    while len(pids := [int(p.name) for p in markers.iterdir() if p.name.isdigit()]) < count:
        if isinstance(starter, threading.Thread):
            assert starter.is_alive(), "the thread starting them ended"
        else:
            assert starter.poll() is None, starter.communicate()
        assert time.time() < deadline, f"no process held within {timeout} s"
        time.sleep(0.02)
    return pids


def release(markers: Path) -> None:
    """From now on no process holds (a rerun goes through)."""
    (markers / "released").write_text("")


def _as_from_a_shell():
    """The child gets the stop signals as a shell's job does: neither ignored nor blocked, whatever the test
    worker inherited."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, set(stopping.SIGNALS))
    for sig in stopping.SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


def start(args: list, env: dict, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(args, env=env, cwd=kwargs.pop("cwd", ROOT), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_as_from_a_shell, **kwargs)


def ended(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"no end within {timeout} s after the signal: {proc.communicate()[1][-2000:]}")
    return proc.returncode, out, err


def lines(err: str) -> list[str]:
    """stderr's lines but the config warnings every tiny run prints (epochs shorter than the preset's schedule)."""
    return [line for line in err.strip().splitlines() if not line.startswith("fastfair: warning:")]


def released_lock(run: Path) -> bool:
    lock = RunDir(run).lock_file
    return RunDir(run).locked_by() == "" and (not lock.exists() or lock.read_text() == "")


def in_process(*args) -> subprocess.CompletedProcess:
    """``fastfair ARGS`` in this process (a rerun or resume: the process boundary is the held run's, not its), on one
    thread as the held processes run, so its sums are theirs bit for bit (conftest puts the test's count back)."""
    torch.set_num_threads(1)
    return helpers.fastfair(*args)


def as_printed(command: str) -> subprocess.CompletedProcess:
    """``command`` (``fastfair ...``, as fastfair printed it) split as a user's shell splits it, then run."""
    argv = shlex.split(command)
    assert argv[0] == "fastfair", command
    return in_process(*argv[1:])


def continue_with(err: str) -> str:
    """The command of the one ``continue with:`` line fastfair printed."""
    found = re.findall(r"continue with: (fastfair .+)$", err, re.M)
    assert len(found) == 1, err
    return found[0]


def _next(printed: str) -> list[str]:
    """The commands of the ``next:`` lines a command ended with."""
    return re.findall(r"^  (fastfair .+?)\s+# ", printed.split("\nnext:\n")[-1], re.M) if "\nnext:\n" in printed else []


def follow_next(printed: str, out: Path, other: Path) -> list[str]:
    """Runs the ``next:`` lines ``printed`` ends with, each as printed, then those each of them ends with (OTHER_RUN:
    ``other``, a copy of the run ``out``); the commands run, in order."""
    todo, ran = _next(printed), []
    while todo:
        command = todo.pop(0)
        if command in ran:
            continue
        ran.append(command)
        if "OTHER_RUN" in command and not other.exists():
            shutil.copytree(out, other)
        done = as_printed(command.replace("OTHER_RUN", str(other)))
        assert done.returncode == 0, (command, done.stderr)
        todo += _next(done.stdout)
    return ran


def weights(run: Path) -> dict:
    return torch.load(RunDir(run).last, weights_only=True)["model"]


def metrics(run: Path) -> list[dict]:
    """metrics.jsonl without its timings."""
    return [{k: v for k, v in m.items() if k not in ("epoch_time_s", "images_per_s")}
            for m in RunDir(run).read_metrics()]


# ---- the handler, in this process ------------------------------------------------------------------

@pytest.fixture
def fresh_handlers():
    """The stop signals' dispositions of a fresh Python process, restored after the test."""
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
                signal.SIGUSR1: signal.SIG_DFL}
    previous = {s: signal.signal(s, d) for s, d in defaults.items()}
    yield
    for s, handler in previous.items():
        signal.signal(s, handler)


def _send(sig):
    os.kill(os.getpid(), sig)
    time.sleep(0.01)  # Python runs the handler at the next bytecode; give the kernel the moment it needs


@pytest.mark.fault
def test_a_signal_outside_a_block_stops_at_once_and_is_named(fresh_handlers):
    for sig, code, by in ((signal.SIGTERM, 143, " by SIGTERM"), (signal.SIGUSR1, 138, " by SIGUSR1"),
                          (signal.SIGINT, 130, "")):
        with pytest.raises(stopping.Stopped) as stop, stopping.handled():
            _send(sig)
        assert stop.value.signum == sig and stopping.exit_code(sig) == code and stopping.said_by(sig) == by
        assert isinstance(stop.value, KeyboardInterrupt)  # so every Ctrl-C cleanup runs for it too
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back as found
    assert stopping.requested() == 0  # and nothing carries over to the next command in the process


@pytest.mark.fault
def test_a_held_block_runs_whole_and_a_deferred_one_records_until_its_boundary(fresh_handlers):
    done = []
    with pytest.raises(stopping.Stopped) as stop:
        with stopping.held():
            _send(signal.SIGTERM)
            _send(signal.SIGINT)  # not even a second signal, nor Ctrl-C, cuts an atomic write
            done.append(True)
    assert done and stop.value.signum == signal.SIGTERM  # raised as the block ended, with the first signal
    with stopping.handled():
        with pytest.raises(stopping.Stopped) as stop:
            with stopping.deferred():
                _send(signal.SIGUSR1)
                _send(signal.SIGTERM)  # a cluster's second signal (a grid's SIGTERM after SLURM's USR1) waits too
                assert stopping.requested() == signal.SIGUSR1  # what a step boundary reads
                done.append(True)
        assert len(done) == 2 and stop.value.signum == signal.SIGUSR1
    with stopping.handled(), pytest.raises(stopping.Stopped), stopping.deferred():
        _send(signal.SIGINT)
        with pytest.raises(stopping.Stopped):
            _send(signal.SIGINT)  # a person pressing Ctrl-C twice means now


def test_a_callers_own_handler_and_an_ignored_signal_are_left_alone(fresh_handlers):
    seen = []
    signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    with stopping.handled():
        _send(signal.SIGTERM)
        _send(signal.SIGUSR1)
        assert stopping.requested() == 0
    assert seen == [signal.SIGTERM]


@pytest.mark.fault
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
@pytest.mark.parametrize("argv, module, function, says", [
    (["eval", "m.pt"], "fastfair.evaluation.per_class", "evaluate_checkpoint", "this evaluation wrote no result"),
    (["diagnose", "m.pt"], "fastfair.evaluation.diagnose", "diagnose_checkpoint", "no diagnostics were written"),
    (["grid", "g.toml"], "fastfair.scaleout.grid", "run_grid", "the grid's runs stopped with it"),
    (["reproduce", "cfa-t1"], "fastfair.reproduce.command", "reproduce", "the table's runs stopped with it"),
    (["report", "r"], "fastfair.reports.report", "write_report", ""),  # a command that keeps nothing
])
def test_a_signal_in_any_command_is_one_line_and_128_plus_its_number(argv, module, function, says, sig, monkeypatch,
                                                                      capsys, tmp_path):
    def signalled(*args, **kwargs):
        raise stopping.Stopped(sig)
    monkeypatch.setattr(importlib.import_module(module), function, signalled)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.pt").touch()  # a checkpoint that is there: a missing one is refused before the command starts
    assert cli.main(argv) == 128 + sig
    err = capsys.readouterr().err.strip().splitlines()
    name = signal.Signals(sig).name
    assert len(err) == 1 and err[0].startswith(f"fastfair: interrupted by {name}") and says in err[0], err


# ---- train: one process -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The run the stopped ones are compared with, trained in one go, in this process on one thread (as the held
    processes and the in-process resumes)."""
    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    threads = torch.get_num_threads()  # a module's fixture: set up before conftest's per-test guard reads the count
    try:
        r = in_process(*TRAIN, "--out", out)
    finally:
        torch.set_num_threads(threads)
    assert r.returncode == 0, r.stderr
    return out


@pytest.mark.fault
@pytest.mark.slow
def test_sigterm_mid_epoch_saves_at_the_step_and_resume_gives_the_uninterrupted_weights(tmp_path, uninterrupted,
                                                                                        monkeypatch):
    """A run shortened with --epochs (its milestones past its end) stopped by SIGTERM mid-epoch: its continue with:
    line, pasted as printed, finishes it to the uninterrupted weights, the milestones' warning said again; then each
    next: command it ends with, and theirs, works as printed (issue 49, items 5-8)."""
    out = tmp_path / "run"
    env, markers = held(tmp_path, STEP, 2)
    proc = start([sys.executable, "-m", "fastfair", *TRAIN, "--out", str(out)], env)
    (pid,) = wait_held(markers, proc)
    os.kill(pid, signal.SIGTERM)  # while step 2 is about to run: it runs, and training stops after it
    code, _, err = ended(proc)
    said = (f"fastfair: interrupted by SIGTERM in epoch 1 of 2 (2 of 4 steps saved); continue with: fastfair train "
            f"--out {out} --resume")
    assert code == 143 and lines(err) == [said], err
    assert RunDir(out).train_log.read_text().splitlines()[-1] == said  # the run's log says how it ended
    assert released_lock(out) and not list(out.rglob("*.tmp"))
    saved = torch.load(RunDir(out).interrupted, weights_only=True)
    assert (saved["epoch"], saved["step"], saved["steps"]) == (0, 2, 4) and not RunDir(out).last.exists()

    r = as_printed(continue_with(err))
    assert r.returncode == 0 and "taking over" not in r.stderr, r.stderr
    assert "(the saved run's value; to see it act: --set train.lr_milestones=[1])" in r.stderr  # still said
    assert f"resuming {out} in epoch 1 of 2 after step 2 of 4" in RunDir(out).train_log.read_text()
    assert [(h["event"], h["epoch"], h.get("step")) for h in RunDir(out).read_history()] == [
        ("start", 1, None), ("resume", 1, 2)]
    assert not RunDir(out).interrupted.exists()  # its epoch is whole in last.pt now
    expected = weights(uninterrupted)
    got = weights(out)
    assert all(torch.equal(got[k], expected[k]) for k in expected)  # bit for bit
    assert metrics(out) == metrics(uninterrupted)  # the interrupted epoch's loss and counts too
    # the next: lines do not depend on how the run stopped (SIGUSR1 and a full disk: test_printed_commands); their
    # reports' figures are made, not rendered: that the commands work as printed is the subject (test_report renders)
    figures_unrendered(monkeypatch)
    assert follow_next(r.stdout, out, tmp_path / "other") == [
        f"fastfair eval {out} --attacks aa --per-class 2", f"fastfair report {out}", f"fastfair report {out} OTHER_RUN"]


@pytest.mark.fault
@pytest.mark.slow
def test_sigusr1_at_an_epoch_boundary_keeps_the_epoch_and_says_so(tmp_path):
    """SLURM's early warning: exit 138; a signal that lands after an epoch's last step stops before the next, and
    its continue with: line, pasted as printed, starts that one and finishes the shortened run, the milestones'
    warning said again (issue 49, item 5)."""
    out = tmp_path / "run"
    env, markers = held(tmp_path, STEP, 4)  # the first epoch's last step
    proc = start([sys.executable, "-m", "fastfair", *TRAIN, "--out", str(out)], env)
    (pid,) = wait_held(markers, proc)
    os.kill(pid, signal.SIGUSR1)
    code, _, err = ended(proc)
    assert code == 138 and lines(err) == [f"fastfair: interrupted by SIGUSR1 in epoch 2 of 2 (1 saved); continue "
                                          f"with: fastfair train --out {out} --resume"], err
    assert released_lock(out) and [m["epoch"] for m in RunDir(out).read_metrics()] == [1]
    assert not RunDir(out).interrupted.exists()  # the epoch boundary: last.pt is the state
    # an interrupted.pt older than last.pt (a kill between an epoch's checkpoint and the file's removal) goes
    stale = {**torch.load(RunDir(out).last, weights_only=True), "epoch": 0, "step": 3, "steps": 4, "ranks": [{}]}
    torch.save(stale, RunDir(out).interrupted)
    r = as_printed(continue_with(err))
    assert r.returncode == 0 and not RunDir(out).interrupted.exists(), r.stderr
    assert "(the saved run's value; to see it act: --set train.lr_milestones=[1])" in r.stderr  # still said
    assert f"removed {RunDir(out).interrupted}: its epoch 1 is whole in last.pt" in RunDir(out).train_log.read_text()
    assert [(h["event"], h["epoch"], h.get("step")) for h in RunDir(out).read_history()][-1] == ("resume", 2, None)
    assert [m["epoch"] for m in RunDir(out).read_metrics()] == [1, 2]  # the run ended as started: 2 epochs


# ---- a step stuck in native code: a second Ctrl-C ends the process at once (issue 57 item 4) -------------------

# A call that never returns to Python and lets no signal end it, as oneDNN's hung AVX2 kernel did: a zeroed
# pthread_mutex_t (glibc's PTHREAD_MUTEX_INITIALIZER) locked twice by one thread waits on a futex for good, the GIL
# released as ctypes does for every foreign call.
STUCK = """
import ctypes
mutex = ctypes.create_string_buffer(64)
ctypes.CDLL(None).pthread_mutex_lock(mutex)
ctypes.CDLL(None).pthread_mutex_lock(mutex)
"""


FUTEX = {"x86_64": "202", "aarch64": "98"}  # the futex system call's number


def _wait_until_stuck(proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until the process's main thread sleeps in the kernel on a futex (STUCK's second lock), seen twice 0.1 s apart:
    a signal sent after the marker file but before that finds the step still in Python, whose handler takes it (no
    notice then; the test waited for one in vain on a loaded machine). A GIL wait is a futex too, hence twice."""
    deadline, seen = time.time() + timeout, 0
    while seen < 2:
        assert proc.poll() is None and time.time() < deadline, "the step never blocked in native code"
        try:
            state = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            wchan = Path(f"/proc/{proc.pid}/wchan").read_text()  # "0" where the kernel hides it: the syscall's number
            blocked = state == "S" and ("futex" in wchan or (wchan == "0" and Path(
                f"/proc/{proc.pid}/syscall").read_text().split()[0] == FUTEX.get(os.uname().machine)))
        except OSError:
            blocked = False
        seen = seen + 1 if blocked else 0
        time.sleep(0.1)


def _stderr_lines(path: Path, want: int, proc: subprocess.Popen, timeout: float = 60) -> list[str]:
    """stderr's lines (written to ``path``) once it has ``want``; the process must not end meanwhile."""
    deadline = time.time() + timeout
    while len(got := path.read_text().splitlines()) < want:
        assert proc.poll() is None and time.time() < deadline, path.read_text()
        time.sleep(0.05)
    return got


@pytest.mark.fault
def test_a_block_that_returns_to_python_stops_as_before_with_nothing_more_said(fresh_handlers, capfd):
    with stopping.handled(), pytest.raises(stopping.Stopped) as stop:
        with stopping.deferred(at_once=lambda: "never said"):
            _send(signal.SIGINT)
            assert stopping.requested() == signal.SIGINT  # the caller's next boundary: it knows, and is stopping
            time.sleep(3 * stopping.GRACE_S)  # (its checkpoint's write) the watcher neither speaks nor ends
            _send(signal.SIGINT)  # the handler raises it, as without the watcher
    assert stop.value.signum == signal.SIGINT and capfd.readouterr().err == ""
    assert not [t for t in threading.enumerate() if t.name == "fastfair-stop-watcher"]  # ended with its block


@pytest.mark.fault
def test_a_ctrl_c_python_took_but_no_boundary_saw_for_a_second_is_answered(fresh_handlers, capfd):
    """The race a stuck step's first Ctrl-C can lose: Python's handler takes it just before the step blocks in native
    code (or the step, or validation, is merely long), and no boundary looks for a while. The watcher says so after
    a second, once, whether or not the handler took it; the caller stops at its boundary as before."""
    with stopping.handled(), pytest.raises(stopping.Stopped) as stop:
        with stopping.deferred(at_once=lambda: "never said"):
            _send(signal.SIGINT)
            time.sleep(0.1)
            assert stopping._received == [signal.SIGINT]  # Python's handler took it at once
            said, deadline = "", time.time() + 30  # the step that blocked: no boundary asks
            while not said and time.time() < deadline:  # due after a second; a loaded machine may be later
                time.sleep(stopping.GRACE_S)
                said = capfd.readouterr().err
            assert said.splitlines() == [stopping.NOTICE]
            assert stopping.requested() == signal.SIGINT
            time.sleep(2 * stopping.GRACE_S)
            _send(signal.SIGINT)
    assert stop.value.signum == signal.SIGINT and capfd.readouterr().err == ""  # said once


@pytest.mark.fault
def test_a_second_ctrl_c_ends_a_block_stuck_in_native_code_and_says_what_was_kept(tmp_path):
    marker, err = tmp_path / "stuck", tmp_path / "stderr"
    code = ("import sys\nfrom pathlib import Path\nfrom fastfair import stopping\n"
            "with stopping.handled(), stopping.deferred(at_once=lambda: 'the test kept this'):\n"
            "    Path(sys.argv[1]).write_text('')\n" + "".join(f"    {line}\n" for line in STUCK.strip().splitlines()))
    with err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", code, str(marker)], env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stderr=stderr, preexec_fn=_as_from_a_shell)
    try:
        while not marker.exists():
            assert proc.poll() is None, err.read_text()
            time.sleep(0.02)
        _wait_until_stuck(proc)  # into the native call
        proc.send_signal(signal.SIGINT)  # the first Ctrl-C: said once the block has not ended within a second
        assert _stderr_lines(err, 1, proc) == [stopping.NOTICE]
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        time.sleep(2 * stopping.GRACE_S)
        assert proc.poll() is None  # SIGTERM does not end it (two senders at once are common on a cluster)
        proc.send_signal(signal.SIGINT)  # a Ctrl-C after a stop was asked for: now
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    assert err.read_text().splitlines() == [stopping.NOTICE, "fastfair: the test kept this"]


@pytest.mark.fault
@pytest.mark.slow
def test_a_training_step_stuck_in_native_code_ends_on_a_second_ctrl_c_naming_the_checkpoint_to_resume(tmp_path):
    """The first epoch's 4 steps run; the second epoch's second never returns. Two Ctrl-C end the process, the line
    names last.pt (epoch 1), and --resume continues from it."""
    out, err, marker = tmp_path / "run", tmp_path / "stderr", tmp_path / "stuck"
    code = ("import sys\nfrom pathlib import Path\nfrom fastfair import cli\nfrom fastfair.training import trainer\n"
            "step, calls = trainer.Trainer.train_step, [0]\n"
            "def stuck(self, x, y):\n"
            "    calls[0] += 1\n"
            "    if calls[0] == 6:\n"
            f"        Path({str(marker)!r}).write_text('')\n"
            + "".join(f"        {line}\n" for line in STUCK.strip().splitlines()) +
            "    return step(self, x, y)\n"
            "trainer.Trainer.train_step = stuck\n"
            "sys.exit(cli.main(sys.argv[1:]))\n")
    with err.open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-c", code, *TRAIN, "--out", str(out)], cwd=ROOT, stderr=stderr,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
                                preexec_fn=_as_from_a_shell)
    try:
        deadline = time.time() + 300
        while not marker.exists():
            assert proc.poll() is None and time.time() < deadline, err.read_text()
            time.sleep(0.05)
        _wait_until_stuck(proc)
        proc.send_signal(signal.SIGINT)
        _stderr_lines(err, len(err.read_text().splitlines()) + 1, proc)  # the notice
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        proc.kill()
        proc.wait()
    assert lines(err.read_text())[-2:] == [
        stopping.NOTICE, f"fastfair: stopped at once by a second Ctrl-C inside a training step; the last whole "
        f"checkpoint is {RunDir(out).last} (epoch 1 of 2); continue with: fastfair train --out {out} --resume"]
    r = in_process(*TRAIN, "--out", out, "--resume")
    assert r.returncode == 0 and [m["epoch"] for m in RunDir(out).read_metrics()] == [1, 2], r.stderr


# ---- train: two ranks under torchrun, fastfair-torchrun, and on two nodes -------------------------------------

def free_port() -> int:
    """A port free now (two checkouts testing at once on one machine must not meet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# TRAIN with a global batch that divides by the 2 ranks: epochs of 5 steps
RANKS = [*TRAIN, "--set", "data.batch_size=20"]


def said_once(err: str) -> str:
    """The one ``fastfair: interrupted`` line of ``err`` (rank 0's)."""
    said = [line for line in err.splitlines() if line.startswith("fastfair: interrupted")]
    assert len(said) == 1, err[-3000:]
    return said[0]


@pytest.mark.fault
@pytest.mark.slow
def test_sigterm_to_torchrun_stops_both_ranks_at_one_step_and_resume_gives_the_uninterrupted_weights(tmp_path):
    """One 2-rank run stopped by SIGTERM three times, each time to another launcher, each line the launcher's own
    command with the options it was given: plain torchrun (its own traceback and exit 1 after the ranks' one line),
    fastfair-torchrun (one line, exit 143, no traceback), the launchers of two nodes meeting through a c10d
    rendezvous (on each node: ...). Each stop saves every rank's state at one step; each segment resumes with the
    printed command's arguments, the last as printed on each node, and the run ends with the weights of the same
    run trained in one go (issue 40; issue 49, item 6)."""
    path = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # the launchers
    one_go, runs = launched()  # RANKS trained in one go on 2 ranks, in test_distributed's launch (once per test run)
    assert one_go.returncode == 0, one_go.stderr[-3000:]
    out = tmp_path / "run"

    def stopped(launchers: list[list[str]], args: list[str], n: int, name: str) -> tuple[list[int], str, int]:
        """(the launchers' exit codes, their stderr, the first one's pid) of a segment of the run whose ranks are
        held before their n-th step, then sent SIGTERM through each launcher, as SLURM, docker stop or kill would:
        it passes it on to the ranks."""
        env, markers = held(tmp_path, STEP, n, name)
        env["PATH"] = path["PATH"]
        procs = [start([*launcher, "-m", "fastfair", *args], env) for launcher in launchers]
        wait_held(markers, procs[0], count=2)
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        ends = [ended(proc) for proc in procs]
        release(markers)
        assert released_lock(out) and not list(out.rglob("*.tmp"))
        assert len(torch.load(RunDir(out).interrupted, weights_only=True)["ranks"]) == 2  # every rank's streams, sums
        return [code for code, _, _ in ends], "".join(err for _, _, err in ends), procs[0].pid

    # plain torchrun: each rank runs its held step 1, sees its signal at the boundary after it, and the ranks agree
    # one step later; torchrun's launcher then ends with a traceback and exit code 1 whatever its ranks do (it raises
    # SignalException out of its main; fastfair runs nothing in that process): asserted too, so that
    # docs/reliability.md, which says so, hears of a torch that changes it
    torchrun = ["torchrun", "--nproc-per-node", "2", "--master-port", str(free_port())]
    codes, err, pid = stopped([torchrun], [*RANKS, "--out", str(out)], 1, "torchrun")
    go_on = f"{shlex.join(torchrun)} -m fastfair train --out {out} --resume"  # the launcher's options as given
    said = said_once(err)
    assert said == (f"fastfair: interrupted by SIGTERM in epoch 1 of 2 (2 of 5 steps saved); torchrun's own report "
                    f"after this line (exit code 1) is how it ends on a signal (fastfair-torchrun ends here); continue "
                    f"with: {go_on}"), err[-3000:]
    assert RunDir(out).train_log.read_text().splitlines()[-1] == said
    assert codes == [1] and err.rstrip().endswith("SignalException: Process %d got signal: 15" % pid), err[-3000:]
    assert "FutureWarning" not in err  # nor torch's notice about DDP's broadcast_buffers, on every run
    assert torch.load(RunDir(out).interrupted, weights_only=True)["step"] == 2

    # fastfair-torchrun, torchrun's options: the same stop in one line, exit 128 + 15, no traceback
    launcher = ["fastfair-torchrun", *torchrun[1:]]
    codes, err, _ = stopped([launcher], shlex.split(go_on)[len(torchrun) + 2:], 1, "fastfair-torchrun")
    go_on = f"{shlex.join(launcher)} -m fastfair train --out {out} --resume"
    assert said_once(err) == f"fastfair: interrupted by SIGTERM in epoch 1 of 2 (4 of 5 steps saved); continue with: " \
                             f"{go_on}", err[-3000:]
    assert [line for line in err.splitlines() if "warning: train.lr_milestones" not in line] == [said_once(err)], err
    assert codes == [143] and "Traceback" not in err and "SignalException" not in err, err[-3000:]
    assert [(h["event"], h["epoch"], h.get("step")) for h in RunDir(out).read_history()][-1] == ("resume", 1, 2)

    # two nodes: two torchrun launchers on this machine meeting through a c10d rendezvous, as two hosts would; SLURM
    # signals every node's launcher
    node = ["torchrun", "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
            f"127.0.0.1:{free_port()}", "--rdzv-id", "job7"]
    _, err, _ = stopped([node, node], shlex.split(go_on)[len(launcher) + 2:], 2, "nodes")
    go_on = f"{shlex.join(node)} -m fastfair train --out {out} --resume"
    assert said_once(err) == (f"fastfair: interrupted by SIGTERM in epoch 2 of 2 (1 epoch and 2 of 5 steps saved); "
                              f"torchrun's own report after this line (exit code 1) is how it ends on a signal "
                              f"(fastfair-torchrun ends here); continue with: on each of the 2 nodes: {go_on}"), err

    command = re.search(r"on each of the 2 nodes: (.+)$", said_once(err)).group(1)  # as printed, on each node
    env = {**path, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    resumed = [subprocess.Popen(shlex.split(command), env=env, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in resumed:
        _, node_err = proc.communicate(timeout=600)
        assert proc.returncode == 0 and "taking over" not in node_err, node_err[-3000:]
    assert [(h["event"], h["epoch"], h.get("step")) for h in RunDir(out).read_history()] == [
        ("start", 1, None), ("resume", 1, 2), ("resume", 1, 4), ("resume", 2, 2)]
    expected = weights(runs / "one-go")
    got = weights(out)
    assert all(torch.equal(got[k], expected[k]) for k in expected)  # bit for bit
    assert metrics(out) == metrics(runs / "one-go")


# ---- eval, diagnose, grid, reproduce -----------------------------------------------------------------

@pytest.mark.fault
@pytest.mark.slow
@pytest.mark.parametrize("command, target, says, wrote", [
    (["eval", "--attacks", "clean,fgsm", "--quiet"], "fastfair.evaluation.per_class:evaluate",
     "this evaluation wrote no result", "eval/best_pgd-test.json"),
    (["diagnose", "--attack", "fgsm", "--tsne", "0", "--quiet"], "fastfair.evaluation.diagnose:collect",
     "no diagnostics were written", "diagnostics/best_pgd-test-fgsm.json"),
])
def test_sigterm_in_eval_and_diagnose_is_one_line_and_the_rerun_writes(command, target, says, wrote, tmp_path,
                                                                        uninterrupted):
    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    (run / wrote).unlink(missing_ok=True)  # the final evaluation's own result: the rerun writes it anew
    env, markers = held(tmp_path, target, 1)
    proc = start([sys.executable, "-m", "fastfair", command[0], str(run), *command[1:]], env)
    (pid,) = wait_held(markers, proc)
    os.kill(pid, signal.SIGTERM)
    code, _, err = ended(proc)
    assert code == 143 and len(lines(err)) == 1, err
    assert lines(err)[0].startswith(f"fastfair: interrupted by SIGTERM; {says}") and "run the same command" in err
    assert not (run / wrote).exists() and released_lock(run) and not list(run.rglob("*.tmp"))
    r = in_process(command[0], run, *command[1:])
    assert r.returncode == 0 and (run / wrote).is_file(), r.stderr


# TRAIN's run as a grid's base and settings (the same weights as TRAIN's, seed 0); a grid's runs share a robust
# attack in their final evaluation
SETTINGS = """base = "demo"
[set]
"model.width" = 4
"train.epochs" = 2
"data.train_per_class" = 10
"data.test_per_class" = 2
"data.batch_size" = 25
"train.device" = "cpu"
"attack.steps" = 1
"train.val_attack" = "fgsm"
"eval.attacks" = ["clean", "fgsm"]
"""
GRID = SETTINGS + """[[axes]]
key = "train.seed"
values = [0, 1]
labels = ["a", "b"]
"""


@pytest.mark.fault
@pytest.mark.slow
def test_a_stopped_grid_child_and_a_stopped_grid_keep_their_steps_and_the_rerun_resumes_both(tmp_path):
    (tmp_path / "g.toml").write_text(GRID)
    out = tmp_path / "out"
    env, markers = held(tmp_path, STEP, 3)
    grid = ["grid", str(tmp_path / "g.toml"), "--out", str(out), "--gpus", "cpu"]
    proc = start([sys.executable, "-m", "fastfair", *grid], env)
    (a,) = wait_held(markers, proc)
    os.kill(a, signal.SIGTERM)  # a grid child signalled itself (SLURM signals every process of a job)
    b = next(pid for pid in wait_held(markers, proc, count=2) if pid != a)  # the grid went on to the next run
    kept = "in epoch 1 of 2 (3 of 4 steps saved)"
    assert read_state(out / "a")["status"] == "interrupted" and read_state(out / "a")["error"].startswith(
        f"fastfair: interrupted by SIGTERM {kept}; continue with: fastfair train --out {out / 'a'} --resume")
    proc.send_signal(signal.SIGTERM)  # now the grid: it passes SIGTERM on to its running child, b
    code, _, err = ended(proc)
    assert code == 143 and lines(err)[-1] == (
        f"fastfair: interrupted by SIGTERM; runs: 2 stopped (a {kept}; b {kept}); run the same command again to go "
        "on (done runs are skipped, the others resume)"), err
    assert not _alive(b) and all(released_lock(path) for path in (out, out / "a", out / "b"))
    said = RunDir(out / "b").train_log.read_text().splitlines()[-1]  # the child's own line, in its log
    assert said.startswith(f"fastfair: interrupted by SIGTERM {kept}")

    release(markers)
    r = in_process(*grid)  # the grid's runs are processes of their own (the environment: this process's)
    assert r.returncode == 0 and "2 of 2 runs finished" in r.stdout, r.stdout + r.stderr
    for run in ("a", "b"):
        assert [(h["event"], h.get("step")) for h in RunDir(out / run).read_history()] == [("start", None),
                                                                                        ("resume", 3)]
        assert read_state(out / run)["attempt"] == 2 and read_state(out / run)["status"] == "done"


@pytest.mark.fault
@pytest.mark.slow
def test_sigterm_to_reproduce_stops_its_run_at_a_step_and_the_rerun_resumes_it(tmp_path):
    npz = tmp_path / "cifar10-part.npz"  # ten classes of random images, 20 training and 5 test images each
    rng = np.random.default_rng(0)
    np.savez(npz, x_train=rng.integers(0, 256, (200, 3, 32, 32), dtype=np.uint8), y_train=np.arange(200) % 10,
             x_test=rng.integers(0, 256, (50, 3, 32, 32), dtype=np.uint8), y_test=np.arange(50) % 10)
    out = tmp_path / "out"
    table = ["reproduce", "dafa-t1", "--scale", "subset", "--data-dir", str(npz), "--gpus", "cpu", "--out", str(out),
             "--set", "train.epochs=2", "--set", "data.batch_size=16",  # epochs of several steps
             "--set", "model.width=4", "--set", "attack.steps=1"]  # the plumbing: no ResNet trained on a CPU
    env, markers = held(tmp_path, STEP, 2)
    proc = start([sys.executable, "-m", "fastfair", *table], env)
    (pid,) = wait_held(markers, proc)
    proc.send_signal(signal.SIGTERM)
    code, _, err = ended(proc)
    stopped = re.fullmatch(r"fastfair: interrupted by SIGTERM; runs: 1 stopped \((\S+) in epoch 1 of 2 \(2 of \d+ "
                           r"steps saved\)\), 2 not started; run the same command again to go on \(done runs are "
                           r"skipped, the others resume\)", lines(err)[-1])
    assert code == 143 and stopped, err
    run = out / "runs" / stopped.group(1)
    assert read_state(run)["status"] == "interrupted" and released_lock(out) and released_lock(run)

    release(markers)  # the rerun: its first run resumes after step 2; stopped once more as it gets there
    env, markers = held(tmp_path, STEP, 1, name="again")
    proc = start([sys.executable, "-m", "fastfair", *table], env)
    wait_held(markers, proc)
    assert RunDir(run).read_history()[-1]["step"] == 2 and read_state(run)["attempt"] == 2
    proc.send_signal(signal.SIGTERM)
    code, _, err = ended(proc)
    assert code == 143 and "(3 of" in lines(err)[-1], err


# ---- a submitit array task pre-empted on SLURM (submitit's local executor) ---------------------------

def _parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.fault
@pytest.mark.slow
def test_a_preempted_submitit_task_requeues_and_ends_with_the_uninterrupted_weights(tmp_path, monkeypatch,
                                                                                   uninterrupted):
    """SLURM signals every process of a job (submitit asks for USR2 before the time limit, and on pre-emption): the
    task requeues itself, its run saved at a step boundary first, and the requeued task resumes it. Simulated on
    submitit's local executor, whose requeue restarts the task: the test sends USR2 to the task and its run as
    SLURM would, at a step it chose (the executor's own timer would pick the moment by the clock)."""
    needs_extra("submitit")
    (tmp_path / "g.toml").write_text(SETTINGS + '[[axes]]\nkey = "train.seed"\nvalues = [0]\nlabels = ["a"]\n'
                                                '[launcher.submitit]\ncluster = "local"\n')
    env, markers = held(tmp_path, STEP, 2)
    for key in ("PYTHONPATH", "OMP_NUM_THREADS", "FASTFAIR_TEST_HOLD"):  # the task's and its run's environment
        monkeypatch.setenv(key, env[key])
    out, said, ended_with = tmp_path / "out", [], []
    grid = threading.Thread(target=lambda: ended_with.append(run_grid(
        str(tmp_path / "g.toml"), out=str(out), gpus="cpu", launcher="submitit", echo=said.append)))
    grid.start()
    (run,) = wait_held(markers, grid)  # the run, held before its second step
    task = _parent(run)
    os.kill(run, signal.SIGUSR2)  # the run ignores submitit's signal: its task stops it
    os.kill(task, signal.SIGUSR2)
    release(markers)
    grid.join(600)
    assert ended_with == [0], said
    state = read_state(out / "a")
    assert state["status"] == "done" and state["attempt"] == 2 and "--resume" in state["command"]
    assert [(h["event"], h.get("step")) for h in RunDir(out / "a").read_history()] == [("start", None), ("resume", 2)]
    log = "".join(path.read_text() for path in (out / ".submitit").glob("*_log.out"))
    assert "Calling checkpoint method" in log and "Requeued job" in log  # submitit requeued the task itself
    expected = weights(uninterrupted)
    got = weights(out / "a")
    assert all(torch.equal(got[k], expected[k]) for k in expected)  # bit for bit
    assert metrics(out / "a") == metrics(uninterrupted)


@pytest.mark.fault
def test_reproduce_submits_through_the_launcher_it_is_given(tmp_path, monkeypatch):
    """--launcher submitit: a table's runs go through the grid's submitit launcher, whose tasks requeue themselves
    (above); an unknown launcher stops before any work."""
    from fastfair.reproduce import command

    npz = tmp_path / "cifar10-part.npz"
    np.savez(npz, x_train=np.zeros((200, 3, 32, 32), np.uint8), y_train=np.arange(200) % 10,
             x_test=np.zeros((50, 3, 32, 32), np.uint8), y_test=np.arange(50) % 10)
    launched = []
    monkeypatch.setattr(command.LAUNCHERS, "get", lambda name: lambda jobs, **kw: launched.append(
        (name, [job.name for job in jobs], kw["folder"])))
    args = dict(scale="subset", data_dir=str(npz), out=str(tmp_path / "out"), gpus="cpu", echo=lambda line: None)
    assert command.reproduce("dafa-t1", launcher="submitit", **args) == 1  # nothing ran: no run is done
    (name, jobs, folder), *_ = launched
    assert name == "submitit" and len(jobs) == 3 and folder == tmp_path / "out" / ".submitit"
    monkeypatch.undo()
    with pytest.raises(UserError, match="ray"):
        command.reproduce("dafa-t1", launcher="ray", **args)
