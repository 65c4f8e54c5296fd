"""Microbenchmark: fused Triton kernels vs the eager PyTorch reference vs torch.compile of it.

    python bench/bench_kernels.py            # CUDA: N in {128, 512, 2048} x C in {10, 100, 1000}
    python bench/bench_kernels.py --smoke    # CPU too (Triton interpreter): tiny sizes, eager vs fused

Loss rows time forward + backward of the TRADES training objective (CE(z_nat) + beta_i
KL(p_nat || p_adv) with a per-sample beta, gradients to both logits) and of the PGD-CE attack
objective; PGD rows time one step on (N, 3, 32, 32) channels_last images. Prints a Markdown table
and writes JSON (device, torch / triton versions, rows) under bench/results/. Timings use CUDA
events on a GPU and time.perf_counter on CPU, after warm-up; the median of the repetitions is
reported.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before fastfair.kernels is imported


def _import_kernels():
    """fastfair.kernels when installed, else the repository's kernels/ folder under that name."""
    try:
        import fastfair.kernels as k

        return k
    except ModuleNotFoundError:
        sys.path.insert(0, str(ROOT))
        spec = importlib.util.spec_from_file_location(
            "fastfair.kernels", ROOT / "kernels" / "__init__.py",
            submodule_search_locations=[str(ROOT / "kernels")],
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["fastfair.kernels"] = mod
        spec.loader.exec_module(mod)
        return mod


K = _import_kernels()
import triton  # noqa: E402


from fastfair.ops import losses, steps

OBJECTIVES = {
    "trades": lambda n, dev: {"ce_nat": 1.0, "kl": torch.full((n,), 6.0, device=dev)},
    "pgd-ce": lambda n, dev: {"ce_adv": 1.0},
}


def timeit(fn, reps: int, warmup: int, cuda: bool) -> float:
    """Median milliseconds of ``fn()``."""
    for _ in range(warmup):
        fn()
    times = []
    if cuda:
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def fresh_compile(fn):
    """``torch.compile(fn)`` with Dynamo's caches emptied first: each row compiles ``fn`` for new
    shapes, and past the recompile limit (8) Dynamo would silently run it eagerly."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def guarded(bench, *args, **kw) -> dict:
    """One row; a failing one is recorded with its error and the bench goes on."""
    try:
        return bench(*args, **kw)
    except Exception as err:  # noqa: BLE001 -- a failure is a result
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return {"error": f"{type(err).__name__}: {first}"}


def loss_step(row_loss, z_nat, z_adv, y, weights, grad_nat: bool):
    """Forward + backward of one loss; returns (loss, grads) for the correctness check."""
    zn = z_nat.detach().requires_grad_(grad_nat)
    za = z_adv.detach().requires_grad_(True)

    def run():
        loss = row_loss(zn, za, y, **weights).mean()
        leaves = [zn, za] if grad_nat else [za]
        return loss, torch.autograd.grad(loss, leaves)

    return run


def bench_loss(n, c, objective, args, dev, cuda):
    gen = torch.Generator().manual_seed(n * 7 + c)
    z_nat = (torch.randn(n, c, generator=gen) * 3).to(dev)
    z_adv = (torch.randn(n, c, generator=gen) * 3).to(dev)
    y = torch.randint(0, c, (n,), generator=gen).to(dev)
    weights = OBJECTIVES[objective](n, dev)
    grad_nat = objective == "trades"
    impls = {"eager": losses.row_loss, "fused": K.row_loss}
    if not args.smoke:
        impls["compiled"] = fresh_compile(losses.row_loss)
    row = {"kind": "loss", "objective": objective, "N": n, "C": c}
    outs = {}
    for name, fn in impls.items():
        run = loss_step(fn, z_nat, z_adv, y, weights, grad_nat)
        outs[name] = run()
        row[f"{name}_ms"] = timeit(run, args.reps, args.warmup, cuda)
    ref_loss, ref_grads = outs["eager"]
    got_loss, got_grads = outs["fused"]
    row["max_abs_err"] = max(
        [float((got_loss - ref_loss).detach().abs())]
        + [float((a - b).abs().max()) for a, b in zip(got_grads, ref_grads)]
    )
    return row


def bench_pgd(n, args, dev, cuda, c=10):
    gen = torch.Generator().manual_seed(n)
    shape = (n, 3, 32, 32) if not args.smoke else (n, 3, 8, 8)
    mf = torch.channels_last
    x = torch.rand(shape, generator=gen).to(dev).contiguous(memory_format=mf)
    x_adv = (x + 0.01 * torch.randn(shape, generator=gen).to(dev)).clamp(0, 1)
    g = torch.randn(shape, generator=gen).to(dev).contiguous(memory_format=mf)
    y = torch.randint(0, c, (n,), generator=gen).to(dev)
    eps_c = torch.full((c,), 8 / 255, device=dev)
    alpha_c = eps_c / 4
    impls = {"eager": steps.pgd_step, "fused": K.pgd_step}
    if not args.smoke:
        impls["compiled"] = fresh_compile(steps.pgd_step)
    row = {"kind": "pgd_step", "objective": "-", "N": n, "C": c}
    outs = {}
    for name, fn in impls.items():
        outs[name] = fn(x_adv, g, x, y, eps_c, alpha_c)
        row[f"{name}_ms"] = timeit(lambda: fn(x_adv, g, x, y, eps_c, alpha_c), args.reps, args.warmup, cuda)
    row["max_abs_err"] = float((outs["fused"].float() - outs["eager"].float()).abs().max())
    return row


def markdown(rows) -> str:
    cols = ["kind", "objective", "N", "C", "eager_ms", "compiled_ms", "fused_ms",
            "x eager", "x compiled", "max_abs_err", "error"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = []
        for col in cols:
            if col == "x eager":
                v = r["eager_ms"] / r["fused_ms"] if "fused_ms" in r else None
            elif col == "x compiled":
                v = r["compiled_ms"] / r["fused_ms"] if "compiled_ms" in r else None
            else:
                v = r.get(col)
            cells.append("-" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, few reps, eager vs fused only (runs on CPU)")
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = p.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.smoke:
        p.error("no CUDA device: run with --smoke (Triton interpreter on CPU, tiny sizes)")
    dev = "cuda" if cuda else "cpu"
    args.reps = args.reps or (3 if args.smoke else 50)
    args.warmup = args.warmup or (1 if args.smoke else 10)
    sizes_n, sizes_c = ([16, 40], [10, 100]) if args.smoke else ([128, 512, 2048], [10, 100, 1000])

    rows = []
    for objective in OBJECTIVES:
        for n in sizes_n:
            for c in sizes_c:
                rows.append({"kind": "loss", "objective": objective, "N": n, "C": c}
                            | guarded(bench_loss, n, c, objective, args, dev, cuda))
    for n in sizes_n:
        rows.append({"kind": "pgd_step", "objective": "-", "N": n, "C": 10} | guarded(bench_pgd, n, args, dev, cuda))

    if cuda:
        device = torch.cuda.get_device_name()
    else:
        device = f"cpu ({platform.processor() or platform.machine()}, Triton interpreter)"
    table = markdown(rows)
    print(f"device: {device}; torch {torch.__version__}; triton {triton.__version__}; median ms of {args.reps} reps\n")
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = args.out / f"kernels-{'smoke-' if args.smoke else ''}{dev}-{stamp}.json"
    path.write_text(json.dumps({
        "device": device, "torch": torch.__version__, "triton": triton.__version__,
        "interpreter": os.environ.get("TRITON_INTERPRET") == "1", "smoke": args.smoke,
        "reps": args.reps, "warmup": args.warmup, "rows": rows,
    }, indent=2))
    print(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    main()
