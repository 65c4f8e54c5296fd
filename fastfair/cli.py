"""``fastfair`` command line (typer): train, eval, diagnose, report, grid, tune, data convert, and listings.

Each command imports what it runs inside its own body: importing torch and the registries takes
seconds, and ``fastfair --help`` or ``fastfair presets`` should answer at once.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from fastfair import cpu, stopping
from fastfair.errors import Interrupted, UserError, WriteError, no_checkpoint

app = typer.Typer(name="fastfair", help="Fast class-wise fair adversarial training.", no_args_is_help=True,
                  pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})
data_app = typer.Typer(help="data preparation", no_args_is_help=True)
app.add_typer(data_app, name="data")
# what a command taking a run or a checkpoint reads from it
RUN_OR_CHECKPOINT = "a run folder (its selected checkpoint) or a checkpoint file"

FAIRNESS = "fairness options (shorthands for --set keys)"
SEED_HELP = "seed of every random start of the attacks (default: the run's eval.seed); recorded in the JSON"
CHECKPOINT_HELP = ("in a run dir: last, epoch (train.select=epoch's), or best_<policy> for a selection policy of "
                   "`fastfair methods`; "
                   "add _avg for the EMA/FAWA model (default: the run's train.select)")
SPLIT_HELP = "test | val"
RB_PANEL = "a RobustBench model by name (rb:NAME)"
# a value is read as TOML: a list of strings keeps its double quotes only inside the shell's single quotes
SET_EXAMPLES = "e.g. --set train.lr=0.05, or a list of strings: --set eval.attacks='[\"clean\",\"pgd20\"]'"
Text = Optional[str]  # an option that, left out, leaves the config's value as it is


# grid, reproduce and zoo: each leaves a folder of runs that the same command picks up again
RUNS_RESUME = ("the {what}'s runs stopped with it; run the same command again to go on (finished runs are skipped, "
               "interrupted ones resume)")


# ---- listings: what exists, one line each ----------------------------------------------------

def _listing(rows: list[tuple[str, str]]) -> None:
    width = max(len(n) for n, _ in rows)
    for name, doc in rows:
        print(f"{name:<{width}}  {doc}")


@app.command(help="list training methods, options, averaging, selection policies and kernel backends")
def methods(
    markdown: Annotated[bool, typer.Option("--markdown", help="print docs/keys.md: every key of every method "
                                                              "and option, as a Markdown table")] = False,
) -> None:
    from fastfair import ops
    from fastfair.methods import METHODS, OPTIONS, declared_keys, keys_markdown, tune_note, untuned
    from fastfair.training.averaging import AVERAGING
    from fastfair.training.selection import SELECTION

    if markdown:
        print(keys_markdown(), end="")
        return

    def rows(registry) -> list[tuple[str, str]]:
        keys, why = declared_keys(), dict(untuned()) if registry is METHODS else {}
        return [row for name in registry for row in [(name, registry.doc(name)), *[
            (f"  {key}", f"{doc} (default {default!r}){tune_note(tune)}")
            for owner, key, default, doc, tune in keys if owner == name],
            *([("  (no tune space)", why[name])] if name in why else [])]]

    _listing(rows(METHODS))
    print("\noptions that combine with the methods above (each a config section):")
    _listing(rows(OPTIONS))
    print("\nweight averaging (train.averaging):")
    _listing(AVERAGING.table())
    print("\ncheckpoint selection (train.select; each scored policy keeps checkpoints/best_<name>.pt):")
    _listing(SELECTION.table())
    print("\nkernel backends (train.kernels):")
    _listing(ops.BACKENDS.table())


@app.command(help="list models")
def models() -> None:
    from fastfair.models import MODELS
    _listing(MODELS.table())


@app.command(help="list data sets")
def datasets() -> None:
    from fastfair.data import DATASETS
    _listing(DATASETS.table())


@app.command(help="list config presets and the paper tables they reproduce")
def presets() -> None:
    from fastfair.preset_files import grid_names, grid_title, preset_names, preset_title
    _listing([(name, preset_title(name)) for name in preset_names()])
    print("\ngrids (fastfair grid NAME; sweeps and ablations):")
    _listing([(name, grid_title(name)) for name in grid_names()])
    print("\nwhole tables (every row and seed, the paper's numbers beside ours): fastfair reproduce --list")


# ---- train ------------------------------------------------------------------------------------

def _int_list(text: Text, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} takes comma-separated class indices such as 3,5; got {text!r}") from None


def _fairness_flags(ccm: bool, ccr: bool, ema: bool, fawa: bool, init_from: Text, classes: Text,
                    adv_classes: Text) -> dict:
    """Config keys set by the shorthand flags; a flag left out sets nothing (None)."""
    if ema and fawa:
        raise UserError("--ema and --fawa are two kinds of weight averaging; pass one of them")
    return {"ccm.enabled": ccm or None, "ccr.enabled": ccr or None,
            "train.averaging": "ema" if ema else "fawa" if fawa else None, "train.init_from": init_from,
            "data.classes": _int_list(classes, "--classes"), "adv_classes.classes": _int_list(adv_classes,
                                                                                             "--adv-classes")}


@app.command(help="train a model, then evaluate it per class")
def train(
    method: Annotated[Text, typer.Option(help="training method (fastfair methods)")] = None,
    config: Annotated[Text, typer.Option(help="TOML preset: a file or a name from `fastfair presets`")] = None,
    dataset: Annotated[Text, typer.Option(help="data set (fastfair datasets)")] = None,
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    model: Annotated[Text, typer.Option(help="model (fastfair models)")] = None,
    epochs: Annotated[Optional[int], typer.Option(help="number of epochs (train.epochs)")] = None,
    seed: Annotated[Optional[int], typer.Option(help="training seed (train.seed)")] = None,
    device: Annotated[Text, typer.Option(help="auto | cpu | cuda | cuda:N")] = None,
    out: Annotated[Text, typer.Option(help="run directory (default runs/METHOD-DATASET)")] = None,
    kernels: Annotated[Text, typer.Option(help="loss/PGD-step ops: auto | triton | torch (default: triton on "
                                               "CUDA)")] = None,
    compile: Annotated[Optional[bool], typer.Option("--compile/--no-compile",
                                                    help="torch.compile the model and loss (default: on for CUDA)")]
    = None,
    cudagraphs: Annotated[Text, typer.Option(help="auto | on | off: record the compiled step as CUDA graphs, its "
                                                  "first steps checked against the step without (default: on for "
                                                  "CUDA runs that compile)")] = None,
    cpp_wrapper: Annotated[Text, typer.Option(help="auto | on | off: the compiled code calls its kernels from C++ "
                                                   "instead of Python (default: off until a GPU measures it)")] = None,
    loader: Annotated[Text, typer.Option(help="training/validation batches: device (default) | ffcv (needs "
                                              "--beton-dir) | folder (imagenet's default)")] = None,
    beton_dir: Annotated[Text, typer.Option(help="folder of .beton files from `fastfair data convert` (for "
                                                 "--loader ffcv)")] = None,
    sets: Annotated[Optional[List[str]], typer.Option(
        "--set", metavar="KEY=VALUE", help=f"override a config key, {SET_EXAMPLES} (repeatable)")] = None,
    resume: Annotated[bool, typer.Option("--resume",
                                         help="continue the run in --out from its last checkpoint")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress or tables")] = False,
    quick: Annotated[Optional[int], typer.Option(metavar="N", help="a quick run: only the first N training images "
                                                 "of each class, after the validation split "
                                                 "(data.train_per_class; named in every table)")] = None,
    quick_test: Annotated[Optional[int], typer.Option(metavar="N", help="evaluate on the first N test images of "
                                                      "each class (data.test_per_class)")] = None,
    track: Annotated[Text, typer.Option(help="also send the numbers to: none | tensorboard | wandb (train.track; "
                                             "pip install fastfair\\[tensorboard] or \\[wandb])")] = None,
    progress_every: Annotated[Optional[float], typer.Option(metavar="S", help="seconds between plain progress "
                                                            "lines where output is not a terminal, and in "
                                                            "RUN/train.log (train.progress_every_s)")] = None,
    ccm: Annotated[bool, typer.Option("--ccm", help="CFA class-wise calibrated margin (ccm.enabled)",
                                      rich_help_panel=FAIRNESS)] = False,
    ccr: Annotated[bool, typer.Option("--ccr", help="CFA class-wise calibrated TRADES beta (ccr.enabled)",
                                      rich_help_panel=FAIRNESS)] = False,
    ema: Annotated[bool, typer.Option("--ema", help="EMA of weights per epoch (train.averaging=ema)",
                                      rich_help_panel=FAIRNESS)] = False,
    fawa: Annotated[bool, typer.Option("--fawa", help="CFA fairness-aware weight averaging (train.averaging=fawa)",
                                       rich_help_panel=FAIRNESS)] = False,
    init_from: Annotated[Text, typer.Option(metavar="CKPT", help="start from this checkpoint's model weights "
                                            "(train.init_from)", rich_help_panel=FAIRNESS)] = None,
    classes: Annotated[Text, typer.Option(metavar="I,J", help="train and test on these classes only "
                                          "(data.classes)", rich_help_panel=FAIRNESS)] = None,
    adv_classes: Annotated[Text, typer.Option(metavar="I,J", help="adversarial examples only for these classes "
                                              "(adv_classes.classes)", rich_help_panel=FAIRNESS)] = None,
) -> None:
    from fastfair.known import check_train, flag_keys, said_as

    flags = {**flag_keys(method=method, dataset=dataset, data_dir=data_dir, model=model, epochs=epochs, device=device,
                         seed=seed, kernels=kernels, compile=compile, cudagraphs=cudagraphs, cpp_wrapper=cpp_wrapper,
                         loader=loader, beton_dir=beton_dir, quick=quick, quick_test=quick_test, track=track,
                         progress_every=progress_every),
             **_fairness_flags(ccm, ccr, ema, fawa, init_from, classes, adv_classes)}
    names = said_as([key for key, value in flags.items() if value is not None], cli=True)
    if ema or fawa:  # the flags that set train.averaging
        names["train.averaging"] = "--ema" if ema else "--fawa"
    if not resume:  # a mistyped method, key or value said before torch loads (a resumed run's config is its own)
        check_train(config, flags, sets or [], names)
    from fastfair.api import run_training
    run_training(config, flags, sets or [], out, resume=resume, quiet=quiet, flag_names=names)


# ---- eval, diagnose, report ---------------------------------------------------------------------

def _split(split: str) -> str:
    if split not in ("test", "val"):
        raise UserError(f"--split must be test or val; got {split!r}")
    return split


def _there(target: str) -> str:
    """A run folder or checkpoint ``target`` that exists; one that does not is the loader's error, said before the
    command imports torch (seconds on a busy machine) for nothing."""
    if not Path(target).exists():
        raise no_checkpoint(Path(target))
    return target


def _floats(text: str, flag: str) -> float | list[float]:
    """A number, or comma-separated numbers (one per class), as ``--eps`` takes them."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"{flag} takes a number in [0, 1] (8/255 is 0.0314) or one per class, comma-separated such as "
                        f"0.0314,0.0157; got {text!r}") from None
    return values[0] if len(values) == 1 else values


