"""Training throughput, side by side: the reference-style loop vs fastfair with its optimisations
added one at a time (images/s, ms per step, seconds per 50k-image epoch, ratio to the reference).

    python bench/bench_training.py             # GPU: pgd-at, trades, me-trades x ResNet-18,
                                               # PreActResNet-18, WRN-34-10; batch 128 + a sweep
    python bench/bench_training.py --smoke     # any device: tiny CNN, tiny batches (CI)
    python bench/bench_training.py --methods pgd-at --models resnet18 --steps 50

Each configuration (a rung) adds one thing to the one above it; the reference loop is in
bench/reference_loop.py. fastfair rungs run the real Trainer.train_step on its DeviceLoader,
configured only through config keys. Optimisations that fastfair does not have yet
(a config key or a kernel backend missing) are listed as skipped with the reason, never
imitated here. Keys: model.channels_last, train.amp, train.compile, train.cudagraphs,
train.cpp_wrapper, train.kernels. Seconds per epoch are 50,000 / (images/s) from the timed steps (synthetic
CIFAR-shaped data: throughput does not depend on the pixels).
"""
from __future__ import annotations

import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench import common, reference_loop  # noqa: E402


@dataclass(frozen=True)
class Rung:
    name: str
    adds: str
    loop: str  # reference | fastfair
    settings: dict = field(default_factory=dict)  # the config keys this rung sets
    cpu_loader: bool = False
    gpu_only: str = ""  # why the rung is not run on a CPU


RUNGS = (
    Rung("reference", "the papers' way: fp32, NCHW, CPU DataLoader with workers, weight gradients "
         "in the PGD-AT attack, .item() every step", "reference", cpu_loader=True),
    Rung("+ data on device", "the reference step fed by fastfair's DeviceLoader (uint8 on the device, "
         "crop + flip there)", "reference"),
    Rung("fastfair fp32", "fastfair's Trainer.train_step: frozen parameters during the attack, "
         "no per-step host sync", "fastfair"),
    Rung("+ channels_last", "model.channels_last = on", "fastfair", {"model.channels_last": "on"}),
    Rung("+ bf16 autocast", "train.amp = bf16 (losses stay fp32)", "fastfair", {"train.amp": "bf16"}),
    Rung("+ torch.compile", "train.compile = on, train.compile_attack = false: the model and the loss compiled, "
         "the K attack steps an eager loop around the compiled model", "fastfair",
         {"train.compile": "on", "train.compile_attack": False},
         gpu_only="GPU only here (on a CPU compilation time would swamp a smoke run)"),
    Rung("+ compiled attack", "train.compile_attack = true: the K attack steps, input gradients included, "
         "as one compiled graph", "fastfair", {"train.compile_attack": True},
         gpu_only="GPU only here (on a CPU compilation time would swamp a smoke run)"),
    Rung("+ CUDA graphs", "train.cudagraphs = on (the compiled regions recorded as CUDA graphs, the first steps "
         "checked against the step without)", "fastfair", {"train.cudagraphs": "on"}, gpu_only="needs CUDA"),
    Rung("+ fused kernels", "train.kernels = triton (fused loss and PGD-step kernels)", "fastfair",
         {"train.kernels": "triton"}, gpu_only="GPU only (on a CPU Triton runs in its interpreter)"),
    # Not one more step: every key back at its default, so the sweep below times the default too.
    Rung("fastfair default", "every key at its default: what `fastfair train` runs with no flags on this device",
         "fastfair", {"train.amp": "auto", "model.channels_last": "auto", "train.compile": "auto",
                      "train.compile_attack": True, "train.cudagraphs": "auto", "train.cpp_wrapper": "auto",
                      "train.kernels": "auto"}),
)
# Where every ladder starts: everything off that fastfair turns on by itself on a GPU
# (keys the core does not have yet are left out).
START = {k: v for k, v in {"train.amp": "off", "model.channels_last": "off", "train.compile": "off",
                           "train.cudagraphs": "off", "train.cpp_wrapper": "off",
                           "train.kernels": "torch"}.items() if common.has_key(k)}


def skip_reason(rung: Rung, dev: torch.device) -> str | None:
    reasons = [f"fastfair has no config key {k} yet" for k in rung.settings if not common.has_key(k)]
    if rung.gpu_only and dev.type != "cuda":
        reasons.append(rung.gpu_only)
    return "; ".join(reasons) or None


