"""Model FLOP utilisation of adversarial training: FLOPs of one training step counted with
torch.utils.flop_counter, the achieved TFLOP/s of fastfair's default path, the device's dense
bf16 peak, and the compute floor of a 50k-image epoch.

    python bench/bench_mfu.py                   # GPU: ResNet-18, PreActResNet-18, WRN-34-10
    python bench/bench_mfu.py --smoke           # any device: tiny CNN (CI)
    python bench/bench_mfu.py --peak-tflops 989 # a device missing from PEAK_BF16_TFLOPS
    python bench/bench_mfu.py --count-only --device cpu --batch 1 --steps 0   # FLOPs only

What is counted: torch.utils.flop_counter's formulas count matrix products and convolutions (2 FLOPs per
multiply-add) in forward and backward, as autograd runs them; BN, ReLU, pooling, the PGD
update, the optimiser and data augmentation are not counted (they are memory-bound and small
in FLOPs). A fastfair PGD-k step per image is k x (forward + input gradient) for the attack
(parameters frozen: no weight gradients) plus forward + input and weight gradients for the
update: about (2k + 3) forwards, 23 for PGD-10, which for ResNet-18 (1.11 GFLOP forward) is
the ~25.6 GFLOP per image of the issue. The reference-style PGD-AT loop also computes weight
gradients in every attack step: about (3k + 3) forwards.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402

from bench import common, reference_loop  # noqa: E402
from bench.bench_training import START  # noqa: E402

# Dense (no sparsity) bf16 tensor-core peaks from the vendors' datasheets, TFLOP/s; the first
# pattern found in torch.cuda.get_device_name() wins.
PEAK_BF16_TFLOPS = (
    ("H200", 989.4),  # H200 SXM: the same tensor cores and clocks as H100 SXM
    ("H100 PCIe", 756.5),
    ("H100", 989.4),  # H100 SXM5 ("NVIDIA H100 80GB HBM3")
    ("A100", 312.0),
)
RESNET18_PGD10_GFLOP = 25.6  # the figure, checked in every resnet18 pgd-at row


def peak_tflops(device_name: str) -> float | None:
    return next((peak for pattern, peak in PEAK_BF16_TFLOPS if pattern in device_name), None)


class _FlopCount(TorchDispatchMode):
    """Sums torch.utils.flop_counter's per-op formulas over every aten op that runs.

    FlopCounterMode itself cannot be used: its per-module backward hooks refuse the
    ``autograd.grad`` w.r.t. a leaf input that every PGD step takes.
    """

    def __init__(self):
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def count_flops(fn) -> int:
    with _FlopCount() as counter:
        fn()
    return counter.total


def step_flops(trainer, method: str) -> dict[str, float]:
    """FLOPs per image of a forward, of fastfair's train_step and of the reference step, on one batch."""
    x, y = next(iter(trainer.train_loader))
    n = len(y)
    model, cfg = trainer.model, trainer.cfg
    model.eval()
    with torch.no_grad():
        fwd = count_flops(lambda: model(x))
    ff = count_flops(lambda: trainer.train_step(x, y))
    ref_step = reference_loop.step_for(method)
    ref = count_flops(lambda: ref_step(model, trainer.opt, x, y, cfg))
    return {"forward": fwd / n, "fastfair": ff / n, "reference": ref / n}


