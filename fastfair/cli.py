"""``fastfair`` command line: train, eval, diagnose, report, grid, data convert, and listings of what exists."""
from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from fastfair import config, ops
from fastfair.attacks import autoattack
from fastfair.checks import check_config
from fastfair.config import preset_names, read_preset
from fastfair.data import DATASETS, ffcv
from fastfair.errors import UserError
from fastfair.evaluation.diagnose import diagnose_checkpoint
from fastfair.evaluation.per_class import evaluate_checkpoint
from fastfair.methods import METHODS, OPTIONS, declared_keys
from fastfair.models import MODELS
from fastfair.reports.report import write_report
from fastfair.reproduce.command import reproduce
from fastfair.reproduce.runs import SCALES
from fastfair.rundir import RunDir
from fastfair.scaleout import distributed
from fastfair.scaleout.grid import run_grid
from fastfair.training.averaging import AVERAGING
from fastfair.training.selection import SELECTION
from fastfair.training.trainer import Trainer, final_evaluation

SEED_HELP = "seed of every random start of the attacks (default: the run's eval.seed); recorded in the JSON"
CHECKPOINT_HELP = ("in a run dir: last, or best_<policy> for a selection policy of `fastfair methods`; "
                   "add _avg for the EMA/FAWA model (default: the run's train.select)")


def _listing(rows: list[tuple[str, str]]) -> None:
    width = max(len(n) for n, _ in rows)
    for name, doc in rows:
        print(f"{name:<{width}}  {doc}")


def cmd_methods(args) -> None:
    rows = []
    for name in METHODS:
        rows += [(name, METHODS.doc(name))]
        rows += [(f"  {key}", f"{doc} (default {default!r})")
                 for owner, key, default, doc in declared_keys() if owner == name]
    _listing(rows)
    print("\noptions that combine with the methods above (each a config section):")
    _listing([row for name in OPTIONS for row in [(name, OPTIONS.doc(name)),
              *[(f"  {key}", f"{doc} (default {default!r})") for owner, key, default, doc in declared_keys()
                if owner == name]]])
    print("\nweight averaging (train.averaging):")
    _listing(AVERAGING.table())
    print("\ncheckpoint selection (train.select; each scored policy keeps checkpoints/best_<name>.pt):")
    _listing(SELECTION.table())
    print("\nkernel backends (train.kernels):")
    _listing(ops.BACKENDS.table())


def cmd_models(args) -> None:
    _listing(MODELS.table())


def cmd_datasets(args) -> None:
    _listing(DATASETS.table())


def cmd_presets(args) -> None:
    _listing([(n, str(read_preset(n).get("preset", ""))) for n in preset_names()])


def cmd_train(args) -> None:
    flags = {"method.name": args.method, "data.dataset": args.dataset, "data.data_dir": args.data_dir,
             "model.name": args.model, "train.epochs": args.epochs, "train.device": args.device,
             "train.seed": args.seed, "train.kernels": args.kernels,
             "train.compile": {True: "on", False: "off", None: None}[args.compile],
             "train.cudagraphs": args.cudagraphs, "data.loader": args.loader, "data.beton_dir": args.beton_dir,
             **_fairness_flags(args)}
    saved = RunDir(args.out).config if args.out else None
    if args.resume:
        if not saved or not saved.is_file():
            raise UserError("--resume needs --out RUN_DIR of an earlier run (it holds config.toml and checkpoints/)")
        # flags and --set go over the saved config; the Trainer refuses changes outside config.RESUMABLE
        cfg = config.resolve(args.config, flags, args.set, base=config.load_saved(saved))
    else:
        cfg = config.resolve(args.config, flags, args.set)
    check_config(cfg)  # before the run folder is made
    out = Path(args.out or f"runs/{cfg.method.name}-{cfg.data.dataset}")
    distributed.init(cfg)  # under torchrun: join the process group (fastfair/distributed.py)
    try:
        # one writer per run folder; torchrun's other ranks write nothing
        with RunDir(out).lock() if distributed.current().is_main else contextlib.nullcontext():
            trainer = Trainer(cfg, out, resume=args.resume, quiet=args.quiet)
            trainer.fit()
            final_evaluation(out, cfg, quiet=args.quiet)
    finally:
        distributed.shutdown()


def cmd_data_convert(args) -> None:
    paths = ffcv.convert_dataset(args.dataset, args.data_dir, args.out, val_per_class=args.val_per_class,
                                        jpeg=args.jpeg, jpeg_quality=args.jpeg_quality, num_workers=args.workers)
    meta = ffcv.read_meta(args.out)
    for split, path in paths.items():
        print(f"{split:5s} {meta['splits'][split]['n']:7d} images  {path}")
    print(f"train with: fastfair train --dataset {args.dataset} --loader ffcv --beton-dir {args.out}"
          + (f" --data-dir {args.data_dir}" if args.data_dir else ""))


