"""``fastfair`` command line: train, eval, and listings of what exists."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import UserError


def _listing(rows: list[tuple[str, str]]) -> None:
    width = max(len(n) for n, _ in rows)
    for name, doc in rows:
        print(f"{name:<{width}}  {doc}")


def cmd_methods(args) -> None:
    from .methods import METHODS

    _listing(METHODS.table())


def cmd_models(args) -> None:
    from .models import MODELS

    _listing(MODELS.table())


def cmd_datasets(args) -> None:
    from .data import DATASETS

    _listing(DATASETS.table())


def cmd_presets(args) -> None:
    from .config import preset_names, read_preset

    _listing([(n, str(read_preset(n).get("preset", ""))) for n in preset_names()])


def cmd_train(args) -> None:
    from . import config, distributed
    from .train import Trainer, final_evaluation

    flags = {"method.name": args.method, "data.dataset": args.dataset, "data.data_dir": args.data_dir,
             "model.name": args.model, "train.epochs": args.epochs, "train.device": args.device,
             "train.seed": args.seed}
    saved = Path(args.out or "") / "config.toml" if args.out else None
    if args.resume:
        if not saved or not saved.is_file():
            raise UserError("--resume needs --out RUN_DIR of an earlier run (it holds config.toml and checkpoints/)")
        cfg = config.resolve(None, flags, args.set, base=config.load_saved(saved))
    else:
        cfg = config.resolve(args.config, flags, args.set)
    out = Path(args.out or f"runs/{cfg.method.name}-{cfg.data.dataset}")
    distributed.init(cfg)  # under torchrun: join the process group (fastfair/distributed.py)
    try:
        trainer = Trainer(cfg, out, resume=args.resume, quiet=args.quiet)
        trainer.fit()
        final_evaluation(out, cfg, quiet=args.quiet)
    finally:
        distributed.shutdown()


def cmd_eval(args) -> None:
    from .evaluate import evaluate_checkpoint

    target = Path(args.target)
    if target.is_dir():
        name = args.checkpoint
        if name == "auto":
            from .config import load_saved_text

            select = load_saved_text((target / "config.toml").read_text()).train.select if (target / "config.toml").is_file() else "pgd"
            name = "last" if select == "last" else f"best_{select}"
        target = target / "checkpoints" / f"{name}.pt"
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    evaluate_checkpoint(target, attacks=attacks, split=args.split, data_dir=args.data_dir, device=args.device,
                        batch_size=args.batch_size, amp=args.bf16, quiet=args.quiet)


def cmd_grid(args) -> int:
    from .grid import run_grid

    return run_grid(args.grid, out=args.out, gpus=args.gpus, per_gpu=args.per_gpu, launcher=args.launcher,
                    dry_run=args.dry_run)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fastfair", description="Fast class-wise fair adversarial training.")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", help="train a model, then evaluate it per class")
    t.add_argument("--method", help="training method (fastfair methods)")
    t.add_argument("--config", help="TOML preset: a file or a name from `fastfair presets`")
    t.add_argument("--dataset", help="data set (fastfair datasets)")
    t.add_argument("--data-dir", help="folder (or .npz file) holding the data set")
    t.add_argument("--model", help="model (fastfair models)")
    t.add_argument("--epochs", type=int)
    t.add_argument("--seed", type=int)
    t.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    t.add_argument("--out", help="run directory (default runs/METHOD-DATASET)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=0.05 (repeatable)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--quiet", action="store_true")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="per-class evaluation of a run or checkpoint")
    e.add_argument("target", help="RUN_DIR or CHECKPOINT.pt")
    e.add_argument("--attacks", default="clean,pgd20,cw20", help="comma-separated: clean, fgsm, pgdK, pgdKxR, cwK, tpgdK@tT")
    e.add_argument("--split", default="test", choices=["test", "val"])
    e.add_argument("--checkpoint", default="auto", help="in a run dir: best_pgd | best_fair | last (default: the run's train.select)")
    e.add_argument("--data-dir")
    e.add_argument("--device", default="auto")
    e.add_argument("--batch-size", type=int)
    e.add_argument("--bf16", action="store_true", help="attack and predict under bf16 autocast (default fp32)")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=cmd_eval)

    g = sub.add_parser("grid", help="run a grid of trainings (axes over config keys), then one comparison table")
    g.add_argument("grid", help="grid TOML file (see configs/grids/) or the name of a shipped grid")
    g.add_argument("--out", help="grid directory (default runs/grids/GRID_NAME); one folder per run inside")
    g.add_argument("--gpus", default="auto", help="comma-separated GPU ids, 'cpu', or auto (all visible GPUs, else cpu)")
    g.add_argument("--per-gpu", type=int, default=1, metavar="K", help="concurrent runs per GPU (see bench/bench_concurrency.py)")
    g.add_argument("--launcher", default="local", help="local | submitit (SLURM job arrays; pip install fastfair[submitit])")
    g.add_argument("--dry-run", action="store_true", help="print the runs the grid expands to and their state; run nothing")
    g.set_defaults(func=cmd_grid)

    for name, func, helptext in (("methods", cmd_methods, "list training methods"),
                                 ("models", cmd_models, "list models"),
                                 ("datasets", cmd_datasets, "list data sets"),
                                 ("presets", cmd_presets, "list config presets and the paper tables they reproduce")):
        sub.add_parser(name, help=helptext).set_defaults(func=func)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args) or 0  # grid returns 1 when a run failed
    except UserError as err:
        print(f"fastfair: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