def _batch_size(batch_size: int | None) -> int | None:
    """``--batch-size``, checked as the key it sets (data.eval_batch_size) before anything loads."""
    from fastfair.checks import check_value
    return None if batch_size is None else check_value("data.eval_batch_size", batch_size)


@app.command("eval", help="per-class evaluation of a run, a checkpoint, a model file fastfair did not write "
                          "(with --model), or a RobustBench model by name (rb:NAME)")
def eval_(
    target: Annotated[str, typer.Argument(
        metavar="RUN_DIR|CHECKPOINT|MODEL_FILE|rb:NAME",
        help=f"{RUN_OR_CHECKPOINT}, a model file fastfair did not write (with --model), or RobustBench's model NAME")],
    attacks: Annotated[str, typer.Option(help="comma-separated: clean, fgsm, pgdK, pgdKxR, cwK, tpgdK@tT, "
                                              "tpgdK@grid (1/T in 2,5,10,50), cwinf[K] (C&W's L-inf optimisation "
                                              "attack), nattack[K] (NATTACK, query-based), transfer:NAME (NAME made "
                                              "on --substitute), NAME/N (on the first N images of each class), "
                                              "corrupt:NAME@S (a CIFAR-10-C corruption at severity 1-5; "
                                              "corrupt:all@S: each and their mean), aa (AutoAttack standard)")]
    = "clean,pgd20,cw20",
    substitute: Annotated[Text, typer.Option(
        metavar="RUN_DIR|CHECKPOINT", help="the model transfer:NAME attacks make their examples on (a fastfair run "
                                           "or checkpoint of the same data set; default the run's eval.substitute)")]
    = None,
    split: Annotated[str, typer.Option(help=SPLIT_HELP)] = "test",
    checkpoint: Annotated[str, typer.Option(help=CHECKPOINT_HELP)] = "auto",
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    batch_size: Annotated[Optional[int], typer.Option(help="evaluation batch size")] = None,
    bf16: Annotated[bool, typer.Option("--bf16", help="attack and predict under bf16 autocast (default fp32)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress or table")] = False,
    aa_backend: Annotated[str, typer.Option(
        help="AutoAttack backend: auto (the official pyautoattack, else a git-installed autoattack) | "
             "pyautoattack | autoattack | torchattacks (its sub-attacks set to the standard numbers)")] = "auto",
    seed: Annotated[Optional[int], typer.Option(help=SEED_HELP)] = None,
    eps: Annotated[Text, typer.Option(
        metavar="EPS|E1,E2,...", help="the attacks' L-inf radius in [0, 1] as images are (8/255 is 0.0314), as "
                                      "train's eval.eps; or one per class, comma-separated (not with aa); default "
                                      "the run's eval.eps (8/255 for a file or rb:NAME); recorded in the JSON")]
    = None,
    per_class: Annotated[Optional[int], typer.Option(
        metavar="N", help="every attack on the first N test images of each class (file order) instead of the run's "
                          "test set, e.g. a quick AutoAttack check; written to eval/<checkpoint>-test-firstN.json")]
    = None,
    model: Annotated[Text, typer.Option(
        help="architecture (fastfair models) of a model file fastfair did not write: a state dict, also nested "
             "under state_dict/model/net, with the authors' key names (docs/evaluation-and-report.md, Any model)",
        rich_help_panel="a model file fastfair did not write")] = None,
    dataset: Annotated[Text, typer.Option(help="its data set (fastfair datasets; default cifar10)",
                                          rich_help_panel="a model file fastfair did not write")] = None,
    normalize: Annotated[Text, typer.Option(
        help="what the model expects: none (inputs in [0, 1], as the TRADES code trains) | dataset (the data set's "
             "mean and std) | MEAN/STD (e.g. 0.5,0.5,0.5/0.25,0.25,0.25); not needed when the file holds them",
        rich_help_panel="a model file fastfair did not write")] = None,
    num_classes: Annotated[Optional[int], typer.Option(help="classes of its head (default: the data set's)",
                                                       rich_help_panel="a model file fastfair did not write")]
    = None,
    threat: Annotated[Text, typer.Option(help="RobustBench's threat model of rb:NAME (default Linf, the one "
                                              "fastfair's attacks measure)", rich_help_panel=RB_PANEL)] = None,
    model_dir: Annotated[Text, typer.Option(help="RobustBench's model folder, holding <dataset>/<threat>/NAME.pt "
                                                 "(default ./models, as RobustBench)", rich_help_panel=RB_PANEL)]
    = None,
) -> None:
    if not (target.startswith("rb:") or model):  # a fastfair run or checkpoint
        _there(target)
    from fastfair import build
    from fastfair.evaluation.per_class import (aa_backend_for, attack_names, check_eps, check_per_class,
                                               check_substitute, evaluate_checkpoint)
    from fastfair.reports.summary import lines

    # what fastfair.evaluate checks the same way, before the model or data load (--eps's count once it has loaded)
    names = attack_names(attacks)
    aa_backend_for(names, aa_backend)
    check_per_class(per_class, _split(split))
    if substitute is not None:
        check_substitute(names, True)
    radius = None if eps is None else check_eps(_floats(eps, "--eps"), names, None, "--eps")
    common = dict(attacks=names, split=split, data_dir=data_dir, device=device, batch_size=_batch_size(batch_size),
                  amp=bf16, quiet=quiet, aa_backend=aa_backend, seed=seed, per_class=per_class, substitute=substitute,
                  eps=radius)
    foreign = {"--dataset": dataset, "--normalize": normalize, "--num-classes": num_classes}
    robustbench = {"--threat": threat, "--model-dir": model_dir}
    if target.startswith("rb:"):
        given = [flag for flag, value in {"--model": model, "--normalize": normalize, "--num-classes": num_classes,
                                          "--checkpoint": None if checkpoint == "auto" else checkpoint}.items()
                 if value is not None]
        if given:
            raise UserError(f"{', '.join(given)}: not with rb:NAME, whose RobustBench entry defines the architecture "
                            "and its normalisation")
    elif any(value is not None for value in robustbench.values()):
        given = ", ".join(flag for flag, value in robustbench.items() if value is not None)
        raise UserError(f"{given}: only for a RobustBench model by name, rb:NAME (fastfair zoo lists them)")
    with stopping.says("this evaluation wrote no result (AutoAttack keeps its per-image progress and "
                    "resumes); run the same command again"):
        if target.startswith("rb:"):
            from fastfair.evaluation.robustbench import evaluate_robustbench
            record = evaluate_robustbench(target[3:], dataset=dataset or "cifar10", threat=threat or "Linf",
                                          model_dir=model_dir, **common)
        elif model:
            from fastfair.evaluation.foreign import evaluate_foreign
            record = evaluate_foreign(Path(target), model=model, dataset=dataset or "cifar10", normalize=normalize,
                                      num_classes=num_classes, **common)
        else:
            given = [flag for flag, value in foreign.items() if value is not None]
            if given:
                raise UserError(f"{', '.join(given)}: only for a model file fastfair did not write; add --model ARCH "
                                "(fastfair models), or leave it out for a run or a fastfair checkpoint")
            record = evaluate_checkpoint(build.checkpoint_path(target, checkpoint), **common)
    if not quiet:
        print("\n" + "\n".join(lines(record)))


