"""One run on several processes: ``torchrun --nproc-per-node N -m fastfair train ...``.

Choices (docs/grid.md):

- ``data.batch_size`` stays the *global* batch. Every rank keeps the whole uint8 training split
  on its device (CIFAR-10: 150 MB), draws the same permutation and augmentation from the same
  (seed, epoch) generator, and takes its contiguous slice of each global batch
  (:class:`RankSlice`). So N processes see exactly the batches one process sees.
- Gradients are averaged by DistributedDataParallel, which wraps the model only for the
  training loss; attacks run on the bare model (their input gradients need no all-reduce).
- Per-class counters and the loss sum are all-reduced at epoch end before ``ClassState.read()``,
  so CFA/FRL updates see the whole data set; evaluation splits its loader across ranks and sums
  the confusion matrices.
- BatchNorm: by default each rank normalises with its own slice's statistics (the usual DDP
  behaviour; running statistics are taken from rank 0 before validation and on every DDP
  forward). ``train.sync_bn = true`` uses SyncBatchNorm (global-batch statistics, CUDA only).
- Only rank 0 writes the run directory and prints.
- PGD random starts draw from per-rank random streams, so with ``attack.init`` uniform or normal
  N processes match one process in distribution, not bit for bit.
- A stop signal (:mod:`fastfair.stopping`) stops every rank at the same step boundary: the ranks agree
  through :class:`StopVote` on a gloo group of the host's own, so agreeing never waits on the GPU. The line that
  says how to go on names the torchrun command (:func:`command`).
"""
from __future__ import annotations

import gc
import importlib
import os
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from fastfair.errors import UserError
from fastfair.scaleout import torchrun


@dataclass(frozen=True)
class Context:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    host_group: object = None  # gloo, for small host-side collectives (StopVote, gather_host)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world > 1


_ctx = Context()


def current() -> Context:
    return _ctx


def init(cfg) -> Context:
    """Join the process group torchrun describes (RANK, WORLD_SIZE, LOCAL_RANK); no-op without it."""
    global _ctx
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 or _ctx.enabled:
        return _ctx
    if cfg.data.batch_size % world:
        raise UserError(f"data.batch_size {cfg.data.batch_size} is the global batch and must divide by the "
                        f"{world} processes; pick a multiple of {world}")
    local = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = cfg.train.device in ("auto", "cuda") and torch.cuda.is_available()
    if cfg.train.device.startswith("cuda:"):
        raise UserError("under torchrun each process takes the GPU LOCAL_RANK; use --device auto or cuda, not cuda:N")
    if use_cuda:
        torch.cuda.set_device(local)  # torch.device("cuda") now means this rank's GPU
    # Imported before the group exists, not by DDP's constructor after it: torch.distributed.nn's functions take
    # group.WORLD as a default argument, read at import, which would keep this group alive past shutdown(). Its gloo
    # work threads would then outlive the run, and one that drops a finished collective (and the Python tensors it
    # holds) once the interpreter is finalizing cannot take the GIL: pthread_exit unwinds a noexcept destructor,
    # "terminate called without an active exception" (SIGABRT; issue 40, tests/test_distributed.py).
    importlib.import_module("torch.distributed.nn")
    dist.init_process_group("nccl" if use_cuda else "gloo")
    _ctx = Context(dist.get_rank(), dist.get_world_size(), local, dist.new_group(backend="gloo"))
    return _ctx


def under_torchrun() -> bool:
    """Whether torchrun (or ``fastfair-torchrun``) started this process (one of its ranks, also of a one-process
    run)."""
    return "LOCAL_WORLD_SIZE" in os.environ


def launcher() -> str:
    """The launcher that started this rank: ``fastfair-torchrun`` (:mod:`fastfair.scaleout.torchrun`, which says so
    in the ranks' environment), else ``torchrun``."""
    return os.environ.get("FASTFAIR_LAUNCHER", "torchrun")


