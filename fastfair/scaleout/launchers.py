"""Where grid runs execute: this machine (K concurrent runs per GPU) or a SLURM cluster via submitit.

A launcher takes the jobs still to do and returns when they have ended; every job records its
own done/interrupted/failed state in its run folder (:func:`fastfair.scaleout.jobs.run_job`), so a launcher
needs no bookkeeping of its own and a re-run of the grid picks up whatever a launcher left unfinished.

On SLURM through submitit an array task is checkpointable in submitit's sense (:class:`ArrayTask`): when the
job is pre-empted or near its time limit, submitit's signal (USR2 unless ``SUBMITIT_PREEMPT_SIGNAL`` says
otherwise) stops the task's runs at a step boundary (they save) and requeues the task, which resumes them.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import torch

from fastfair.errors import UserError
from fastfair.registry import Registry
from fastfair.scaleout.jobs import Job, outcome, read_state, run_job, stop_children

LAUNCHERS: Registry[Callable[..., None]] = Registry("launcher")


def parse_gpus(spec: str) -> list[str]:
    """``auto`` (every visible GPU, else the CPU), ``cpu``, or ``0,1``; an empty list means the CPU."""
    if spec == "cpu":
        return []
    if spec == "auto":
        return [str(i) for i in range(torch.cuda.device_count())]
    gpus = [g.strip() for g in spec.split(",") if g.strip()]
    if not gpus or not all(g.isdigit() for g in gpus):
        raise UserError(f"--gpus takes comma-separated GPU ids (0,1), cpu or auto; got {spec!r}")
    return gpus


def slot_envs(gpus: list[str], per_gpu: int) -> list[dict[str, str]]:
    """One environment per concurrent run: K slots per GPU (CUDA_VISIBLE_DEVICES), or K CPU slots.

    Each slot gets an equal share of the CPU cores for its PyTorch threads (unless OMP_NUM_THREADS
    is set), so K runs do not oversubscribe the host."""
    slots = [{"CUDA_VISIBLE_DEVICES": g} for g in gpus for _ in range(per_gpu)] or [{} for _ in range(per_gpu)]
    if "OMP_NUM_THREADS" not in os.environ:
        threads = str(max(1, (os.cpu_count() or 1) // len(slots)))
        slots = [{**s, "OMP_NUM_THREADS": threads} for s in slots]
    return slots


_STOPPING = threading.Event()  # set once the running jobs are being stopped: no slot freed by one starts another


def _stop_jobs() -> None:
    _STOPPING.set()
    stop_children()


def run_concurrently(jobs: list[Job], envs: list[dict[str, str]], echo=print,
                     ignored: tuple[int, ...] = ()) -> list[str]:
    """Run ``jobs`` with at most ``len(envs)`` at a time, each in a free slot's environment (its process ignoring
    the signals ``ignored``)."""
    free: queue.Queue = queue.Queue()
    for env in envs:
        free.put(env)
    _STOPPING.clear()

    def one(job: Job) -> str:
        env = free.get()
        try:
            if _STOPPING.is_set():
                return read_state(job.run_dir)["status"]
            echo(f"start {job.name} {' '.join(f'{k}={v}' for k, v in env.items())}")
            status = run_job(job, env, ignored)
            echo(f"done   {job.name}" if status == "done" else f"{status} {outcome(job.name, job.run_dir)}")
            return status
        finally:
            free.put(env)

    with ThreadPoolExecutor(max_workers=len(envs)) as pool:
        try:
            return list(pool.map(one, jobs))
        except BaseException:  # a stop signal or an error: no child outlives the grid, no queued job starts
            pool.shutdown(wait=False, cancel_futures=True)
            _stop_jobs()
            raise


@LAUNCHERS.register("local", "this machine: --per-gpu K concurrent runs on each of --gpus (or K on the CPU)")
def local(jobs: list[Job], *, gpus: str, per_gpu: int, options: dict, folder: Path, echo=print) -> None:
    if options:
        raise UserError(f"the local launcher takes no [launcher.local] options; got {sorted(options)}")
    run_concurrently(jobs, slot_envs(parse_gpus(gpus), per_gpu), echo)


def _submitit_signal() -> int:
    """The signal submitit's jobs requeue on (``SUBMITIT_PREEMPT_SIGNAL``, USR2 by default)."""
    import submitit

    return getattr(signal, f"SIG{submitit.JobEnvironment.USR_SIG}")


class ArrayTask:
    """One SLURM array task: up to K runs at once on the task's GPU (SLURM sets CUDA_VISIBLE_DEVICES).

    Checkpointable in submitit's sense: on submitit's signal (pre-emption, or ``signal_delay_s`` before the time
    limit) submitit calls :meth:`checkpoint` and requeues the task with what it returns. SLURM signals every
    process of the task, so the runs ignore submitit's signal; :meth:`checkpoint` stops them with SIGTERM, each
    saves at its next step boundary, and the requeued task resumes them (``--resume``), skipping those done."""

    def __call__(self, jobs: list[Job], per_gpu: int) -> list[str]:
        todo = [job for job in jobs if read_state(job.run_dir)["status"] != "done"]
        return run_concurrently(todo, slot_envs([], per_gpu), ignored=(_submitit_signal(),))

    def checkpoint(self, jobs: list[Job], per_gpu: int):
        from submitit.helpers import DelayedSubmission

        _stop_jobs()
        return DelayedSubmission(ArrayTask(), jobs, per_gpu)


@LAUNCHERS.register("submitit", "SLURM job arrays through submitit (pip install fastfair[submitit]); "
                                "K runs per array task and GPU; [launcher.submitit] options go to "
                                "update_parameters, cluster = \"local\" runs the tasks on this machine")
def submitit_launcher(jobs: list[Job], *, gpus: str, per_gpu: int, options: dict, folder: Path,
                      echo=print) -> None:
    try:
        import submitit  # an optional extra, imported only when this launcher is chosen
    except ImportError:
        raise UserError("--launcher submitit needs submitit: pip install 'fastfair[submitit]'") from None
    options = dict(options)
    executor = submitit.AutoExecutor(folder=folder, cluster=options.pop("cluster", None))
    # One GPU per array task unless --gpus cpu (the login node's own GPUs say nothing about the
    # cluster's); a day unless the grid file says otherwise (submitit's own default is 5 minutes).
    params = {"name": "fastfair-grid", "gpus_per_node": 0 if gpus == "cpu" else 1, "timeout_min": 24 * 60}
    executor.update_parameters(**{**params, **options})
    chunks = [jobs[i:i + per_gpu] for i in range(0, len(jobs), per_gpu)]
    submitted = executor.map_array(ArrayTask(), chunks, [per_gpu] * len(chunks))
    echo(f"submitted {len(chunks)} array task(s) ({', '.join(j.job_id for j in submitted)}); logs in {folder}")
    for job in submitted:
        try:
            job.result()
        except Exception as err:  # a task killed by SLURM: its runs stay unfinished and resume on re-run
            echo(f"array task {job.job_id} ended without a result ({type(err).__name__}: {str(err)[:200]})")
