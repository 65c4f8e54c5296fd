"""The GPU plan's training measurements (issue 42): every configuration the CUDA defaults depend on, compiled side by
side, then timed one at a time, each beside the reference loop in its own process (bench/pool.py says why).

    python bench/bench_matrix.py             # GPU: the configurations below (the plan-training part of the suite)
    python bench/bench_matrix.py --smoke     # any device: tiny CNN, what the device can run (CI)

Configurations, in the order they are timed (the headline first):

1. ResNet-18 PGD-10 AT at batch 128: CUDA graphs on and off, each with Inductor's Python and C++ wrapper;
2. the same at batch 512;
3. TRADES on ResNet-18 and PGD-10 AT on WRN-34-10 at batch 128, with the CUDA defaults as fastfair.gpu_defaults
   sets them when the plan starts: the best of 1. once a GPU has measured it, the predicted best before.

Each configuration's row: images/s, ms per step and seconds per 50k-image epoch, x the reference loop timed in the
same process, its compilation's seconds (every configuration compiling at once, so longer than alone), and its GPU
memory: the process's (nvidia-smi) and the caching allocator's peak. A configuration the device or the core cannot
run is a row saying why (skipped, refused by fastfair, not compiled by the deadline, failed); the rest go on.
A batch of 512 times a quarter of the steps of 128: the same images per window.

Run again on the same GPU, it keeps every configuration already settled (timed, refused or failed) in its result
file and compiles and times only the rest: a configuration the compile deadline stopped, or a killed run's. It
exits with 3 while one is left.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench import bench_training, common  # noqa: E402
from bench.pool import Pool, Spec  # noqa: E402
from fastfair import gpu_defaults, gpu_figures  # noqa: E402

GRAPHS, WRAPPER = "train.cudagraphs", "train.cpp_wrapper"
# (CUDA graphs, C++ wrapper): the predicted best first, then the default the H200 measured, then the wrapper's
SWITCHES = ((True, False), (False, False), (False, True), (True, True))
DEFAULT = next(r for r in bench_training.RUNGS if r.name == "fastfair default").settings


@dataclass(frozen=True)
class Config:
    spec: Spec
    label: str  # the row's configuration
    graphs: bool
    wrapper: bool


def label(graphs: bool, wrapper: bool) -> str:
    return f"fastfair, {'CUDA graphs' if graphs else 'no CUDA graphs'}, {'C++' if wrapper else 'Python'} wrapper"


def settings(graphs: bool, wrapper: bool) -> dict:
    """The default rung's keys with CUDA graphs and the wrapper set (a key the core lacks is left out: skip_reason)."""
    out = {**DEFAULT, GRAPHS: common.switch(GRAPHS, graphs)}
    return {**out, WRAPPER: common.switch(WRAPPER, wrapper)} if common.has_key(WRAPPER) else out


def defaults(dev: torch.device) -> tuple[bool, bool]:
    """(CUDA graphs, C++ wrapper) as the shipped figures set the CUDA defaults now; on a CPU neither applies."""
    fig = gpu_figures.shipped()
    graphs = gpu_defaults.cudagraphs(fig).on and dev.type == "cuda"
    return graphs, gpu_defaults.cpp_wrapper(fig, graphs).on and dev.type == "cuda"


