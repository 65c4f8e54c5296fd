"""Memory layout and precision on a CPU, measured: which of fp32 / bf16 autocast x NCHW / channels_last trains
fastest, per model and batch size? ``model.channels_last = auto`` and ``train.amp = auto`` follow the answer on a
CPU (fastfair/build.py; issue 44, item 6).

    python bench/investigations/cpu_layout.py                # every configuration below, 9 windows of 2 steps each
    python bench/investigations/cpu_layout.py --smoke        # tiny sizes: checks the bench runs (CI)
    python bench/investigations/cpu_layout.py --only preact-resnet18 --windows 5

For each model and batch size, four Trainers (train.amp off/bf16 x model.channels_last off/on; PGD-AT with
10 attack steps, eager, train.kernels torch) live in one process and their timed windows take turns, so a change
in the machine's load hits all four alike. Reported: each one's median seconds per step with the fastest and
slowest window, in wall time and in the process's CPU seconds, and per precision the channels_last / NCHW ratio of
the windows of one turn (paired, so the load of that moment cancels), its median and range. The load average
before and after each group is recorded: the wall-time windows of a loaded machine spread wide, and the CPU
seconds are the number to read then.
"""
from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench import common  # noqa: E402

# (model, data set or synthetic image shape, width, batch): the demo's model and data, TRADES's MNIST CNN on
# MNIST-sized images, then the everyday CIFAR path (narrowed, so that 2 cores finish) at three batch sizes
GROUPS = (("tiny-cnn", "digits", None, 64), ("small-cnn", (1, 28, 28), None, 128),
          ("preact-resnet18", (3, 32, 32), 16, 32), ("preact-resnet18", (3, 32, 32), 16, 64),
          ("preact-resnet18", (3, 32, 32), 16, 128), ("resnet18", (3, 32, 32), 16, 64))
SMOKE_GROUPS = (("tiny-cnn", "digits", 8, 16),)
CONFIGS = {(amp, layout): {"train.amp": amp, "model.channels_last": layout}
           for amp in ("off", "bf16") for layout in ("off", "on")}
ATTACK_STEPS = 10


def measure(model, data, width, batch, *, windows, window_steps, warmup, attack_steps) -> list[dict]:
    """One row per configuration of one group: seconds per step (median, fastest, slowest window) and, per
    precision, the paired channels_last / NCHW ratio."""
    name = data if isinstance(data, str) else common.register_synthetic(4 * batch, 0, data)
    base = {"data.batch_size": batch, "train.device": "cpu", "attack.steps": attack_steps, "train.compile": "off",
            "train.kernels": "torch", **({"model.width": width} if width else {})}
    load_before = os.getloadavg()[0]
    configs = {key: {**base, **sets} for key, sets in CONFIGS.items()}
    seconds = common.interleaved_trainers("pgd-at", model, name, configs, windows=windows, window_steps=window_steps,
                                          warmup=warmup)
    load_after = os.getloadavg()[0]
    rows = []
    for (amp, layout), s in seconds.items():
        row = {"model": model, "data": data if isinstance(data, str) else "x".join(map(str, data)), "width": width,
               "batch": batch, "amp": "bf16" if amp == "bf16" else "fp32",
               "layout": "channels_last" if layout == "on" else "NCHW", "load_before": load_before,
               "load_after": load_after}
        for clock in ("wall", "cpu"):
            ratios = [cl / nchw for cl, nchw in zip(seconds[(amp, "on")][clock], seconds[(amp, "off")][clock])]
            row.update({f"{clock}_s": statistics.median(s[clock]), f"{clock}_fastest": min(s[clock]),
                        f"{clock}_slowest": max(s[clock]), f"{clock}_windows": s[clock],
                        f"{clock}_cl_over_nchw": statistics.median(ratios),
                        f"{clock}_cl_over_nchw_range": [min(ratios), max(ratios)]})
        row["images_per_s"] = batch / row["wall_s"]
        rows.append(row)
    for clock in ("wall", "cpu"):
        best = min(rows, key=lambda r: r[f"{clock}_s"])
        for r in rows:
            r[f"{clock}_fastest_here"] = r is best
    return rows


def summary(rows: list[dict], clock: str) -> list[dict]:
    """Per group and precision: channels_last against NCHW (the paired ratio of ``clock``, wall or cpu) and the
    group's fastest configuration by it."""
    out = []
    for r in rows:
        if r["layout"] != "NCHW":
            continue
        group = [g for g in rows if (g["model"], g["width"], g["batch"]) == (r["model"], r["width"], r["batch"])]
        best = next(g for g in group if g[f"{clock}_fastest_here"])
        low, high = r[f"{clock}_cl_over_nchw_range"]
        out.append({**{k: r[k] for k in ("model", "width", "batch", "amp")},
                    "ratio": f"{r[f'{clock}_cl_over_nchw']:.3f} ({low:.3f}-{high:.3f})",
                    "faster": "channels_last" if high < 1 else "NCHW" if low > 1 else "neither (range crosses 1)",
                    "fastest": f"{best['amp']} {best['layout']}",
                    "load": f"{r['load_before']:.1f} -> {r['load_after']:.1f}"})
    return out


SUMMARY = [("model", "model"), ("width", "width"), ("batch", "batch"), ("amp", "precision"), ("ratio", "time ratio"),
           ("faster", "faster in every turn"), ("fastest", "fastest of the four (median)"),
           ("load", "load average before -> after")]


def main(argv=None) -> int:
    p = common.base_parser(__doc__)
    p.add_argument("--windows", type=int, help="timed windows per configuration (default 9; smoke 2)")
    p.add_argument("--only", nargs="+", metavar="MODEL", help="only these models' groups")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    groups = [g for g in (SMOKE_GROUPS if args.smoke else GROUPS) if not args.only or g[0] in args.only]
    windows = args.windows or (2 if args.smoke else 9)
    kw = dict(windows=windows, window_steps=1 if args.smoke else 2, warmup=1 if args.smoke else 2,
              attack_steps=2 if args.smoke else ATTACK_STEPS)
    rows: list[dict] = []
    head = common.header(torch.device("cpu"))
    settings = {**kw, "threads": torch.get_num_threads(), "method": "pgd-at", "compile": "off", "kernels": "torch"}
    for group in groups:
        rows += measure(*group, **kw)
        body = "\n".join([
            "## Seconds per training step (PGD-AT, eager; the four configurations' windows interleaved)", "",
            "wall: the step's time; cpu: this process's CPU seconds in it (all threads), which the load of other "
            "processes inflates far less.", "",
            common.markdown_table(rows, [("model", "model"), ("data", "data"), ("width", "width"), ("batch", "batch"),
                                         ("amp", "precision"), ("layout", "layout"), ("wall_s", "wall s/step"),
                                         ("wall_fastest", "fastest"), ("wall_slowest", "slowest"),
                                         ("images_per_s", "img/s"), ("cpu_s", "cpu s/step"),
                                         ("cpu_fastest", "fastest"), ("cpu_slowest", "slowest")]),
            "", "## channels_last / NCHW in wall time, the windows of one turn paired: median (range); below 1 is "
            "faster", "", common.markdown_table(summary(rows, "wall"), SUMMARY),
            "", "## The same in CPU seconds", "", common.markdown_table(summary(rows, "cpu"), SUMMARY)])
        paths = common.save("cpu-layout", head=head, settings=settings, rows=rows, body=body, out_dir=args.out,
                            smoke=args.smoke, tag=args.tag)  # after every group: a killed bench keeps what it had
        print(f"done: {group[0]} batch {group[3]}", flush=True)
    print(body)
    print("written:", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
