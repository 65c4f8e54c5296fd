"""Does bf16 autocast change robustness? Trains the same short PGD-AT run on the CIFAR-10 subset
twice per seed, with train.amp = off and = bf16 (everything else, seed included, the same),
then evaluates both final models in fp32 with clean and PGD-20 on the subset's test images.

    python bench/investigations/check_bf16_robustness.py           # GPU: ResNet-18, 30 epochs, seeds 0 1
    python bench/investigations/check_bf16_robustness.py --smoke   # any device: tiny CNN, 1 epoch (CI)

"Within noise" is judged against the binomial standard error of a difference of two
accuracies on the test images: |PGD-20(bf16) - PGD-20(fp32)| <= 2 SE (a heuristic; with a few
seeds, also compare with the seed-to-seed spread in the table).
"""
from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np  # noqa: E402

from bench import common  # noqa: E402
from fastfair import build  # noqa: E402
from fastfair.errors import UserError  # noqa: E402
from fastfair.evaluation.per_class import evaluate  # noqa: E402

SUBSET = common.SHARED_DATA / "cifar10-subset.npz"


def tiny_copy(src: Path, dst: Path, n_train: int, n_test: int) -> Path:
    """The first images of the subset, for a smoke run."""
    with np.load(src) as f:
        np.savez(dst, x_train=f["x_train"][:n_train], y_train=f["y_train"][:n_train],
                 x_test=f["x_test"][:n_test], y_test=f["y_test"][:n_test])
    return dst


def train_and_eval(amp: str, seed: int, data: Path, args, dev, out: Path) -> dict:
    overrides = {"data.data_dir": str(data), "data.batch_size": args.batch, "data.val_per_class": 10,
                 "train.epochs": args.epochs, "train.seed": seed, "train.amp": amp, "train.device": str(dev),
                 # decays after 75% and 90% of the epochs, where the run has an epoch after them
                 "train.lr_milestones": [m for m in (int(args.epochs * f) for f in (0.75, 0.9)) if 0 < m < args.epochs],
                 "train.val_attack": "fgsm", "train.select": "last", "attack.steps": args.attack_steps,
                 "model.width": args.width}
    trainer = common.make_trainer("pgd-at", args.model, "npz", overrides, out)
    seconds = common.timed(trainer.fit, dev)
    cfg = trainer.cfg
    loader = build.eval_loader(cfg, trainer.test_split["test"], dev, trainer.cl)
    res = evaluate(trainer.model, loader, ["clean", "pgd20"], eps=cfg.eval.eps, alpha=cfg.eval.alpha,
                   classes=trainer.bundle.classes, cw_kappa=cfg.eval.cw_kappa)  # fp32
    return {"seed": seed, "train_amp": amp, "train_seconds": seconds, "test_images": len(trainer.test_split["test"][1]),
            "clean": res["clean"]["summary"]["avg"], "pgd20": res["pgd20"]["summary"]["avg"],
            "pgd20_worst": res["pgd20"]["summary"]["worst"]}


def verdict(rows: list[dict]) -> dict:
    by = {amp: [r for r in rows if r["train_amp"] == amp] for amp in ("off", "bf16")}
    p32, p16 = (float(np.mean([r["pgd20"] for r in by[a]])) for a in ("off", "bf16"))
    n = sum(r["test_images"] for r in by["off"])  # images behind each mean
    se = 100 * math.sqrt((p32 / 100) * (1 - p32 / 100) / n + (p16 / 100) * (1 - p16 / 100) / n)
    return {"pgd20_fp32": p32, "pgd20_bf16": p16, "difference": p16 - p32, "se_difference": se,
            "within_noise": abs(p16 - p32) <= 2 * se}


COLUMNS = [("seed", "seed"), ("train_amp", "train.amp"), ("train_seconds", "train s"), ("clean", "clean %"),
           ("pgd20", "PGD-20 %"), ("pgd20_worst", "PGD-20 worst class %"), ("test_images", "test images")]


def main(argv=None) -> None:
    p = common.base_parser(__doc__)
    p.add_argument("--data", type=Path, default=SUBSET, help="the CIFAR-10 subset .npz")
    p.add_argument("--model")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seeds", type=int, nargs="+")
    p.add_argument("--batch", type=int)
    p.add_argument("--attack-steps", type=int)
    p.add_argument("--width", type=int)
    args = p.parse_args(argv)
    full = dict(model="resnet18", epochs=30, seeds=[0, 1], batch=128, attack_steps=10, width=0)
    smoke = dict(model="tiny-cnn", epochs=1, seeds=[0], batch=32, attack_steps=2, width=8)
    common.fill_defaults(args, full, smoke)
    if not args.data.is_file():
        raise SystemExit(f"no data at {args.data}: pass --data FILE.npz (the CIFAR-10 subset of ../shared/data)")
    dev = common.pick_device(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        data = tiny_copy(args.data, Path(tmp) / "tiny.npz", 300, 100) if args.smoke else args.data
        try:
            for seed in args.seeds:
                for amp in ("off", "bf16"):
                    rows.append(train_and_eval(amp, seed, data, args, dev, Path(tmp) / f"{amp}-{seed}"))
                    print(rows[-1], flush=True)
        except UserError as err:
            raise SystemExit(f"error: {err}") from None
    v = verdict(rows)
    summary = (f"PGD-20 (fp32 eval) after training in fp32: {v['pgd20_fp32']:.2f}%, in bf16: {v['pgd20_bf16']:.2f}%; "
               f"difference {v['difference']:+.2f} points, 2 SE = {2 * v['se_difference']:.2f}: "
               f"{'within noise' if v['within_noise'] else 'OUTSIDE noise'}.")
    body = "\n\n".join([common.markdown_table(rows, COLUMNS), summary])
    settings = {k: (str(v_) if isinstance(v_, Path) else v_) for k, v_ in vars(args).items() if k not in ("out",)}
    paths = common.save("bf16-robustness", head=common.header(dev), settings={**settings, "verdict": v}, rows=rows,
                        body=body, out_dir=args.out, smoke=args.smoke, tag=args.tag)
    print(body)
    print("\nwritten:", *paths)


if __name__ == "__main__":
    main()