def command(args: str) -> str:
    """``fastfair ARGS`` as this run was started: under torchrun, the launcher's command with the options it was
    given (:func:`launcher_options`: --nnodes, --node-rank, --rdzv-*, ...), so a printed ``continue with:`` resumes
    every rank when run as printed; on several nodes, prefixed by where to run it (on each node, with its own
    --node-rank where the run was started with one). Where the launcher's command line cannot be read, the options
    torchrun tells every rank (processes per node, number of nodes)."""
    if not under_torchrun():
        return f"fastfair {args}"
    nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
    options = launcher_options()
    if options is None:
        options = [*(["--nnodes", str(nodes)] if nodes > 1 else []), "--nproc-per-node", os.environ["LOCAL_WORLD_SIZE"]]
    run = f"{launcher()} {shlex.join(options)} -m fastfair {args}"
    if nodes == 1:
        return run
    own = any(o.startswith(("--node-rank", "--node_rank")) for o in options)
    return f"on each of the {nodes} nodes{', with its own --node-rank' if own else ''}: {run}"


def launcher_options(parent: int | None = None) -> list[str] | None:
    """The options the launcher that started this rank was given, as given (its ``-m`` left out), read from its
    command line: torchrun starts each rank as its child, ``python -u -m fastfair ARGS`` for ``-m fastfair``, so
    its command line ends with the module (or script) and this process's arguments. None where it cannot be read
    (no /proc) or is not such a launcher's."""
    try:
        argv = Path(f"/proc/{parent or os.getppid()}/cmdline").read_bytes().decode().split("\0")[:-1]
    except OSError:
        return None
    own = sys.argv[1:]
    if len(argv) <= len(own) or argv[len(argv) - len(own):] != own:
        return None
    head = argv[: len(argv) - len(own) - 1]  # the interpreter, the launcher and its options; the module dropped
    for i, arg in enumerate(head):
        if Path(arg).name in LAUNCHERS or (arg in LAUNCHER_MODULES and head[i - 1:i] == ["-m"]):
            return [o for o in head[i + 1:] if o not in ("-m", "--module")]
    return None


# how a launcher's command line names it: its console script, or the module after python -m
LAUNCHERS = ("torchrun", "fastfair-torchrun")
LAUNCHER_MODULES = ("torch.distributed.run", "fastfair.scaleout.torchrun")


def shutdown() -> None:
    """Destroy the process group now: its work threads are joined while the interpreter is whole (see init)."""
    global _ctx
    if _ctx.enabled:
        # A run's objects in a reference cycle (the trainer holds its own bound step, fallback.CheckedStep holds the
        # trainer's methods) would keep the DDP wrapper, and with it the group, until a later collection: too late
        # if that is the interpreter's exit. Collect them first, so destroying the group frees it now.
        gc.collect()
        dist.destroy_process_group()
        _ctx = Context()


def say_complete() -> None:
    """Rank 0 tells the launcher the run is complete, its final result written: a stop signal to fastfair-torchrun
    from now on stops nothing, and it exits 0 (:mod:`fastfair.scaleout.torchrun`)."""
    if _ctx.rank == 0 and os.environ.get(torchrun.COMPLETE):
        Path(os.environ[torchrun.COMPLETE]).touch()


def barrier() -> None:
    if _ctx.enabled:
        dist.barrier()


