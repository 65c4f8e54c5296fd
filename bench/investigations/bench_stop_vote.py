"""What torchrun's stop check costs a training step (fastfair.scaleout.distributed.StopVote).

Every step boundary, each rank starts an all-reduce (max) of the stop signal it has received on a gloo group of
the host's own, and reads the one it started at the previous boundary (``StopVote.lagged``); once an epoch it
waits for one (``StopVote.now``). This bench runs two gloo processes on this machine and measures, per call:

- ``now``: a blocking vote, the round trip of a one-element all-reduce between the ranks;
- ``lagged``: the host time a boundary spends in the vote when a step of S ms separates boundaries (a sleep
  stands for the step: the host waits on the GPU, or runs the next step's Python, meanwhile);
- the same loop without a vote, whose difference to the loop with one is the vote's cost per step.

Two processes on one host talk over loopback: across nodes the round trip adds the network's, which a lagged
vote still hides behind any step longer than it.
"""
from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch.multiprocessing as mp  # noqa: E402

from bench.common import base_parser, header, markdown_table, pick_device, save  # noqa: E402

WORLD = 2


def _rank(rank: int, port: int, reps: int, step_ms: list[float], out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    from fastfair import config
    from fastfair.scaleout import distributed

    distributed.init(config.resolve(None, {"train.device": "cpu", "data.batch_size": 2}))
    vote = distributed.StopVote()
    for _ in range(10):  # the gloo group's first messages set up its connections
        vote.now(0)
    rows = [{"what": "now (blocking vote)", "step_ms": None,
             "us_per_call": 1e6 * statistics.median(_timed(lambda: vote.now(0), reps))}]
    for ms in step_ms:
        for voting in (True, False):
            inside, total = [], []
            vote.now(0)  # every rank starts the loop together
            for _ in range(reps):
                t0 = time.perf_counter()
                time.sleep(ms / 1000)  # the step
                t1 = time.perf_counter()
                if voting:
                    vote.lagged(0)
                t2 = time.perf_counter()
                inside.append(t2 - t1)
                total.append(t2 - t0)
            vote.close()
            rows.append({"what": "lagged, per boundary" if voting else "no vote, per boundary", "step_ms": ms,
                         "us_per_call": 1e6 * statistics.median(inside) if voting else None,
                         "ms_per_step": 1e3 * statistics.median(total)})
    if rank == 0:
        out.put(rows)
    distributed.shutdown()


def _timed(fn, reps: int) -> list[float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    p = base_parser(__doc__)
    p.add_argument("--reps", type=int, help="calls timed per row (median)")
    args = p.parse_args()
    if args.device not in ("auto", "cpu"):
        p.error("the vote is a host-side gloo all-reduce on every machine; --device changes nothing: leave it out")
    reps = args.reps or (20 if args.smoke else 500)
    step_ms = [1.0] if args.smoke else [1.0, 10.0, 50.0]
    with socket.socket() as s:  # a port free now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    # rank 0 runs in this process, which has torch loaded already: one process to start, not two
    procs = [ctx.Process(target=_rank, args=(r, port, reps, step_ms, out)) for r in range(1, WORLD)]
    for proc in procs:
        proc.start()
    _rank(0, port, reps, step_ms, out)
    rows = out.get(timeout=600)
    for proc in procs:
        proc.join()
    for row in rows:  # the vote's cost per step: the loop with it against the loop without, at the same step
        if row["what"].startswith("lagged"):
            plain = next(r for r in rows if r["what"].startswith("no vote") and r["step_ms"] == row["step_ms"])
            row["us_added_per_step"] = 1e3 * (row["ms_per_step"] - plain["ms_per_step"])
    load = os.getloadavg()[0]  # a shared machine's other work slows every thread handoff the vote makes
    body = (f"{WORLD} gloo processes on this host ({os.cpu_count()} cores, load average {load:.1f} as it ended), "
            f"median over {reps} calls per row.\n\n"
            + markdown_table(rows, [("what", "call"), ("step_ms", "step (ms, a sleep)"),
                                    ("us_per_call", "us in the call"), ("ms_per_step", "ms per step"),
                                    ("us_added_per_step", "us added per step")]))
    paths = save("stop-vote", head=header(pick_device("cpu")), settings={"world": WORLD, "reps": reps,
                                                                          "step_ms": step_ms, "load_average": load},
                 rows=rows, body=body, out_dir=args.out, smoke=args.smoke)
    print(body)
    print(f"written: {', '.join(map(str, paths))}")


if __name__ == "__main__":
    main()
