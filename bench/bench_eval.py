"""Evaluation cost: images/s of PGD-20 and CW-20 (and clean) over a 10k-image test set, through
fastfair's own evaluation path (fastfair.evaluation.per_class.confusion on a DeviceLoader), in fp32 as
evaluation runs by default, and in bf16 with --bf16.

    python bench/bench_eval.py             # GPU: ResNet-18, PreActResNet-18, WRN-34-10
    python bench/bench_eval.py --smoke     # any device: tiny CNN, 64 images (CI)

The model has random weights and the images are synthetic: PGD here has no early stop, so the
work per image does not depend on either. One batch per attack runs first, untimed (cuDNN
autotuning, lazy initialisation).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench import common  # noqa: E402
from fastfair import build  # noqa: E402
from fastfair.attacks import parse_attack, per_class  # noqa: E402
from fastfair.data import DeviceLoader  # noqa: E402
from fastfair.evaluation.per_class import confusion  # noqa: E402


def measure(model_name: str, attack: str, amp: torch.dtype | None, bundle, args, dev) -> dict:
    cfg = common.make_config("pgd-at", model_name, "cifar10", {"model.width": args.width, "train.device": str(dev),
                                                               "data.eval_batch_size": args.batch})
    cl = build.channels_last(cfg, dev)
    torch.manual_seed(0)
    model = build.model_from_spec(build.model_spec(cfg, bundle), dev, cl)
    c = bundle.num_classes
    eps_c, alpha_c = per_class(cfg.eval.eps, c, dev), per_class(cfg.eval.alpha, c, dev)
    atk = parse_attack(attack, cfg.eval.cw_kappa)
    x, y = bundle.x_test, bundle.y_test
    warm = DeviceLoader(x[: args.batch], y[: args.batch], args.batch, device=dev, train=False, channels_last=cl)
    loader = DeviceLoader(x, y, args.batch, device=dev, train=False, channels_last=cl)
    confusion(model, warm, atk, eps_c, alpha_c, c, amp)
    seconds = common.timed(lambda: confusion(model, loader, atk, eps_c, alpha_c, c, amp), dev)
    n = len(y)
    return {"model": model_name, "attack": attack, "precision": "bf16" if amp else "fp32", "batch": args.batch,
            "images": n, "seconds": seconds, "images_per_s": n / seconds,
            "s_per_10k": 10_000 * seconds / n}


COLUMNS = [("model", "model"), ("attack", "attack"), ("precision", "precision"), ("batch", "batch"),
           ("images", "images"), ("seconds", "seconds"), ("images_per_s", "img/s"), ("s_per_10k", "s per 10k images")]


def main(argv=None) -> None:
    p = common.base_parser(__doc__)
    p.add_argument("--models", nargs="+")
    p.add_argument("--attacks", nargs="+")
    p.add_argument("--images", type=int, help="test images (default 10,000)")
    p.add_argument("--batch", type=int, help="evaluation batch size (default 500, data.eval_batch_size)")
    p.add_argument("--width", type=int, help="model width (0: the paper's)")
    p.add_argument("--bf16", action="store_true", help="also time each attack under bf16 autocast")
    args = p.parse_args(argv)
    full = dict(models=["resnet18", "preact-resnet18", "wrn-34-10"], attacks=["clean", "pgd20", "cw20"],
                images=10_000, batch=500, width=0)
    smoke = dict(models=["tiny-cnn"], attacks=["clean", "pgd20", "cw20"], images=64, batch=32, width=8)
    for k, v in (smoke if args.smoke else full).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    dev = common.pick_device(args.device)
    shape = (3, 16, 16) if args.smoke else (3, 32, 32)
    bundle = common.synthetic_bundle(args.batch, args.images, shape)
    precisions = [None, torch.bfloat16] if args.bf16 else [None]
    rows = [measure(m, a, amp, bundle, args, dev) for m in args.models for a in args.attacks for amp in precisions]
    body = common.markdown_table(rows, COLUMNS)
    settings = {k: getattr(args, k) for k in ("models", "attacks", "images", "batch", "width", "bf16")}
    settings["image_shape"] = list(shape)
    paths = common.save("eval", head=common.header(dev), settings=settings, rows=rows, body=body,
                        out_dir=args.out, smoke=args.smoke)
    print(body)
    print("\nwritten:", *paths)


if __name__ == "__main__":
    main()