@app.command(help="per-class diagnostics of a checkpoint (features, weights, entropy, t-SNE)")
def diagnose(
    target: Annotated[str, typer.Argument(metavar="RUN_DIR|CHECKPOINT", help=RUN_OR_CHECKPOINT)],
    attack: Annotated[str, typer.Option(help="attack for the adversarial side (clean, fgsm, pgdK, cwK, "
                                             "tpgdK@tT)")] = "pgd20",
    split: Annotated[str, typer.Option(help=SPLIT_HELP)] = "test",
    checkpoint: Annotated[str, typer.Option(help=CHECKPOINT_HELP)] = "auto",
    tsne: Annotated[int, typer.Option(metavar="N", help="images in the t-SNE (0: skip it)")] = 500,
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    batch_size: Annotated[Optional[int], typer.Option(help="evaluation batch size")] = None,
    seed: Annotated[Optional[int], typer.Option(help=SEED_HELP)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress")] = False,
) -> None:
    _there(target)
    from fastfair import build
    from fastfair.evaluation.diagnose import diagnose_checkpoint

    with stopping.says("no diagnostics were written; run the same command again"):
        diagnose_checkpoint(build.checkpoint_path(target, checkpoint), attack=attack, split=_split(split),
                            data_dir=data_dir, device=device, batch_size=_batch_size(batch_size), tsne_points=tsne,
                            quiet=quiet,
                            seed=seed)


@app.command(help="Markdown report with PNG figures and LaTeX tables of one or more runs")
def report(
    runs: Annotated[List[str], typer.Argument(metavar="RUN_DIR...", help="one run folder, or several to compare")],
    out: Annotated[Text, typer.Option(help="output folder (default RUN_DIR/report for one run; for several, "
                                           "report-A-vs-B beside the first run)")] = None,
    label: Annotated[Optional[List[str]], typer.Option(
        metavar="NAME", help="name of a run in tables and figures; repeat it, one per RUN_DIR in order (default: "
                             "the run's folder name)")] = None,
    baseline: Annotated[Text, typer.Option(metavar="RUN_DIR", help="run (or one seed of a group) that rho is "
                                                                   "measured against")] = None,
    attack: Annotated[Text, typer.Option(help="robust column of the comparison (default: aa when every run has "
                                              "it)")] = None,
    split: Annotated[str, typer.Option(help=SPLIT_HELP)] = "test",
) -> None:
    from fastfair.reports.report import write_report

    paired: list[str] = []  # the paired comparisons' verdicts, said under where the report is
    path = write_report(runs, out, baseline=baseline, attack=attack, split=_split(split), labels=label,
                        echo=paired.append)
    print(f"written: {path} (figures in {path.parent / 'figures'}, LaTeX tables in {path.parent / 'tables.tex'})")
    for line in paired:
        print(line)


@app.command(help="the homing property (Tian et al. KDD 2021, Sec. 6.1, Fig. 4): attack a run trained on every "
                  "class and the runs re-trained without one class each (data.drop_classes; the grid "
                  "tian-kdd-fig4-homing), then write the misclassified and homing matrices (homing.md, .json, .png)")
def homing(
    runs: Annotated[List[str], typer.Argument(
        metavar="GRID_DIR|RUN_DIR...",
        help="a grid folder, or run folders: exactly one trained on every class, the others each without one class")],
    attack: Annotated[str, typer.Option(help="the attack on every model (pgdK, cwK, fgsm, tpgdK@tT)")] = "pgd20",
    out: Annotated[Text, typer.Option(help="output folder (default GRID_DIR/homing, or RUN_DIR/homing of the run "
                                           "on every class)")] = None,
    checkpoint: Annotated[str, typer.Option(help=CHECKPOINT_HELP)] = "auto",
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    batch_size: Annotated[Optional[int], typer.Option(help="evaluation batch size")] = None,
    seed: Annotated[Optional[int], typer.Option(help=SEED_HELP)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress")] = False,
) -> None:
    from fastfair.evaluation.homing import homing as run_homing

    with stopping.says("nothing was written; run the same command again"):
        path = run_homing(runs, attack=attack, out=out, checkpoint=checkpoint, device=device,
                          batch_size=_batch_size(batch_size), data_dir=data_dir, seed=seed, quiet=quiet)
    print(f"written: {path} (and {path.with_suffix('.json').name}, {path.with_suffix('.png').name} beside it)")


@app.command(help="Table 4 and Fig. 6 of Tian et al. KDD 2021 (Sec. 6.2): one class's test images predicted as "
                  "each class, natural and under attack, before and after their background is replaced by one colour "
                  "given foreground masks (fastfair data masks makes approximate ones); written to its own file "
                  "eval/<checkpoint>-test-background-<class>-<colour>.json, with Fig. 6's examples as .png beside it")
def background(
    target: Annotated[str, typer.Argument(metavar="RUN_DIR|CHECKPOINT", help=RUN_OR_CHECKPOINT)],
    class_: Annotated[str, typer.Option("--class", help="the class whose test images get the new background "
                                                         "(index or name, e.g. 3 or cat)")],
    mask: Annotated[str, typer.Option(metavar="FILE.npz", help="foreground masks of the class's test images: "
                                                               "'masks' bool (N, H, W), True on the foreground")],
    colour: Annotated[str, typer.Option(help="the new background: white (the paper's), a name, R,G,B or #rrggbb")]
    = "white",
    attacks: Annotated[str, typer.Option(help="as fastfair eval --attacks (the paper: Temperature-PGD-20)")]
    = "clean,tpgd20@t0.1",
    adjusted: Annotated[Text, typer.Option(metavar="RUN_DIR|CHECKPOINT", help="a run trained with Sec. 6.1's "
                                           "adjustment (preset tian-kdd-fig4c-trades-beta5-0.5), attacked on the "
                                           "replaced images with RUN's settings: Table 4's lines 3 and 6")] = None,
    examples: Annotated[int, typer.Option(help="images in Fig. 6 (before and after, with their predictions under "
                                               "the first attack other than clean; one more pass of that attack); "
                                               "0: no figure")] = 4,
    checkpoint: Annotated[str, typer.Option(help=CHECKPOINT_HELP)] = "auto",
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    batch_size: Annotated[Optional[int], typer.Option(help="evaluation batch size")] = None,
    seed: Annotated[Optional[int], typer.Option(help=SEED_HELP)] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress or table")] = False,
) -> None:
    _there(target)
    from fastfair import build
    from fastfair.evaluation.background import background_counts
    from fastfair.evaluation.per_class import attack_names

    with stopping.says("nothing was written; run the same command again"):
        background_counts(build.checkpoint_path(target, checkpoint), cls=class_, mask=mask, colour=colour,
                          attacks=attack_names(attacks), examples=examples,
                          adjusted=build.checkpoint_path(adjusted) if adjusted else None, device=device,
                          data_dir=data_dir, batch_size=_batch_size(batch_size), seed=seed, quiet=quiet)


# ---- grid, data ---------------------------------------------------------------------------------

PER_GPU_HELP = ("concurrent runs per GPU, or auto: from the step's measured or predicted host and GPU times, bounded "
                "by GPU memory and host cores (it prints the K and why; 1 without a GPU; docs/grid.md)")

@app.command(help="run a grid of trainings (axes over config keys), then one comparison table; every run's "
                  "config and data are checked before the first starts. The data: --data-dir, else the grid's "
                  "data.data_dir, else $FASTFAIR_DATA (default ~/.cache/fastfair/data)")
def grid(
    grid: Annotated[str, typer.Argument(metavar="GRID", help="grid TOML file (see configs/grids/) or the name of "
                                                             "a shipped grid")],
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set, for every run (as "
                                                "train's --data-dir)")] = None,
    sets: Annotated[Optional[List[str]], typer.Option(
        "--set", metavar="KEY=VALUE", help=f"override a config key in every run, {SET_EXAMPLES} "
                                           "(repeatable; not a key the grid's axes sweep)")] = None,
    out: Annotated[Text, typer.Option(help="grid directory (default runs/grids/GRID_NAME); one folder per run "
                                           "inside")] = None,
    gpus: Annotated[str, typer.Option(help="comma-separated GPU ids, 'cpu', or auto (all visible GPUs, else "
                                           "cpu)")] = "auto",
    per_gpu: Annotated[str, typer.Option(metavar="K|auto", help=PER_GPU_HELP)] = "auto",
    launcher: Annotated[str, typer.Option(help="local | submitit (SLURM job arrays; pip install "
                                               "fastfair\\[submitit])")] = "local",
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the runs the grid expands to and their state; run "
                                               "nothing")] = False,
) -> int:
    from fastfair.scaleout.grid import run_grid

    with stopping.says(RUNS_RESUME.format(what="grid")):
        return run_grid(grid, out=out, gpus=gpus, per_gpu=per_gpu, launcher=launcher, dry_run=dry_run,
                        data_dir=data_dir, sets=sets or [])


