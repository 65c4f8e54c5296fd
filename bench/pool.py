"""Training steps compiled side by side and timed one at a time, or K at once: the harness of the GPU plan.

On a lent GPU compilation, not timing, fills the time: fastfair's default ResNet-18 PGD-10 AT step took about 115 s
to compile on the H200's 16-core host (the rn18-at part, 133 s, less its reference loop), its timed steps about 2 s.
Inductor compiles a graph in one Python thread, so every configuration gets its own process and all of them compile
at once. Only then, every process idle but the one
being timed, does the parent time them one after another, each beside the reference loop in the same process, or K
of them together for the concurrency curve. A configuration that has not compiled by the deadline is stopped and
recorded, so one slow compilation never costs the others their timings.

    pool = Pool(specs, args, dev)           # starts one process per Spec
    pool.warm(deadline_s)                   # {name: "warm" | why not}
    pool.solo(name)                         # its rows: the reference (if asked), then fastfair
    pool.together([names], steps)           # aggregate images/s of those runs stepping at once
    pool.close()
"""
from __future__ import annotations

import ctypes
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from bench import bench_training, common
from fastfair.errors import UserError


PR_SET_PDEATHSIG = 1  # prctl(2)
REFERENCE_WARMUP = 2  # the reference compiles nothing: its DataLoader's workers and cuDNN's choices warm up


@dataclass(frozen=True)
class Spec:
    name: str  # unique in its pool
    method: str
    model: str
    batch: int
    steps: int  # timed steps per window
    settings: dict = field(default_factory=dict)  # fastfair config keys on top of bench_training.START
    reference: bool = False  # also time the reference loop, in this process, before fastfair


def gpu_process_gib(pid: int) -> float | None:
    """GPU memory a process holds (nvidia-smi), None where it cannot be asked or does not list the process (a
    container's PID namespace hides it)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    used = [float(mib) for p, mib in (line.split(",") for line in out.splitlines() if "," in line) if int(p) == pid]
    return round(used[0] / 1024, 2) if used else None


class _Child:
    """What runs in a configuration's process: its steppers, built and compiled at start, timed on request."""

    def __init__(self, spec: Spec, args, dev: torch.device, out: Path):
        dataset = common.register_synthetic(args.train_images, 0, tuple(args.image_shape))  # this process's registry
        kw = dict(method=spec.method, model=spec.model, batch=spec.batch, dataset=dataset, args=args, dev=dev)
        self.spec, self.args, self.dev = spec, args, dev
        # the reference first: building a trainer drops the compiled code of those before it (common.make_trainer)
        self.ref = bench_training.stepper("reference", {}, out=out / "ref", cpu_loader=True, **kw) \
            if spec.reference else None
        self.step, self.loader, _ = self.ff = bench_training.stepper("fastfair", spec.settings, out=out / "ff", **kw)
        # compilation, cuDNN's autotuning, CUDA graphs' warm-up and recording; not timed
        common.run_steps(self.step, self.loader, args.warmup, dev)

    def solo(self) -> dict:
        out = {}
        if self.ref:
            step, loader, _ = self.ref
            out["reference"] = common.time_steps(step, loader, self.spec.steps, REFERENCE_WARMUP, self.dev)
        # one step first after the idle wait: the clocks up, nothing lazy left
        out["fastfair"] = common.time_steps(self.step, self.loader, self.spec.steps, 1, self.dev)
        if self.dev.type == "cuda":
            out["allocator_gib"] = round(torch.cuda.max_memory_reserved(self.dev) / 2**30, 2)
        trainer = self.ff[2]
        if trainer.ways is not None and not trainer.ways.fast_on:  # CUDA graphs failed their check: the plain step ran
            said = [line for line in trainer.run.train_log.read_text().splitlines() if "train.cudagraphs:" in line]
            out["graphs_fell_back"] = said[-1].split("train.cudagraphs: ", 1)[-1] if said else "(no reason logged)"
        return out

    def window(self, conn, go, steps: int) -> tuple[float, float]:
        """``steps`` steps started when the parent sets ``go`` (after one untimed step), as (start, end) times."""
        common.run_steps(self.step, self.loader, 1, self.dev)
        conn.send(("ready", None))
        go.wait()
        start = time.time()
        common.run_steps(self.step, self.loader, steps, self.dev)
        return start, time.time()


def why(err: BaseException) -> str:
    """A row's note for a configuration that did not run: refused by fastfair (a setting this device or torch
    cannot take), out of GPU memory, or failed."""
    if isinstance(err, UserError):
        return f"refused: {err}"
    if isinstance(err, torch.cuda.OutOfMemoryError):
        return "out of GPU memory"
    return f"failed: {type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:300]}"


def _own_group_dying_with(parent: int) -> None:
    """A child leads its own process group, so stopping it stops its compile workers too, and (Linux) dies with the
    pool's process, so a killed bench leaves nothing compiling behind."""
    os.setpgrp()
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the pool's process died before the line above
            os._exit(1)