def _checkpoint_path(args) -> Path:
    """RUN_DIR -> RUN_DIR/checkpoints/<--checkpoint>.pt (auto: the run's train.select); a .pt path stays."""
    target = Path(args.target)
    if not target.is_dir():
        return target
    run = RunDir(target)
    if args.checkpoint != "auto":
        return run.checkpoint(args.checkpoint)
    return run.selected_checkpoint(config.load_saved_text(run.read_config()).train.select)


def cmd_eval(args) -> None:
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    evaluate_checkpoint(_checkpoint_path(args), attacks=attacks, split=args.split, data_dir=args.data_dir,
                        device=args.device, batch_size=args.batch_size, amp=args.bf16, quiet=args.quiet,
                        aa_backend=args.aa_backend, seed=args.seed)


# ---- evaluation-and-report additions (diagnose, report) ---------------------------------------

def cmd_diagnose(args) -> None:
    diagnose_checkpoint(_checkpoint_path(args), attack=args.attack, split=args.split, data_dir=args.data_dir,
                        device=args.device, batch_size=args.batch_size, tsne_points=args.tsne, quiet=args.quiet,
                        seed=args.seed)


def cmd_report(args) -> None:
    out = Path(args.out or (Path(args.runs[0]) / "report" if len(args.runs) == 1 else "report"))
    path = write_report(args.runs, out, baseline=args.baseline, attack=args.attack, split=args.split)
    print(f"written: {path} (figures in {out / 'figures'}, LaTeX tables in {out / 'tables.tex'})")


def _add_report_commands(sub) -> None:
    d = sub.add_parser("diagnose", help="per-class diagnostics of a checkpoint (features, weights, entropy, t-SNE)")
    d.add_argument("target", help="RUN_DIR or CHECKPOINT.pt")
    d.add_argument("--attack", default="pgd20",
                   help="attack for the adversarial side (clean, fgsm, pgdK, cwK, tpgdK@tT)")
    d.add_argument("--split", default="test", choices=["test", "val"])
    d.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    d.add_argument("--tsne", type=int, default=500, metavar="N", help="images in the t-SNE (0: skip it)")
    d.add_argument("--data-dir")
    d.add_argument("--device", default="auto")
    d.add_argument("--batch-size", type=int)
    d.add_argument("--seed", type=int, help=SEED_HELP)
    d.add_argument("--quiet", action="store_true")
    d.set_defaults(func=cmd_diagnose)

    r = sub.add_parser("report", help="Markdown report with PNG figures and LaTeX tables of one or more runs")
    r.add_argument("runs", nargs="+", metavar="RUN_DIR")
    r.add_argument("--out", help="output folder (default RUN_DIR/report for one run, ./report for several)")
    r.add_argument("--baseline", metavar="RUN_DIR", help="run (or one seed of a group) that rho is measured against")
    r.add_argument("--attack", help="robust column of the comparison (default: aa when every run has it)")
    r.add_argument("--split", default="test", choices=["test", "val"])
    r.set_defaults(func=cmd_report)