def stepper(loop: str, settings: dict, *, method, model, batch, dataset, args, dev, out: Path, cpu_loader=False):
    """(step, loader, trainer) of ``loop`` (reference | fastfair) with the accumulated config ``settings``: the
    reference step on the trainer's model, or fastfair's own ``Trainer.train_step``; compiled code of earlier
    trainers in this process is dropped first (``common.make_trainer``)."""
    overrides = {**START, **settings, "data.batch_size": batch, "train.device": str(dev),
                 "attack.steps": args.attack_steps, "model.width": args.width}
    trainer = common.make_trainer(method, model, dataset, overrides, out)
    if loop == "fastfair":
        return trainer.train_step, trainer.train_loader, trainer
    ref = reference_loop.step_for(method)
    step = lambda x, y: ref(trainer.model, trainer.opt, x.to(dev), y.to(dev), trainer.cfg)  # noqa: E731
    loader = trainer.train_loader
    if cpu_loader:
        d = trainer.cfg.data
        loader = reference_loop.loader(*trainer.test_split["train"], batch, padding=d.crop_padding, flip=d.flip,
                                       workers=args.workers, pin_memory=dev.type == "cuda")
    return step, loader, trainer


def measure(rung: Rung, settings: dict, *, method, model, batch, dataset, args, dev) -> float:
    """Images per second of ``rung`` with the accumulated ``settings``."""
    with tempfile.TemporaryDirectory() as tmp:
        step, loader, trainer = stepper(rung.loop, settings, method=method, model=model, batch=batch, dataset=dataset,
                                        args=args, dev=dev, out=Path(tmp), cpu_loader=rung.cpu_loader)
        try:
            seconds = common.time_steps(step, loader, args.steps, args.warmup, dev)
        finally:
            del step, loader, trainer  # before the next rung builds its own: one model on the GPU at a time
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    return args.steps * batch / seconds


def row(method, model, batch, rung_name, img_s=None, note=None) -> dict:
    r = {"method": method, "model": model, "batch": batch, "rung": rung_name, "images_per_s": img_s, "note": note}
    if img_s:
        r.update(ms_per_step=1e3 * batch / img_s, s_per_epoch=common.CIFAR10_EPOCH / img_s)
    return r


def run_one(rung, settings, **kw) -> tuple[float | None, str | None]:
    """(images/s, None), or (None, why) when the rung failed: recorded in its row, the bench goes on."""
    try:
        return measure(rung, settings, **kw), None
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, "out of GPU memory"
    except Exception as err:  # noqa: BLE001 -- a failing optimisation is a result to record, not a crash
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        first = (str(err).strip().splitlines() or [""])[0][:200]
        return None, f"failed: {type(err).__name__}: {first}"


def ladder(method: str, model: str, args, dev, dataset: str, emit) -> None:
    """The rungs at the paper batch size, then the last rung that ran at each sweep batch size;
    each row goes to ``emit`` as soon as it is measured (a killed bench keeps what it measured).

    ``args.rungs`` (names) measures only those rungs, each with the settings of every rung above
    it: ``--rungs reference "+ fused kernels"`` is the reference beside fastfair's full stack.
    """
    settings, ref, prev, best = {}, None, None, None
    kw = dict(method=method, model=model, args=args, dev=dev, dataset=dataset)
    for rung in RUNGS:
        why = skip_reason(rung, dev)
        trial = {**settings, **rung.settings}
        if args.rungs and rung.name not in args.rungs:
            settings = settings if why else trial
            continue
        if why:
            emit(row(method, model, args.batch, rung.name, note=f"skipped: {why}"))
            continue
        img_s, err = run_one(rung, trial, batch=args.batch, **kw)
        r = row(method, model, args.batch, rung.name, img_s, err)
        if img_s:
            settings, ref, best = trial, ref or img_s, rung
            r.update(x_reference=img_s / ref, x_previous=img_s / prev if prev else None)
            prev = img_s
        emit(r)
    for batch in args.sweep if best and best.loop == "fastfair" else ():  # the last rung that ran
        img_s, err = run_one(best, settings, batch=batch, **kw)
        r = row(method, model, batch, f"{best.name} (sweep)", img_s, err)
        if img_s and ref:
            r["x_reference"] = img_s / ref
        emit(r)