@app.command(help="each method's front of average vs worst-class robust accuracy on the validation split, found by "
                  "Optuna at an equal budget; the final fronts evaluated once on the test set, then one comparison "
                  "(STUDY/comparison.md, STUDY/fronts.png; docs/tune.md). Re-run the command to continue a study")
def tune(
    study: Annotated[Text, typer.Argument(metavar="STUDY", help="a study folder to continue, --show or --worker "
                                                                  "(default for a new one: runs/tune/NAME)")] = None,
    methods: Annotated[Text, typer.Option(
        "--methods", "--method", help="comma-separated contenders: a method, + train's fairness flags "
                                      "(trades,trades+ccm+ccr+fawa,pgd-at+ccm+fawa)")] = None,
    out: Annotated[Text, typer.Option(help="study folder (default runs/tune/NAME)")] = None,
    config: Annotated[Text, typer.Option(help="TOML preset every trial starts from")] = None,
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    sets: Annotated[Optional[List[str]], typer.Option(
        "--set", metavar="KEY=VALUE", help=f"a config key for every trial, {SET_EXAMPLES} (repeatable)")] = None,
    quick: Annotated[Optional[int], typer.Option(metavar="N", help="every trial on the first N training images of "
                                                 "each class (data.train_per_class)")] = None,
    trials: Annotated[Optional[int], typer.Option(help="budget: trials per contender (default 8)")] = None,
    epochs_budget: Annotated[Optional[int], typer.Option(help="budget: training epochs per contender (a pruned "
                                                              "trial gives back the epochs it did not train)")] = None,
    time_budget: Annotated[Text, typer.Option(help="budget: the study's training time, split equally (90m, 2h)")]
    = None,
    space: Annotated[Text, typer.Option(metavar="FILE", help="TOML ranges over the methods' own: [space.\"KEY\"] "
                                                             "low, high, scale or choices")] = None,
    storage: Annotated[Text, typer.Option(metavar="URL", help="Optuna storage: a database URL, or journal:PATH on "
                                                              "a shared filesystem (default sqlite:///STUDY/study.db)")]
    = None,
    seed: Annotated[int, typer.Option(help="the samplers' seed")] = 0,
    rule: Annotated[str, typer.Option(help="the point picked on each front: worst@avg-D, avg@worst-D, avg, worst, "
                                           "sum")] = "worst@avg-1",
    at_avg: Annotated[Optional[float], typer.Option(
        metavar="A", help="the common validation average at which the comparison sets each contender's best worst "
                          "class side by side (default: the smallest of their best averages less 1)")] = None,
    workers: Annotated[int, typer.Option(help="worker processes on this machine, per GPU of --gpus (on the CPU: in "
                                              "all), sharing the study's storage")] = 1,
    gpus: Annotated[str, typer.Option(help="comma-separated GPU ids, 'cpu', or auto (all visible GPUs, else the "
                                           "CPU): --workers processes on each")] = "auto",
    prune_after: Annotated[Optional[int], typer.Option(
        metavar="E", help="from epoch E on (default: half of a trial's epochs), stop a trial that half of the complete "
                          "trials (3 or more) beat on their mean avg and worst up to that epoch")] = None,
    no_prune: Annotated[bool, typer.Option("--no-prune", help="never stop a trial early")] = False,
    show: Annotated[bool, typer.Option("--show", help="print the fronts and the comparison from the storage")] = False,
    worker: Annotated[bool, typer.Option("--worker", help="only train trials of STUDY (one of many workers, e.g. "
                                                          "a SLURM array task)")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress lines")] = False,
) -> int:
    from fastfair.tuning.study import tune as run_tune

    with stopping.says(RUNS_RESUME.format(what="study")):
        run_tune(study, methods=methods, out=out, config_name=config, data_dir=data_dir, sets=sets, quick=quick,
                 trials=trials, epochs_budget=epochs_budget, time_budget=time_budget, space=space, storage=storage,
                 seed=seed, rule=rule, at_avg=at_avg, workers=workers, gpus=gpus, prune_after=prune_after,
                 prune=not no_prune,
                 show=show, worker=worker, quiet=quiet)
    return 0


@app.command(help="re-run a paper's table or figure and print it beside the paper's numbers, with verdicts")
def reproduce(
    table: Annotated[Text, typer.Argument(metavar="TARGET", help="paper table or figure, e.g. cfa-t1, me-t2 or "
                                                                 "me-f3 (--list shows them)")] = None,
    list_: Annotated[bool, typer.Option("--list", help="every table and figure (or TARGET alone) with its runs and an "
                                                       "estimate of GPU hours, the pending ones with their routes, "
                                                       "and the scales")] = False,
    seeds: Annotated[Optional[int], typer.Option(help=(
        "seeds per row (0..N-1), reported as mean ± std; default: the paper's own count per row at --scale full "
        "(5 where it reports means over five runs, else 1), 1 at a scale not comparable to the paper"))] = None,
    data_dir: Annotated[str, typer.Option(help="full: folder holding cifar-10-batches-py (and the other data sets a "
                                               "table uses); subset: a FILE.npz, or a folder of DATASET-subset.npz "
                                               "for a table over several data sets")] = "",
    per_gpu: Annotated[str, typer.Option(metavar="K|auto", help=PER_GPU_HELP)] = "auto",
    gpus: Annotated[str, typer.Option(help="comma-separated GPU ids, 'cpu', or auto")] = "auto",
    scale: Annotated[str, typer.Option(help="full (the presets as they are on the full CIFAR-10: the paper's table) "
                                            "| subset (a few images per class of FILE.npz, a tiny model, 5 epochs: "
                                            "a quick look, not comparable); --list says exactly")] = "full",
    out: Annotated[Text, typer.Option(help="folder for the runs, the target's report TARGET.md and its PNGs (default "
                                           "runs/reproduce/TARGET-SCALE; a table's --out lets a figure reuse its "
                                           "runs)")] = None,
    set_: Annotated[Optional[List[str]], typer.Option("--set", metavar="KEY=VALUE", help=(
        f"override a config key in every run, {SET_EXAMPLES} (repeatable); the verdicts then say not comparable"))]
    = None,
    model_dir: Annotated[Text, typer.Option(help="where RobustBench's weights are, for rows that are its released "
                                                 "models (Tian et al.'s RST; default ./models, RobustBench's)")] = None,
    launcher: Annotated[str, typer.Option(help="local | submitit (SLURM job arrays, as fastfair grid's: a pre-empted "
                                               "task requeues itself; see docs/grid.md)")] = "local",
    paper_selection: Annotated[bool, typer.Option("--paper-selection", help=(
        "rows whose paper picks its checkpoint by another rule pick by it (ME: best PGD-20 on the test set); "
        "the report says the test set chose them"))] = False,
) -> int:
    from fastfair.reproduce.command import reproduce as run_table

    with stopping.says(RUNS_RESUME.format(what="table")):
        return run_table(table, seeds=seeds, data_dir=data_dir, per_gpu=per_gpu, scale=scale, list_only=list_,
                         out=out, gpus=gpus, sets=set_ or [], model_dir=model_dir, launcher=launcher,
                         paper_selection=paper_selection)


@app.command(help="RobustBench's models with their reported averages; with --run, evaluate them per class as a "
                  "batch (K per GPU, resumable) and write the worst-class leaderboard (zoo.md, zoo.json, zoo.png)")
def zoo(
    run: Annotated[bool, typer.Option("--run", help="evaluate the models (--models, --top, or every model whose "
                                                    "weights are in --model-dir) and write the leaderboard")] = False,
    fetch: Annotated[bool, typer.Option("--fetch", help="only download the weights of --models or --top N that are "
                                                        "not in --model-dir (--run fetches them too)")] = False,
    models: Annotated[Text, typer.Option(metavar="A,B", help="comma-separated RobustBench names")] = None,
    top: Annotated[Optional[int], typer.Option(metavar="N", help="the N best by reported AutoAttack accuracy")]
    = None,
    dataset: Annotated[str, typer.Option(help="cifar10 | cifar100")] = "cifar10",
    threat: Annotated[str, typer.Option(help="RobustBench's threat model (Linf: fastfair's attacks)")] = "Linf",
    model_dir: Annotated[Text, typer.Option(help="RobustBench's model folder, holding <dataset>/<threat>/NAME.pt "
                                                 "(default ./models, as RobustBench)")] = None,
    attacks: Annotated[str, typer.Option(help="as fastfair eval --attacks")] = "clean,aa",
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    per_class: Annotated[Optional[int], typer.Option(metavar="N", help="the first N test images of each class "
                                                     "(a quick look, not comparable to the reported numbers)")] = None,
    seed: Annotated[Optional[int], typer.Option(help=SEED_HELP)] = None,
    out: Annotated[Text, typer.Option(help="folder for zoo.md/json/png and each model's log (default "
                                           "runs/zoo/DATASET-THREAT)")] = None,
    gpus: Annotated[str, typer.Option(help="comma-separated GPU ids, 'cpu', or auto")] = "auto",
    per_gpu: Annotated[int, typer.Option(metavar="K", help="concurrent evaluations per GPU")] = 1,
    launcher: Annotated[str, typer.Option(help="local | submitit")] = "local",
) -> int:
    from fastfair.evaluation.per_class import attack_names, check_per_class
    from fastfair.reports import zoo as zoo_

    if fetch and run:
        raise UserError("--fetch and --run: --run fetches the weights it needs itself; pass one")
    if not run:
        choosing = {} if fetch else {"--models": models, "--top": top}  # --fetch downloads the chosen models
        given = [f for f, v in {**choosing, "--per-class": per_class, "--out": out}.items() if v is not None]
        if given:
            raise UserError(f"{', '.join(given)}: only with --run, which evaluates the models"
                            + ("" if fetch else " (--models and --top also with --fetch)"))
        if not fetch:
            zoo_.listing(dataset, threat, model_dir)
            return 0
        if not (models or top):
            raise UserError("--fetch: name the models, --models A,B or --top N")
        zoo_.fetch(zoo_.choose(models, top, dataset, threat, model_dir), dataset, threat, model_dir)
        return 0
    attack_names(attacks)
    check_per_class(per_class, "test")
    with stopping.says(RUNS_RESUME.format(what="zoo")):
        return zoo_.run(models=models, top=top, dataset=dataset, threat=threat, model_dir=model_dir, attacks=attacks,
                        data_dir=data_dir, per_class=per_class, seed=seed, out=out, gpus=gpus, per_gpu=per_gpu,
                        launcher=launcher)


@data_app.command(help="write train/val/test .beton files for --loader ffcv (needs fastfair\\[ffcv])")
def convert(
    dataset: Annotated[str, typer.Option(help="data set (fastfair datasets)")],
    out: Annotated[str, typer.Option(help="folder for train.beton, val.beton, test.beton and meta.json")],
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    val_per_class: Annotated[Optional[int], typer.Option(
        help="validation images per class, as data.val_per_class of the runs (default: the data set's)")] = None,
    jpeg: Annotated[bool, typer.Option("--jpeg", help="store RGB images as JPEG (large images; lossy)")] = False,
    jpeg_quality: Annotated[int, typer.Option(help="JPEG quality with --jpeg")] = 90,
    workers: Annotated[Optional[int], typer.Option(help="writer processes (default: up to 8 CPUs)")] = None,
) -> None:
    from fastfair.data import ffcv

    paths = ffcv.convert_dataset(dataset, data_dir, out, val_per_class=val_per_class, jpeg=jpeg,
                                 jpeg_quality=jpeg_quality, num_workers=workers)
    meta = ffcv.read_meta(out)
    for split, path in paths.items():
        print(f"{split:5s} {meta['splits'][split]['n']:7d} images  {path}")
    print(f"train with: fastfair train --dataset {dataset} --loader ffcv --beton-dir {out}"
          + (f" --data-dir {data_dir}" if data_dir else ""))


@data_app.command("verify", help="hash every .beton file of a folder against its meta.json in full (an open "
                                 "re-hashes a file only when its size, mtime or inode changed)")
def verify(folder: Annotated[str, typer.Argument(help="folder of .beton files from fastfair data convert")]) -> None:
    from fastfair.data import ffcv

    for split in ffcv.read_meta(folder).get("splits", {}).values():
        if not split.get("file"):  # an empty split has no file
            continue
        path = Path(folder).expanduser() / split["file"]
        if not path.is_file():
            raise UserError(f"{path} not found: convert again: fastfair data convert --dataset D --out {folder}")
        if not split.get("sha256"):
            print(f"{path}: not checked (converted before meta.json named each file's SHA-256; convert again)")
            continue
        ffcv.verify_beton(path, full=True)
        print(f"{path}: intact (SHA-256 {split['sha256'][:16]}...)")


def _load_source(dataset: Text, data_dir: Text, default: str):
    """The data set a data command reads: ``--dataset``, else npz when ``--data-dir`` is a file, else ``default``."""
    from fastfair import data

    name = dataset or ("npz" if data_dir and Path(data_dir).is_file() else default)
    return data.load(name, data_dir)


@data_app.command("subset", help="the real-data subset the tests and benchmarks read (cifar10-subset.npz, "
                                 "mnist-subset.npz), made from the official data set files: the same images in the "
                                 "same order for anyone who has them")
def subset_data(
    dataset: Annotated[str, typer.Argument(metavar="cifar10|mnist",
                                           help="the data set whose official files --data-dir holds")],
    data_dir: Annotated[Text, typer.Option(help="torchvision's folder of the official files (cifar-10-batches-py/, "
                                                "MNIST/raw/), as --data-dir of training; downloaded there when "
                                                "missing and possible")] = None,
    out: Annotated[Text, typer.Option(metavar="FILE.npz", help="the .npz to write (default DATASET-subset.npz here; "
                                                            "the tests read ../shared/data or "
                                                            "$FASTFAIR_SHARED_DATA)")] = None,
) -> None:
    from fastfair.data.shared_subsets import SUBSETS, write

    path = Path(out or f"{dataset}-subset.npz")
    shapes = write(dataset, data_dir, path)
    print(f"written: {path} ({SUBSETS.doc(dataset)}; " + ", ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
          + ")")


@data_app.command("background", help="MNIST with a background colour per class (Tian et al. KDD 2021, Sec. 6.2, "
                                     "Fig. 5) as an .npz, the data set mnist-background that the preset "
                                     "tian-kdd-fig5-madry-mnist-background trains on; the colours and seed are "
                                     "recorded in it (background_params)")
def background_data(
    out: Annotated[Text, typer.Option(metavar="FILE.npz", help="the .npz to write (default: mnist-background.npz in "
                                                            "$FASTFAIR_DATA, else ~/.cache/fastfair/data, where "
                                                            "the Fig. 5 preset reads it)")] = None,
    data_dir: Annotated[Text, typer.Option(help="torchvision's MNIST folder, or an .npz of grey digits")] = None,
    dataset: Annotated[Text, typer.Option(help="the grey data set (default mnist; npz when --data-dir is a "
                                               "file)")] = None,
    colours: Annotated[Text, typer.Option(metavar="SPEC", help="CLASS=COLOUR[/COLOUR...] for every class, e.g. "
                                          "0=red,1=red,2=#00ff00/blue,...; several colours: each image draws one "
                                          "(default: classes 2k and 2k+1 share a colour, fastfair's reading of "
                                          "Fig. 5(a))")] = None,
    seed: Annotated[int, typer.Option(help="seed of the draws among a class's colours")] = 0,
) -> None:
    from fastfair.data.background import MNIST_PAIRS, data_path, write_mnist_background

    path = Path(out) if out else data_path(None)
    if path.suffix != ".npz":
        raise UserError(f"--out {out}: the data set is written as an .npz (np.savez adds .npz to any other name)")
    params = write_mnist_background(_load_source(dataset, data_dir, "mnist"), path, colours or MNIST_PAIRS, seed)
    shown = ", ".join(f"{name} " + "/".join("#%02x%02x%02x" % tuple(c) for c in cs) for name, cs in
                      params["colours"].items())
    print(f"written: {path} (backgrounds: {shown})")
    where = "" if path == data_path(None) else f" --data-dir {path}"  # the preset finds the default file itself
    print(f"train with: fastfair train --config tian-kdd-fig5-madry-mnist-background{where}")


@data_app.command("masks", help="approximate foreground masks of one class's test images for fastfair background: "
                                "background = pixels within --threshold of the median border colour and connected "
                                "to the border (a stated rule standing in for the paper's hand-made masks)")
def masks(
    class_: Annotated[str, typer.Option("--class", help="the class (index or name, e.g. 3 or cat)")],
    out: Annotated[str, typer.Option(metavar="FILE.npz", help="the mask file to write")],
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the data set")] = None,
    dataset: Annotated[Text, typer.Option(help="data set (default cifar10; npz when --data-dir is a file)")] = None,
    threshold: Annotated[float, typer.Option(help="largest channel difference from the border colour, on [0, 1], "
                                                  "still counted as background")] = 0.1,
) -> None:
    from fastfair.data.background import border_masks, class_index, named
    from fastfair.rundir import write_npz_atomic

    if not 0 < threshold < 1:
        raise UserError(f"--threshold is a colour difference on [0, 1], above 0 and below 1; got {threshold}")
    if Path(out).suffix != ".npz":
        raise UserError(f"--out {out}: masks are written as an .npz")
    bundle = _load_source(dataset, data_dir, "cifar10")
    c = class_index(class_, bundle.classes, "--class")
    x = bundle.x_test[bundle.y_test == c].numpy()
    found = border_masks(x, threshold)
    write_npz_atomic({"masks": found, "class_index": c, "rule": "border-colour", "threshold": threshold}, out,
                     compressed=True)
    print(f"written: {out} ({len(found)} masks of {named(bundle.classes[c])}, {100 * found.mean():.0f} % foreground)")


@data_app.command("features", help="the robust / non-robust data sets of Ilyas et al. 2019 (Sec. 3) built from a run, "
                                   "as an .npz with the original test set (train on it with --dataset npz): robust "
                                   "(D_R) and non-robust (D_NR) invert the run's representation from another image, "
                                   "det (D_det) and rand (D_rand) move each image by a targeted L2 PGD and relabel "
                                   "it; the settings are recorded in it (features_params)")
def features(
    kind: Annotated[str, typer.Argument(metavar="robust|non-robust|det|rand",
                                        help="which of Ilyas et al.'s (2019) data sets to build")],
    target: Annotated[str, typer.Argument(metavar="RUN_DIR|CHECKPOINT", help=RUN_OR_CHECKPOINT)],
    out: Annotated[str, typer.Option(metavar="FILE.npz", help="the .npz to write")],
    checkpoint: Annotated[str, typer.Option(help=CHECKPOINT_HELP)] = "auto",
    steps: Annotated[Optional[int], typer.Option(help="descent steps (default Ilyas et al.'s: 1000 for robust and "
                                                      "non-robust, 100 for det and rand)")] = None,
    step_size: Annotated[Optional[float], typer.Option(help="L2 length of each normalised-gradient step "
                                                            "(default 0.1)")] = None,
    eps: Annotated[Optional[float], typer.Option(help="L2 radius of det and rand's targeted attack (default "
                                                      "0.5)")] = None,
    seed: Annotated[int, typer.Option(help="seed of the starting images (robust, non-robust) and of rand's "
                                           "targets")] = 0,
    per_class: Annotated[Optional[int], typer.Option(
        metavar="N", help="build from the first N training images of each class only (default: every one)")] = None,
    data_dir: Annotated[Text, typer.Option(help="folder (or .npz file) holding the run's data set")] = None,
    device: Annotated[str, typer.Option(help="auto | cpu | cuda | cuda:N")] = "auto",
    batch_size: Annotated[Optional[int], typer.Option(help="images per descent batch (default the run's "
                                                           "data.eval_batch_size)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace --out if it exists")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", help="no progress")] = False,
) -> None:
    _there(target)
    from fastfair.data.features import write_features

    with stopping.says("nothing was written; run the same command again"):
        params = write_features(target, kind, out, checkpoint=checkpoint, steps=steps, step_size=step_size, eps=eps,
                                seed=seed, per_class=per_class, device=device, data_dir=data_dir,
                                batch_size=_batch_size(batch_size), force=force, quiet=quiet)
    measured = ", ".join(f"{key} {value:.3f}" for key, value in params.items()
                         if key.startswith(("target_rate", "distance_ratio", "perturbation", "pixels")))
    print(f"written: {out} ({params['images']} images of {params['dataset']} from {params['source']}; {measured})")
    print(f"train with: fastfair train --dataset npz --data-dir {out}")


# ---- entry point --------------------------------------------------------------------------------

def _error(message: str, code: int) -> int:
    print(f"fastfair: error: {message}", file=sys.stderr)
    return code


def _usage_fix(argv: list[str] | None, err: Exception) -> str | None:
    """The line for a click usage error that fastfair can say better, or None: a value split by a space
    (:func:`_one_word`), or a flag that sets a config key given a value not of its type, said as the key would be
    (what ``fastfair.train(epochs=1.5)`` and ``fastfair.evaluate(batch_size="x")`` say)."""
    words = sys.argv[1:] if argv is None else list(argv)
    if "extra argument" in err.format_message():
        return _one_word(words)
    param, ctx = getattr(err, "param", None), getattr(err, "ctx", None)
    if param is None or ctx is None or ctx.command_path not in ("fastfair train", "fastfair eval"):
        return None
    flag = f"--{param.name.replace('_', '-')}"
    given = [w.partition("=")[2] for w in words if w.startswith(f"{flag}=")] + \
        [b for a, b in zip(words, words[1:]) if a == flag]
    if not given:  # a missing argument, an unknown option: click's line says it
        return None
    from fastfair.known import TRAIN_FLAGS, check_value
    from fastfair.preset_files import parse_set

    # the commands fastfair.train and fastfair.evaluate are: their flags that set a config key
    keys = {"fastfair train": TRAIN_FLAGS, "fastfair eval": {"batch_size": "data.eval_batch_size", "seed": "eval.seed"}}
    key = keys[ctx.command_path].get(param.name)
    if key is None:
        return None
    try:
        check_value(key, parse_set([f"{key}={given[-1]}"])[key])
    except UserError as said:
        return str(said)
    return None


def _one_word(words: list[str]) -> str | None:
    """What to type where a space split one value and click saw an extra argument: ``--set train.lr 0.1`` (a space
    for ``=``) and ``--attacks clean, pgd20`` (a space after a comma, in any comma-separated option)."""
    for i, (flag, value) in enumerate(zip(words, words[1:])):
        if not flag.startswith("--") or value.startswith("-"):
            continue
        text, j = value, i + 2
        if flag == "--set":  # KEY VALUE, KEY= VALUE, KEY =VALUE, KEY = VALUE
            while j < len(words) and not words[j].startswith("--") and (
                    "=" not in text or text.endswith("=") or words[j].startswith("=")):
                text += words[j] if text.endswith("=") or words[j].startswith("=") else f"={words[j]}"
                j += 1
            what = "KEY=VALUE as one word (no space around =)"
        else:  # a, b  or  a ,b
            while j < len(words) and not words[j].startswith("--") and (text.endswith(",") or
                                                                          words[j].startswith(",")):
                text += words[j]
                j += 1
            what = "one comma-separated word (no space after a comma)"
        if j > i + 2:
            return f"{flag} takes {what}; type: {flag} {text}"
    return None


def _stop_said(callback):
    """``callback`` (a command) where a stop signal its own message does not cover (a command that keeps nothing, or
    one stopped before its long work began) ends it with one line too; typer would end it with 130 and no line."""
    @functools.wraps(callback)
    def run(*args, **kwargs):
        try:
            return callback(*args, **kwargs)
        except KeyboardInterrupt as err:
            signum = stopping.signum_of(err)
            raise Interrupted(f"interrupted{stopping.said_by(signum)}", signum) from None
    return run


def _every_command(group) -> None:
    _flags_untyped(group)
    for command in group.commands.values():
        if hasattr(command, "commands"):
            _every_command(command)
        else:
            _flags_untyped(command)
            command.callback = _stop_said(command.callback)


def _flags_untyped(command) -> None:
    """A flag takes no value, so its help shows no type (typer shows ``<bool>`` beside --quiet, and --help)."""
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    help_option = command.get_help_option  # made once a context asks for it

    def untyped_help(ctx):
        option = help_option(ctx)
        if option is not None:
            option.metavar = ""
        return option
    command.get_help_option = untyped_help


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; every failure a user can cause is one ``fastfair: error:`` line and exit code 2; a file that
    cannot be written (disk full, I/O error) is one such line and exit code 74; a stop signal is one line and 128 +
    its number (:mod:`fastfair.stopping`)."""
    cpu.share_cores()  # before any command loads torch
    command = typer.main.get_command(app)
    _every_command(command)
    try:
        with stopping.handled():
            result = command.main(args=sys.argv[1:] if argv is None else list(argv), prog_name="fastfair",
                                  standalone_mode=False)
    except WriteError as err:  # a disk full or failing: not the user's mistake, and worth a retry once fixed
        return _error(str(err), err.exit_code)
    except UserError as err:
        return _error(str(err), 2)
    except Interrupted as err:
        if str(err):
            print(f"fastfair: {err}", file=sys.stderr)
        return stopping.exit_code(err.signum)
    except Exception as err:
        # click's usage errors (unknown option, missing argument, bad integer), whichever click typer uses
        if not (hasattr(err, "format_message") and hasattr(err, "exit_code")):
            raise
        where = getattr(getattr(err, "ctx", None), "command_path", "fastfair")
        if not err.format_message():  # a command group run without a command: its help is already shown
            return err.exit_code
        return _error(_usage_fix(argv, err) or f"{err.format_message()} (see: {where} --help)", err.exit_code)
    return result if isinstance(result, int) else 0  # grid returns 1 when a run failed


if __name__ == "__main__":
    sys.exit(main())