# ---- fairness-method flags (shorthands for config keys) ---------------------------------------
def _int_list(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated class indices such as 3,5; got {text!r}") from None


def _add_fairness_flags(t: argparse.ArgumentParser) -> None:
    g = t.add_argument_group("fairness options (shorthands for --set keys)")
    g.add_argument("--ccm", action="store_const", const=True, help="CFA class-wise calibrated margin (ccm.enabled)")
    g.add_argument("--ccr", action="store_const", const=True,
                   help="CFA class-wise calibrated TRADES beta (ccr.enabled)")
    avg = g.add_mutually_exclusive_group()
    avg.add_argument("--ema", dest="averaging", action="store_const", const="ema", help="EMA of weights per epoch")
    avg.add_argument("--fawa", dest="averaging", action="store_const", const="fawa",
                     help="CFA fairness-aware weight averaging (train.averaging=fawa)")
    g.add_argument("--init-from", metavar="CKPT", help="start from this checkpoint's model weights (train.init_from)")
    g.add_argument("--classes", type=_int_list, metavar="I,J",
                   help="train and test on these classes only (data.classes)")
    g.add_argument("--adv-classes", type=_int_list, metavar="I,J",
                   help="adversarial examples only for these classes (adv_classes.classes)")


def _fairness_flags(args) -> dict:
    return {"ccm.enabled": args.ccm, "ccr.enabled": args.ccr, "train.averaging": args.averaging,
            "train.init_from": args.init_from, "data.classes": args.classes, "adv_classes.classes": args.adv_classes}


def cmd_grid(args) -> int:
    return run_grid(args.grid, out=args.out, gpus=args.gpus, per_gpu=args.per_gpu, launcher=args.launcher,
                    dry_run=args.dry_run)


def cmd_reproduce(args) -> int:
    return reproduce(args.table, seeds=args.seeds, data_dir=args.data_dir, per_gpu=args.per_gpu, scale=args.scale,
                     list_only=args.list, out=args.out, gpus=args.gpus, sets=args.set)


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
    t.add_argument("--kernels", choices=["auto", "triton", "torch"], help="loss/PGD-step ops (default: triton on CUDA)")
    t.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the model and loss (default: on for CUDA)")
    t.add_argument("--cudagraphs", action="store_true", default=None,
                   help="CUDA graphs via torch.compile reduce-overhead")
    t.add_argument("--loader", help="training/validation batches: device (default) | ffcv (needs --beton-dir)")
    t.add_argument("--beton-dir", help="folder of .beton files from `fastfair data convert` (for --loader ffcv)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set train.lr=0.05 (repeatable)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--quiet", action="store_true")
    _add_fairness_flags(t)
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="per-class evaluation of a run or checkpoint")
    e.add_argument("target", help="RUN_DIR or CHECKPOINT.pt")
    e.add_argument("--attacks", default="clean,pgd20,cw20",
                   help="comma-separated: clean, fgsm, pgdK, pgdKxR, cwK, tpgdK@tT, tpgdK@grid (1/T in 2,5,10,50), "
                        "aa (AutoAttack standard)")
    e.add_argument("--split", default="test", choices=["test", "val"])
    e.add_argument("--checkpoint", default="auto", help=CHECKPOINT_HELP)
    e.add_argument("--data-dir")
    e.add_argument("--device", default="auto")
    e.add_argument("--batch-size", type=int)
    e.add_argument("--bf16", action="store_true", help="attack and predict under bf16 autocast (default fp32)")
    e.add_argument("--quiet", action="store_true")
    e.add_argument("--aa-backend", default="auto", choices=["auto", *autoattack.BACKENDS],
                   help="AutoAttack backend: auto (the official pyautoattack, else a git-installed autoattack) | "
                        "pyautoattack | autoattack | torchattacks (its sub-attacks set to the standard numbers)")
    e.add_argument("--seed", type=int, help=SEED_HELP)
    e.set_defaults(func=cmd_eval)
    _add_report_commands(sub)

    d = sub.add_parser("data", help="data preparation").add_subparsers(dest="data_command", required=True)
    c = d.add_parser("convert", help="write train/val/test .beton files for --loader ffcv (needs fastfair[ffcv])")
    c.add_argument("--dataset", required=True, help="data set (fastfair datasets)")
    c.add_argument("--data-dir", help="folder (or .npz file) holding the data set")
    c.add_argument("--out", required=True, help="folder for train.beton, val.beton, test.beton and meta.json")
    c.add_argument("--val-per-class", type=int,
                   help="validation images per class, as data.val_per_class of the runs (default: the data set's)")
    c.add_argument("--jpeg", action="store_true", help="store RGB images as JPEG (large images; lossy)")
    c.add_argument("--jpeg-quality", type=int, default=90)
    c.add_argument("--workers", type=int, help="writer processes (default: up to 8 CPUs)")
    c.set_defaults(func=cmd_data_convert)

    g = sub.add_parser("grid", help="run a grid of trainings (axes over config keys), then one comparison table")
    g.add_argument("grid", help="grid TOML file (see configs/grids/) or the name of a shipped grid")
    g.add_argument("--out", help="grid directory (default runs/grids/GRID_NAME); one folder per run inside")
    g.add_argument("--gpus", default="auto",
                   help="comma-separated GPU ids, 'cpu', or auto (all visible GPUs, else cpu)")
    g.add_argument("--per-gpu", type=int, default=1, metavar="K",
                   help="concurrent runs per GPU (see bench/bench_concurrency.py)")
    g.add_argument("--launcher", default="local",
                   help="local | submitit (SLURM job arrays; pip install fastfair[submitit])")
    g.add_argument("--dry-run", action="store_true",
                   help="print the runs the grid expands to and their state; run nothing")
    g.set_defaults(func=cmd_grid)

    r = sub.add_parser("reproduce", help="re-run a paper's table and print it beside the paper's numbers")
    r.add_argument("table", nargs="?", help="paper table, e.g. cfa-t1 or me-t2 (--list shows them)")
    r.add_argument("--list", action="store_true", help="every table with its runs and an estimate of GPU hours")
    r.add_argument("--seeds", type=int, default=1, help="seeds per row (0..N-1); reported as mean ± std")
    r.add_argument("--data-dir", default="", help="full: folder holding cifar-10-batches-py; subset: a FILE.npz")
    r.add_argument("--per-gpu", type=int, default=1, metavar="K", help="concurrent runs per GPU")
    r.add_argument("--gpus", default="auto", help="comma-separated GPU ids, 'cpu', or auto")
    r.add_argument("--scale", default="full", choices=list(SCALES),
                   help="; ".join(f"{n}: {SCALES.doc(n)}" for n in SCALES))
    r.add_argument("--out", help="folder for the runs, reproduce.md and reproduce.png "
                                 "(default runs/reproduce/TABLE-SCALE)")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key in every run; the verdicts then say not comparable")
    r.set_defaults(func=cmd_reproduce)

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