def _run_child(spec: Spec, args, device: str, conn, go, parent: int) -> None:
    _own_group_dying_with(parent)
    dev = torch.device(device)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        try:
            child = _Child(spec, args, dev, Path(tmp))
        except Exception as err:  # noqa: BLE001 -- a configuration that cannot run is a result, sent to the parent
            conn.send(("failed", why(err)))
            return
        conn.send(("warm", time.perf_counter() - t0))
        while (msg := conn.recv())[0] != "stop":
            try:
                value = child.solo() if msg[0] == "solo" else child.window(conn, go, msg[1])
            except Exception as err:  # noqa: BLE001 -- as above; the parent records it and goes on
                conn.send(("failed", why(err)))
                return
            conn.send((msg[0], value))


class Pool:
    def __init__(self, specs: list[Spec], args, dev: torch.device):
        """One process per spec, started at once."""
        ctx = mp.get_context("spawn")
        self.go = ctx.Event()
        self.specs = {s.name: s for s in specs}
        self.procs, self.conns, self.warm_s, self.status = {}, {}, {}, {}
        self.args, self.dev = args, dev
        # Inductor's default is a worker per core in every process; a quarter of the cores each keeps the pool's
        # memory in bounds (10 processes x 16 workers would hold ~50 GB) while the slowest compilation still gets
        # its kernels compiled in parallel, and the oversubscription keeps every core busy until the last is done
        threads = str(max(1, (os.cpu_count() or 1) // 4))
        saved = os.environ.get("TORCHINDUCTOR_COMPILE_THREADS")
        os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = threads  # the children inherit it at start
        try:
            for spec in specs:
                parent, child = ctx.Pipe()
                # not a daemon: the reference loop's DataLoader starts worker processes of its own
                proc = ctx.Process(target=_run_child, args=(spec, args, str(dev), child, self.go, os.getpid()))
                proc.start()
                self.procs[spec.name], self.conns[spec.name] = proc, parent
        finally:
            if saved is None:
                del os.environ["TORCHINDUCTOR_COMPILE_THREADS"]
            else:
                os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = saved

    def warm(self, deadline_s: float) -> dict[str, str]:
        """Wait until every process has compiled (or failed), at most ``deadline_s``; stop the ones still compiling.
        Returns each configuration's status: "warm", or why it will not be timed."""
        end = time.perf_counter() + deadline_s
        while len(self.status) < len(self.specs) and time.perf_counter() < end:
            waiting = {self.conns[n]: n for n in self.specs if n not in self.status}
            for conn in multiprocessing.connection.wait(list(waiting), max(0.0, min(1.0, end - time.perf_counter()))):
                name = waiting[conn]
                try:
                    self.warm_s[name], self.status[name] = self._reply(name), "warm"
                except RuntimeError as err:
                    self.status[name] = str(err)
        for name in self.specs:
            if name not in self.status:
                self._stop(name)
                self.status[name] = f"not compiled within {deadline_s:.0f} s (stopped)"
        return dict(self.status)

    def _reply(self, name: str):
        """The child's answer; a RuntimeError saying why where it failed or died instead."""
        try:
            kind, value = self.conns[name].recv()
        except EOFError:  # the process died without a word (killed for memory, a crash in native code)
            self.procs[name].join(5)
            raise RuntimeError(f"failed: its process died (exit code {self.procs[name].exitcode})") from None
        if kind == "failed":
            raise RuntimeError(value)
        return value

    def solo(self, name: str) -> dict:
        """Time one warm configuration while the others wait: seconds per window of its ``steps`` steps, median of
        ``common.REPEATS`` (``reference`` too where its spec asks), its allocator's peak and its process's memory.
        A RuntimeError saying why where it failed."""
        self.conns[name].send(("solo",))
        out = self._reply(name)
        if self.dev.type == "cuda":
            out["process_gib"] = gpu_process_gib(self.procs[name].pid)
        return out

    def together(self, names: list[str], steps: int) -> dict:
        """``steps`` steps of each of ``names`` at once (started together): aggregate and mean per-run images/s."""
        self.go.clear()
        for name in names:
            self.conns[name].send(("together", steps))
        try:
            for name in names:  # every child has run its untimed step and waits at the event
                self._reply(name)
        finally:
            self.go.set()  # the children that are waiting go on, whatever happened to the others
        spans = [self._reply(name) for name in names]
        self.go.clear()
        images = [steps * self.specs[n].batch for n in names]
        wall = max(e for _, e in spans) - min(s for s, _ in spans)
        return {"k": len(names), "images_per_s": sum(images) / wall,
                "per_run_images_per_s": statistics.mean(i / (e - s) for i, (s, e) in zip(images, spans))}

    def _stop(self, name: str) -> None:
        """Kill a child's process group (it and its compile workers), and the child itself in case it has not made
        its group yet; wait for it."""
        try:
            os.killpg(self.procs[name].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.procs[name].kill()
        self.procs[name].join(10)

    def close(self) -> None:
        for name, proc in self.procs.items():
            if proc.is_alive():
                try:
                    self.conns[name].send(("stop",))
                except (BrokenPipeError, OSError):
                    pass
                proc.join(10)
            if proc.is_alive():
                self._stop(name)
