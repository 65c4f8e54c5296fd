"""Evaluation cost: images/s of PGD-20 and CW-20 (and clean) over a 10k-image test set, through
fastfair's own evaluation path (fastfair.evaluation.per_class.confusion on a DeviceLoader), in fp32 as
evaluation runs by default, and in bf16 with --bf16; and of standard AutoAttack (``--aa``, the
official pyautoattack backend through fastfair.attacks.autoattack.evaluate_split, always fp32).

    python bench/bench_eval.py             # GPU: ResNet-18, PreActResNet-18, WRN-34-10
    python bench/bench_eval.py --models resnet18 --attacks --aa   # AA only; target on an H100:
                                           # the 10k CIFAR-10 test set in at most 180 s
    python bench/bench_eval.py --smoke     # any device: tiny CNN, 64 images (CI), AA included

The model has random weights and the images are synthetic: PGD here has no early stop, so the
work per image does not depend on either. One batch per attack runs first, untimed (cuDNN
autotuning, lazy initialisation).

AutoAttack stops attacking a point once it is broken, so its cost depends on the model. Two rows
bound it: ``aa (ceiling)`` runs at eps = 1e-6, where nothing breaks and every sub-attack (APGD-CE,
APGD-T and FAB-T with 9 targets, Square with 5000 queries) runs on every image: the cost of a
model robust on every image. ``aa (random weights)`` runs at eps 8/255 with the labels set to the
model's own predictions: APGD-CE breaks almost every point, about the least AA can cost. A robust
CIFAR-10 ResNet-18 (about 50% AA accuracy) lies in between, near half the ceiling.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench import common  # noqa: E402
from fastfair import build  # noqa: E402
from fastfair.attacks import autoattack, parse_attack, per_class  # noqa: E402
from fastfair.data import DeviceLoader  # noqa: E402
from fastfair.evaluation.per_class import confusion  # noqa: E402


def _model(model_name: str, bundle, args, dev):
    cfg = common.make_config("pgd-at", model_name, "cifar10", {"model.width": args.width, "train.device": str(dev),
                                                               "data.eval_batch_size": args.batch})
    cl = build.channels_last(cfg, dev)
    torch.manual_seed(0)
    return cfg, cl, build.model_from_spec(build.model_spec(cfg, bundle), dev, cl)


# AutoAttack rows: (label, eps, images); see the module docstring for what each bounds
def aa_rows(args) -> tuple:
    return (("aa (random weights)", 8 / 255, args.aa_images), ("aa (ceiling)", 1e-6, args.aa_ceiling_images))


# A robust CIFAR-10 ResNet-18 keeps about half its images through APGD-CE (AutoAttack accuracy about 50%), and the
# later sub-attacks run only on those
ROBUST_FRACTION = 0.5


def robust_prediction(low: dict, ceiling: dict) -> dict:
    """PREDICTED seconds of standard AutoAttack on 10k images of a robust model from the two bounds: APGD-CE on every
    image (the random-weights row, where APGD-CE breaks nearly every image and nothing else runs) plus, on
    ``ROBUST_FRACTION`` of them, the rest of the ceiling row's per-image cost."""
    per_image = {r["attack"]: r["seconds"] / r["images"] for r in (low, ceiling)}
    seconds = 10_000 * (per_image[low["attack"]] + ROBUST_FRACTION * (per_image[ceiling["attack"]]
                                                                       - per_image[low["attack"]]))
    return {**{k: low[k] for k in ("model", "precision", "batch", "aa_backend")},
            "attack": f"aa (robust model, {ROBUST_FRACTION:.0%} robust: PREDICTED from the two rows above)",
            "images": 10_000, "seconds": seconds, "images_per_s": 10_000 / seconds, "s_per_10k": seconds}