def configs(args, dev: torch.device) -> list[Config]:
    """Every configuration, in timing order; TRADES and WRN-34-10 with the CUDA defaults (:func:`defaults`)."""
    graphs, wrapper = defaults(dev)
    rn18, trades, wrn = args.models
    todo = [("pgd-at", rn18, batch, g, w, "", args.steps) for batch in args.batches for g, w in SWITCHES]
    role = " (the CUDA defaults)" if dev.type == "cuda" else " (this device's defaults)"
    todo += [("trades", trades, args.batches[0], graphs, wrapper, role, args.steps),
             ("pgd-at", wrn, args.batches[0], graphs, wrapper, role, args.big_model_steps)]
    out = []
    for method, model, batch, g, w, note, steps in todo:
        steps = max(2, steps * args.batches[0] // batch)  # the same images per window at every batch size
        spec = Spec(f"{method} {model} {batch} {label(g, w)}{note}", method, model, batch, steps, settings(g, w),
                    reference=True)
        out.append(Config(spec, label(g, w) + note, g, w))
    return out


def skip_reason(c: Config, dev: torch.device) -> str | None:
    if c.wrapper and not common.has_key(WRAPPER):
        return f"fastfair has no config key {WRAPPER} yet"
    if dev.type != "cuda" and c.graphs:
        return "CUDA graphs need CUDA"
    if dev.type != "cuda" and c.wrapper:
        return "GPU only here (on a CPU the wrapper's C++ compilation would swamp a smoke run)"
    return None


def rows_of(c: Config, note: str, timed: dict | None, warm_s: float | None) -> list[dict]:
    """The reference row and the fastfair row of one configuration (the fastfair row alone, with ``note``, when it
    was not timed)."""
    s = c.spec
    per_s = lambda seconds: s.steps * s.batch / seconds  # noqa: E731
    ff = bench_training.row(s.method, s.model, s.batch, c.label, per_s(timed["fastfair"]) if timed else None,
                            None if timed else note)
    ff.update(config=s.name, loop="fastfair", graphs=c.graphs, cpp_wrapper=c.wrapper, warm_s=warm_s)
    if not timed:
        return [ff]
    ref = bench_training.row(s.method, s.model, s.batch, "reference", per_s(timed["reference"]))
    ref.update(config=s.name, loop="reference", x_reference=1.0)
    ff.update(x_reference=ff["images_per_s"] / ref["images_per_s"], memory_gib=timed.get("process_gib"),
              allocator_gib=timed.get("allocator_gib"))
    if "graphs_fell_back" in timed:  # timed, but the step without CUDA graphs: for the defaults, graphs failed here
        ff.update(graphs_fell_back=True, note=f"failed with CUDA graphs, fell back: {timed['graphs_fell_back']}")
    return [ref, ff]


# a configuration whose row says one of these is settled: running it again on this GPU would say the same (a skip
# is decided afresh each run: it depends on the code, not on the GPU)
SETTLED = ("refused", "failed", "out of GPU memory")


def settled_before(path: Path, device: str) -> dict[str, list[dict]]:
    """The rows of every configuration an earlier run on this device settled (timed, or a note in ``SETTLED``), by
    configuration: a rerun times only the rest (one the compile deadline stopped, or a killed run's)."""
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if data["header"]["device"] != device:
        return {}
    rows: dict[str, list[dict]] = {}
    for r in data["rows"]:
        rows.setdefault(r.get("config", ""), []).append(r)
    return {name: rs for name, rs in rows.items()
            if any(r["loop"] == "fastfair" and (r["images_per_s"] or (r["note"] or "").startswith(SETTLED))
                   for r in rs)}


COLUMNS = [("method", "method"), ("model", "model"), ("batch", "batch"), ("rung", "configuration"),
           ("images_per_s", "img/s"), ("ms_per_step", "ms/step"), ("s_per_epoch", "s/epoch (50k)"),
           ("x_reference", "x reference (same process)"), ("warm_s", "compile s (all at once)"),
           ("memory_gib", "GPU GiB (process)"), ("allocator_gib", "GPU GiB (allocator peak)"), ("note", "note")]


def main(argv=None) -> int:
    p = common.base_parser(__doc__)
    p.add_argument("--steps", type=int, help="timed steps per window at batch 128 (fewer at larger batches)")
    p.add_argument("--warmup", type=int, help="untimed steps first: compilation, CUDA graphs' warm-up and recording")
    p.add_argument("--attack-steps", type=int, help="PGD steps per training step (default 10)")
    p.add_argument("--compile-deadline", type=float, help="seconds the configurations have to compile, all at once")
    p.add_argument("--after-pid", type=int, help="time nothing before this process has ended (a part running "
                                                 "alongside: the GPU tests), waiting for it at most 120 s")
    args = p.parse_args(argv)
    full = dict(steps=10, warmup=4, attack_steps=10, compile_deadline=240.0)
    smoke = dict(steps=2, warmup=1, attack_steps=2, compile_deadline=300.0)
    common.fill_defaults(args, full, smoke)
    # ResNet-18 for the matrix and TRADES, WRN-34-10 (a step about 10x longer: 4 steps a window)
    args.models = ["tiny-cnn"] * 3 if args.smoke else ["resnet18", "resnet18", "wrn-34-10"]
    args.big_model_steps = args.steps if args.smoke else 4
    args.batches = [16, 32] if args.smoke else [128, 512]
    args.width, args.workers = (8, 1) if args.smoke else (0, 4)
    args.image_shape = [3, 16, 16] if args.smoke else [3, 32, 32]
    args.train_images = 256 if args.smoke else common.CIFAR10_EPOCH
    dev = common.pick_device(args.device)
    head = common.header(dev)
    plan = configs(args, dev)
    done = settled_before(common.result_path("training", head, args.out, args.smoke, args.tag or "plan"),
                          head["device"])
    skips = {c.spec.name: why for c in plan if (why := skip_reason(c, dev))}
    record = {k: getattr(args, k) for k in ("steps", "warmup", "attack_steps", "compile_deadline", "batches", "models",
                                            "width", "workers", "image_shape", "train_images")}
    rows: list[dict] = []

    def save():
        return common.save("training", head=head, settings=record, rows=rows, out_dir=args.out, smoke=args.smoke,
                           tag=args.tag or "plan", body=common.markdown_table(rows, COLUMNS))

    t0 = time.perf_counter()
    pool = Pool([c.spec for c in plan if c.spec.name not in skips and c.spec.name not in done], args, dev)
    try:
        status = pool.warm(args.compile_deadline)
        print(f"compiled in {time.perf_counter() - t0:.0f} s: {status}", flush=True)
        if args.after_pid:
            common.wait_for_pid(args.after_pid, 120)
        for c in plan:  # in order, each written as soon as it is timed: a killed part keeps what it measured
            name = c.spec.name
            if name in done:
                rows.extend(done[name])
                continue
            if name in skips:
                rows.extend(rows_of(c, f"skipped: {skips[name]}", None, None))
                continue
            note, timed = status[name], None
            if note == "warm":
                try:
                    timed = pool.solo(name)
                except RuntimeError as err:
                    note = str(err)
            rows.extend(rows_of(c, note, timed, pool.warm_s.get(name)))
            print(f"{name}: {rows[-1]['images_per_s'] or rows[-1]['note']}", flush=True)
            save()
    finally:
        pool.close()
    paths = save()
    print(paths[1].read_text())
    print("written:", *paths)
    settled = settled_before(paths[0], head["device"])
    left = [c.spec.name for c in plan if c.spec.name not in settled and c.spec.name not in skips]
    if left:
        print(f"not timed yet (run again to time only these): {'; '.join(left)}")
    return 3 if left else 0


if __name__ == "__main__":
    sys.exit(main())