def headline(rows: list[dict]) -> list[str]:
    """Per method and model: best fastfair / reference at the paper batch size, and the fastest batch."""
    out = []
    for key in dict.fromkeys((r["method"], r["model"]) for r in rows):
        group = [r for r in rows if (r["method"], r["model"]) == key and r["images_per_s"]]
        ref = next((r for r in group if r["rung"] == "reference"), None)
        ff = [r for r in group if r["rung"] not in ("reference", "+ data on device")]
        if not ref or not ff:
            continue
        same = max((r for r in ff if r["batch"] == ref["batch"]), key=lambda r: r["images_per_s"])
        fast = max(ff, key=lambda r: r["images_per_s"])
        out.append(f"- {key[0]}, {key[1]}: fastfair / reference = "
                   f"**{same['images_per_s'] / ref['images_per_s']:.1f}x** "
                   f"at batch {ref['batch']} ({same['rung']}: {same['s_per_epoch']:.1f} s/epoch vs "
                   f"{ref['s_per_epoch']:.1f}); fastest batch {fast['batch']}: {fast['images_per_s']:,.0f} img/s, "
                   f"{fast['s_per_epoch']:.1f} s/epoch ({fast['images_per_s'] / ref['images_per_s']:.1f}x)")
    return out


COLUMNS = [("method", "method"), ("model", "model"), ("batch", "batch"), ("rung", "configuration"),
           ("images_per_s", "img/s"), ("ms_per_step", "ms/step"), ("s_per_epoch", "s/epoch (50k)"),
           ("x_reference", "x reference"), ("x_previous", "x previous"), ("note", "note")]


def main(argv=None) -> None:
    p = common.step_parser(__doc__)
    p.add_argument("--sweep", type=int, nargs="*", help="batch sizes tried for the fastest fastfair rung")
    p.add_argument("--workers", type=int, help="DataLoader worker processes of the reference loop")
    p.add_argument("--width", type=int, help="model width (0: the paper's)")
    p.add_argument("--rungs", nargs="+", metavar="NAME", help="measure only these rungs (settings of the ones above "
                                                             "still apply); default: all")
    args = p.parse_args(argv)
    full = dict(methods=["pgd-at", "trades", "me-trades"], models=["resnet18", "preact-resnet18", "wrn-34-10"],
                batch=128, sweep=[256, 512, 1024], steps=20, warmup=5, attack_steps=10, workers=4, width=0)
    smoke = dict(methods=["pgd-at", "trades"], models=["tiny-cnn"], batch=16, sweep=[32], steps=2,
                 warmup=1, attack_steps=2, workers=1, width=8)
    common.fill_defaults(args, full, smoke)
    dev = common.pick_device(args.device)
    shape = (3, 16, 16) if args.smoke else (3, 32, 32)
    n_train = (args.warmup + common.REPEATS * args.steps) * max([args.batch, *args.sweep])
    dataset = common.register_synthetic(max(n_train, 256 if args.smoke else common.CIFAR10_EPOCH), 0, shape)
    settings = {k: getattr(args, k) for k in ("methods", "models", "batch", "sweep", "steps", "warmup",
                                                "attack_steps", "workers", "width", "rungs")}
    settings.update(image_shape=list(shape), repeats=common.REPEATS)
    head = common.header(dev)
    legend = "\n".join(f"- **{r.name}**: {r.adds}" for r in RUNGS)
    rows: list[dict] = []

    def write() -> tuple[Path, Path]:
        body = "\n\n".join(["## Headline", "\n".join(headline(rows)) or "(no complete ladder)",
                             "## All configurations", common.markdown_table(rows, COLUMNS),
                             "Each configuration adds one thing to the one above it that ran:", legend])
        return common.save("training", head=head, settings=settings, rows=rows, body=body, out_dir=args.out,
                           smoke=args.smoke, tag=args.tag)

    def emit(r: dict) -> None:
        rows.append(r)
        write()

    for method in args.methods:
        for model in args.models:
            ladder(method, model, args, dev, dataset, emit)
            print(f"done: {method} {model}", flush=True)
    paths = write()
    print((paths[1]).read_text())
    print("\nwritten:", *paths)


if __name__ == "__main__":
    main()