def measure_aa(model_name: str, label: str, eps: float, images: int, bundle, args, dev) -> dict:
    """Seconds of one standard AutoAttack over ``images`` test images, labels = the model's clean predictions."""
    _, cl, model = _model(model_name, bundle, args, dev)
    model.eval()
    x = bundle.x_test[:images]
    with torch.no_grad():  # labels = clean predictions: every image starts robust, so every image is attacked
        y = torch.cat([model(x[i:i + args.batch].to(dev).float() / 255).argmax(1).cpu()
                       for i in range(0, len(x), args.batch)])
    loader = DeviceLoader(x, y, args.batch, device=dev, train=False, channels_last=cl)
    c = bundle.num_classes
    # untimed warm-up: one image, so the timed run's cuDNN/lazy set-up is done; at eps 8/255, where APGD-CE breaks
    # it and the later sub-attacks skip it: at the ceiling's eps every sub-attack would run on it, and their
    # per-iteration cost, not the image count, sets a small batch's time, so the warm-up cost as much as the row
    autoattack.evaluate_split(model, DeviceLoader(x[:1], y[:1], 1, device=dev, train=False, channels_last=cl),
                              eps=8 / 255, num_classes=c, backend=args.aa_backend)
    rec = {}

    def run():
        rec.update(autoattack.evaluate_split(model, loader, eps=eps, num_classes=c, backend=args.aa_backend)[1])

    seconds = common.timed(run, dev)
    n = len(y)
    return {"model": model_name, "attack": label, "precision": "fp32", "batch": args.batch, "images": n,
            "seconds": seconds, "images_per_s": n / seconds, "s_per_10k": 10_000 * seconds / n,
            "aa_backend": f"{rec['backend']} {rec['backend_version']}", "aa_robust": rec["robust_after"]["square"]}


def measure(model_name: str, attack: str, amp: torch.dtype | None, bundle, args, dev) -> dict:
    cfg, cl, model = _model(model_name, bundle, args, dev)
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
           ("images", "images"), ("seconds", "seconds"), ("images_per_s", "img/s"), ("s_per_10k", "s per 10k images"),
           ("aa_backend", "AA backend"), ("aa_robust", "AA robust %")]


def main(argv=None) -> None:
    p = common.base_parser(__doc__)
    p.add_argument("--models", nargs="+")
    p.add_argument("--attacks", nargs="*", help="PGD-family attacks to time (none: only AutoAttack with --aa)")
    p.add_argument("--images", type=int, help="test images (default 10,000)")
    p.add_argument("--batch", type=int, help="evaluation batch size (default 500, data.eval_batch_size)")
    p.add_argument("--width", type=int, help="model width (0: the paper's)")
    p.add_argument("--bf16", action="store_true", help="also time each attack under bf16 autocast")
    p.add_argument("--aa", action="store_true", help="also time standard AutoAttack (on with --smoke)")
    p.add_argument("--aa-backend", default="auto", help="AutoAttack backend (default: the official pyautoattack)")
    p.add_argument("--aa-images", type=int, help="test images AutoAttack runs on (default: --images; smoke: 8)")
    p.add_argument("--aa-ceiling-images", type=int, help="test images of the ceiling row, whose cost grows with each "
                                                         "image (default: --aa-images); then a third row PREDICTS a "
                                                         "robust model's 10k from the two")
    args = p.parse_args(argv)
    full = dict(models=["resnet18", "preact-resnet18", "wrn-34-10"], attacks=["clean", "pgd20", "cw20"],
                images=10_000, batch=500, width=0, aa_images=None)
    # smoke AA: one batch of 8, so the ceiling row's 5000 Square queries run once
    smoke = dict(models=["tiny-cnn"], attacks=["clean", "pgd20", "cw20"], images=64, batch=32, width=8, aa_images=8)
    args.aa = args.aa or args.smoke
    common.fill_defaults(args, full, smoke)
    args.aa_images = args.aa_images or args.images
    args.aa_ceiling_images = args.aa_ceiling_images or args.aa_images
    dev = common.pick_device(args.device)
    shape = (3, 16, 16) if args.smoke else (3, 32, 32)
    bundle = common.synthetic_bundle(args.batch, args.images, shape)
    precisions = [None, torch.bfloat16] if args.bf16 else [None]
    rows = [measure(m, a, amp, bundle, args, dev) for m in args.models for a in args.attacks for amp in precisions]
    for m in args.models if args.aa else ():
        low, ceiling = (measure_aa(m, label, eps, n, bundle, args, dev) for label, eps, n in aa_rows(args))
        rows += [low, ceiling, robust_prediction(low, ceiling)]
    body = common.markdown_table(rows, COLUMNS)
    settings = {k: getattr(args, k) for k in ("models", "attacks", "images", "batch", "width", "bf16", "aa",
                                              "aa_images", "aa_ceiling_images", "aa_backend")}
    settings["image_shape"] = list(shape)
    paths = common.save("eval", head=common.header(dev), settings=settings, rows=rows, body=body,
                        out_dir=args.out, smoke=args.smoke, tag=args.tag)
    print(body)
    print("\nwritten:", *paths)


if __name__ == "__main__":
    main()