def measure(method, model, dataset, args, dev, peak) -> dict:
    base = {"data.batch_size": args.batch, "train.device": str(dev), "attack.steps": args.attack_steps,
            "model.width": args.width}
    with tempfile.TemporaryDirectory() as tmp:
        # Counting runs eagerly in fp32 (FLOPs do not depend on the precision).
        flops = step_flops(common.make_trainer(method, model, dataset, {**START, **base}, Path(tmp) / "count"), method)
        r = {"model": model, "method": method, "batch": args.batch, "attack_steps": args.attack_steps,
             "fwd_gflop": flops["forward"] / 1e9, "step_gflop": flops["fastfair"] / 1e9,
             "step_in_forwards": flops["fastfair"] / flops["forward"], "reference_gflop": flops["reference"] / 1e9,
             "peak_tflops": peak}
        if peak:
            r["floor_s_per_epoch"] = common.CIFAR10_EPOCH * flops["fastfair"] / (peak * 1e12)
        if not args.count_only:
            trainer = common.make_trainer(method, model, dataset, base, Path(tmp) / "time")  # the default path
            seconds = common.time_steps(trainer.train_step, trainer.train_loader, args.steps, args.warmup, dev)
            img_s = args.steps * args.batch / seconds
            achieved = flops["fastfair"] * img_s / 1e12
            r.update(amp=str(trainer.amp).replace("torch.", "") if trainer.amp else "fp32",
                     channels_last=trainer.cl, images_per_s=img_s, achieved_tflops=achieved,
                     s_per_epoch=common.CIFAR10_EPOCH / img_s, mfu_percent=100 * achieved / peak if peak else None)
    if model == "resnet18" and method == "pgd-at" and args.attack_steps == 10 and args.width == 0:
        r["check"] = (f"{r['step_gflop']:.2f} GFLOP/img vs the issue's {RESNET18_PGD10_GFLOP} "
                      f"({100 * (r['step_gflop'] / RESNET18_PGD10_GFLOP - 1):+.1f}%)")
    return r


COLUMNS = [("model", "model"), ("method", "method"), ("batch", "batch"), ("amp", "precision"),
           ("fwd_gflop", "forward GFLOP/img"), ("step_gflop", "step GFLOP/img"), ("step_in_forwards", "step / forward"),
           ("reference_gflop", "reference step GFLOP/img"), ("images_per_s", "img/s"),
           ("achieved_tflops", "achieved TFLOP/s"), ("peak_tflops", "dense bf16 peak"), ("mfu_percent", "MFU %"),
           ("floor_s_per_epoch", "floor s/epoch (50k)"), ("s_per_epoch", "measured s/epoch (50k)"), ("check", "check")]


def main(argv=None) -> None:
    p = common.step_parser(__doc__)
    p.add_argument("--width", type=int, help="model width (0: the paper's)")
    p.add_argument("--count-only", action="store_true", help="count FLOPs, time nothing (any device; "
                   "FLOPs do not depend on it)")
    p.add_argument("--peak-tflops", type=float, help="dense bf16 peak of this device, if not in the table")
    args = p.parse_args(argv)
    full = dict(methods=["pgd-at", "trades"], models=["resnet18", "preact-resnet18", "wrn-34-10"], batch=128,
                steps=20, warmup=5, attack_steps=10, width=0)
    smoke = dict(methods=["pgd-at", "trades"], models=["tiny-cnn"], batch=8, steps=2, warmup=1, attack_steps=2, width=8)
    common.fill_defaults(args, full, smoke)
    dev = common.pick_device(args.device)
    head = common.header(dev)
    peak = args.peak_tflops or (peak_tflops(head["device"]) if dev.type == "cuda" else None)
    shape = (3, 16, 16) if args.smoke else (3, 32, 32)
    dataset = common.register_synthetic((args.warmup + args.steps + 1) * args.batch, 0, shape)
    rows = [measure(method, model, dataset, args, dev, peak) for model in args.models for method in args.methods]
    note = ("MFU = counted step FLOPs x images/s / dense bf16 peak; floor = 50,000 x step FLOPs / peak. "
            + ("" if peak else "No peak known for this device: MFU and floor are left empty."))
    body = "\n\n".join([common.markdown_table(rows, COLUMNS), note, __doc__.split("\n\n", 2)[2].strip()])
    settings = {k: getattr(args, k) for k in ("methods", "models", "batch", "steps", "warmup", "attack_steps", "width",
                                                "count_only")}
    settings.update(image_shape=list(shape), peak_tflops=peak)
    name = "mfu-count" if args.count_only else "mfu"
    paths = common.save(name, head=head, settings=settings, rows=rows, body=body, out_dir=args.out, smoke=args.smoke,
                        tag=args.tag)
    print(body)
    print("\nwritten:", *paths)


if __name__ == "__main__":
    main()