def shard(split: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of an evaluation split (every ``world``-th image)."""
    x, y = split
    return (x[_ctx.rank::_ctx.world], y[_ctx.rank::_ctx.world]) if _ctx.enabled else (x, y)


class RankSlice:
    """This rank's contiguous slice of every global batch of a training loader."""

    def __init__(self, loader):
        self.loader = loader

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def class_counts(self, num_classes: int) -> torch.Tensor:
        return self.loader.class_counts(num_classes)

    def draw_classes(self, p: torch.Tensor) -> None:
        self.loader.draw_classes(p)  # every rank draws the same global batches from the same (seed, epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        per_rank = self.loader.batch_size // _ctx.world  # read each epoch: a resolution phase may change it
        lo = _ctx.rank * per_rank
        for x, y in self.loader:
            yield x[lo:lo + per_rank], y[lo:lo + per_rank]


def train_loader(loader):
    return RankSlice(loader) if _ctx.enabled else loader


def prepare_model(model: nn.Module, cfg) -> tuple[nn.Module, nn.Module]:
    """(the bare model, the module the training loss calls): DDP-wrapped under torchrun."""
    if not _ctx.enabled:
        return model, model
    if cfg.train.sync_bn:
        if next(model.parameters()).device.type != "cuda":
            raise UserError("train.sync_bn needs CUDA (SyncBatchNorm has no CPU kernel); set train.sync_bn=false")
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    ids = [_ctx.local_rank] if next(model.parameters()).device.type == "cuda" else None
    # broadcast_buffers off: DDP would copy rank 0's BatchNorm statistics into every rank's at each forward, in place,
    # and a loss with two forwards (TRADES: clean and adversarial) then changes the statistics the first forward saved
    # for its backward; torch 2.11's batch norm checks them ("modified by an inplace operation"). The trainer gives
    # every rank rank 0's statistics once a step instead, before the attack (sync_buffers).
    with warnings.catch_warnings():
        # torch 2.13 deprecates broadcast_buffers and itself says to keep broadcast_buffers=False until the
        # replacement that skips the sync at init exists; nothing for a user to do, so not said on every run
        warnings.filterwarnings("ignore", message="`broadcast_buffers` is deprecated", category=FutureWarning)
        return model, nn.parallel.DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if _ctx.enabled:
        dist.all_reduce(t)
    return t


def reduce_class_state(state) -> None:
    """Sum the epoch's per-class counters and statistics over ranks; the loss sum becomes the global-batch mean's."""
    if not _ctx.enabled:
        return
    for t in state.sum_tensors():
        dist.all_reduce(t)
    state.loss_sum /= _ctx.world  # each rank summed its slice's mean loss; equal slices


def sync_buffers(model: nn.Module) -> None:
    """Give every rank rank 0's BatchNorm running statistics: before each step (an attack in eval mode and the loss
    read them) and before validation. One broadcast per dtype, of the buffers flattened."""
    if not _ctx.enabled:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for b in model.buffers():
        by_dtype.setdefault(b.dtype, []).append(b)
    for buffers in by_dtype.values():
        flat = torch.cat([b.detach().reshape(-1) for b in buffers])
        dist.broadcast(flat, 0)
        torch._foreach_copy_([b.detach() for b in buffers],
                             [v.view_as(b) for v, b in zip(flat.split([b.numel() for b in buffers]), buffers)])


class StopVote:
    """Whether any rank has received a stop signal, agreed by every rank at the same step boundary: an all-reduce
    (max) of the signal's number (0: none) on the host's gloo group. :meth:`now` waits for it (once an epoch);
    :meth:`lagged` starts one and returns the one started at the previous boundary, which finished during the step
    in between (a few bytes over the host's network): no wait, no device sync, and the ranks stop one step later.
    Without torchrun both return the process's own signal."""

    def __init__(self):
        self._pending: tuple | None = None

    def now(self, signum: int) -> int:
        self.close()
        if not _ctx.enabled:
            return signum
        self.lagged(signum)
        return self.close()

    def lagged(self, signum: int) -> int:
        if not _ctx.enabled:
            return signum
        agreed = self.close()
        flag = torch.tensor([signum])
        self._pending = (dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=_ctx.host_group, async_op=True), flag)
        return agreed

    def close(self) -> int:
        """Wait for the vote in flight and return it (0 when none is)."""
        if self._pending is None:
            return 0
        (work, flag), self._pending = self._pending, None
        work.wait()
        return int(flag)


def gather_host(obj) -> list:
    """Every rank's ``obj`` (CPU tensors, numbers), in rank order, on every rank; ``[obj]`` without torchrun."""
    if not _ctx.enabled:
        return [obj]
    out = [None] * _ctx.world
    dist.all_gather_object(out, obj, group=_ctx.host_group)
    return out
