"""Run configuration: sections with defaults, TOML presets, and ``--set a.b=value`` overrides.

A config has the core sections below (data, model, attack, train, eval), the section
``method`` holding the chosen method's own keys (declared beside it, ``Method.keys``), and one
section per class-wise option (``[ccm]``, ``[ccr]``, ``[he]``, ...; ``Option.keys``).
Resolution order (later wins): declared defaults < the method's defaults (attack objective,
init and BN mode of its paper's code) < the data set's defaults (validation size,
augmentation) < the defaults of the options the run switches on < the TOML preset <
command-line flags < ``--set``. Every key is validated against its section: an unknown key is
an error that lists the close matches.
"""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from fastfair import schema
from fastfair.schema import DEFAULTS, PRESET, USER  # noqa: F401  (config.DEFAULTS etc.)
from fastfair.data import DATASETS
from fastfair.errors import UserError
from fastfair.methods import METHODS, OPTIONS
# preset files and --set values are read without torch (the CLI refuses a mistake before it loads): config.flatten,
# config.parse_set, config.read_preset and config.read_paper are these
from fastfair.preset_files import flatten, parse_set, read_paper, read_preset  # noqa: F401
from fastfair.rundir import RunDir


@dataclass
class DataConfig:
    dataset: str = "cifar10"
    data_dir: str = ""  # folder (torchvision sets, Tiny-ImageNet) or file (npz)
    val_per_class: int = 100  # CFA: first N training images of each class form the validation split
    # quick runs on part of a data set: only the first N images of each class of train (after the
    # validation split) and of test; 0 keeps all. Recorded in config.toml and named in every table.
    train_per_class: int = 0
    test_per_class: int = 0
    crop_padding: int = 4
    # what the random crop's padding holds: zeros (TRADES, DAFA, FRL, ... torchvision's default) | reflect
    # (CFA's code: RandomCrop(32, padding=4, padding_mode='reflect'))
    crop_mode: str = "zeros"
    flip: bool = True
    batch_size: int = 128
    eval_batch_size: int = 500
    # device | ffcv (fastfair data convert, then --loader ffcv --beton-dir DIR) | folder (imagenet's default: its
    # JPEGs streamed by CPU workers)
    loader: str = "device"
    beton_dir: str = ""  # ffcv: folder with train/val/test.beton and meta.json
    os_cache: bool = True  # ffcv: let the OS page cache hold the .beton file (false: FFCV reads pages)
    order: str = "random"  # ffcv training order: random (the device loader's) | quasi_random | sequential
    # folder loader (imagenet): the side of the training crop (random-resized, Wong et al. 2020's augmentation) and
    # of the test centre crop, taken after resizing the shorter side to 256/224 of it (torchvision's ImageNet reference)
    image_size: int = 224
    workers: int = 8  # folder loader: processes decoding images (0: in the main process)
    # folder loader: Wong et al. 2020's resolution phases (their ImageNet configs' crop_size and batch_size per phase):
    # after phase_epochs[i] epochs (0, 6, 12: epochs 1-6, 7-12, 13-15) train on phase_image_sizes[i] crops in batches
    # of phase_batch_sizes[i]; empty: data.image_size and data.batch_size throughout. Evaluation keeps data.image_size
    phase_epochs: list[int] = field(default_factory=list)
    phase_image_sizes: list[int] = field(default_factory=list)
    phase_batch_sizes: list[int] = field(default_factory=list)
    # ME paper Sec. 2.2 binary/subset experiments: keep only these classes, relabelled 0..k-1 in
    # the order given (e.g. [3, 5] = cat vs dog); empty keeps all
    classes: list[int] = field(default_factory=list)
    # Tian et al. KDD 2021 Sec. 6.1 (homing property): re-train without these classes' images (indices of the
    # run's classes). Only train and val lose them; the head keeps every class, so class indices and the test
    # set stay those of the run trained on all classes, whose adversarial examples the re-trained model is tested on
    drop_classes: list[int] = field(default_factory=list)


@dataclass
class ModelConfig:
    name: str = "resnet18"
    norm: str = "bn"
    width: int = 0  # 0: the paper's width; smaller for quick experiments
    channels_last: str = "auto"  # auto (on for CUDA and CPUs, where measured faster) | on | off
    # linear | linear-nobias (ME paper App. A.1) | cosine (HE, Pang et al. 2020: normalised features and class weights)
    head: str = "linear"
    head_scale: float = 15.0  # HE scale s (1/T in Tian et al.); the start value when a schedule moves it
    # 0: the architecture's own penultimate features; N: a linear layer to N features between the body and the head
    # (ME paper App. A.1: 2, to plot the features, with model.head = linear-nobias)
    feature_dim: int = 0


@dataclass
class AttackConfig:
    """The attack that makes training examples (methods.md, 'Attacks used to make training examples')."""

    eps: float = 8 / 255
    alpha: float = 2 / 255
    steps: int = 10
    objective: str = "ce"  # ce | kl | cw
    init: str = "uniform"  # uniform | normal | none
    bn_mode: str = "train"  # BN mode while attacking: train (Madry/robust_overfitting) | eval (TRADES)


@dataclass
class TrainConfig:
    epochs: int = 100
    # the rate: the step schedule's start, the peak of cosine / cyclic / onecycle (piecewise reads lr_values instead)
    lr: float = 0.1
    # sgd | adam | adamw (fastfair/training/optim.py, docs/training.md): weight_decay is an L2 term in the gradient
    # for sgd and adam, decoupled (w -= lr_t * weight_decay * w each step, torch's AdamW) for adamw
    optimizer: str = "sgd"
    momentum: float = 0.9  # sgd's
    weight_decay: float = 5e-4
    nesterov: bool = False  # sgd's
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adam's and adamw's (beta1, beta2)
    adam_eps: float = 1e-8  # adam's and adamw's epsilon in the denominator (not an attack budget)
    # step (lr_milestones, lr_gamma; per epoch) | cosine | cyclic | onecycle (lr_min, ...; per step) | piecewise
    # (lr_epochs, lr_values; per step): one way to pick the rate, fastfair/training/optim.py
    lr_schedule: str = "step"
    # step: epochs after which the rate is multiplied by lr_gamma: it changes from epoch m + 1 on (MultiStepLR)
    lr_milestones: list[int] = field(default_factory=lambda: [75, 90])
    lr_gamma: float = 0.1
    lr_min: float = 0.0  # cosine's end, cyclic's low point, onecycle's start and end
    lr_cycle_epochs: float = 0.0  # cyclic: one cycle's length in epochs (up half, down half); 0: train.epochs
    lr_peak_epoch: float = 0.0  # onecycle: the epoch of the peak; 0: train.epochs * 2 // 5 (Wong et al. 2020)
    # piecewise: Wong et al. 2020's schedule (their ImageNet configs' lr_epochs, lr_values): linear in the fractional
    # epoch through these points
    lr_epochs: list[float] = field(default_factory=list)
    lr_values: list[float] = field(default_factory=list)
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "auto"  # auto (bf16 on CUDA and on a CPU with native bf16) | bf16 | off
    kernels: str = "auto"  # auto | triton | inductor | torch: backend of the loss and PGD-step ops (build.kernels)
    compile: str = "auto"  # auto (on for CUDA) | on | off: torch.compile the model and the method's loss
    # with compile: the attack's K steps as one graph, input gradients included (torch >= 2.11);
    # false: only the model is compiled and the steps run in an eager loop around it
    compile_attack: bool = True
    # auto (on for CUDA runs that compile: build.auto_cudagraphs) | on | off: the training step's compiled regions
    # recorded as CUDA graphs, its first steps checked against the step without them (training/fallback.py)
    cudagraphs: str = "auto"
    # auto (off until a GPU measures it: build.auto_cpp_wrapper) | on | off: Inductor's C++ wrapper, which issues the
    # compiled code's kernel launches from C++ instead of Python
    cpp_wrapper: str = "auto"
    # auto (off for a CPU training in channels-last memory of a model with narrow strided 1x1 convolutions, whose
    # weight gradient hangs or crashes in oneDNN: cpu.onednn_off) | on | off: oneDNN's convolutions while training
    onednn: str = "auto"
    val_attack: str = "pgd10"  # per-class validation robustness each epoch (CFA: PGD-10)
    select: str = "pgd"  # checkpoint the final evaluation uses: pgd | fair | worst | epoch | last
    # epochs before the first whose model may become a best_* checkpoint: candidates from epoch select_begin + 1
    # on (CFA's code keeps none before epochs / 2: its 0-based `epoch >= 100` of 200 is select_begin = 100)
    select_begin: int = 0
    # select = epoch: the model after this epoch (from 1) is kept as checkpoints/epoch.pt and evaluated (Tian et al.
    # ICLR Sec. 3 keeps the 75th epoch's model "for all experiments unless otherwise stated"); 0 with any other policy
    select_epoch: int = 0
    # the split train.select scores each epoch: val (data.val_per_class training images held out) | test (the test set
    # itself, every training image trained on: the ME paper's rule, Sec. 3.2.2; the test set then chooses the model)
    select_split: str = "val"
    progress: bool = True  # a bar on a terminal; plain progress lines on other output (a cluster log)
    progress_every_s: float = 30.0  # seconds between plain progress lines (not on a terminal) and in train.log
    # experiment tracking: none | tensorboard | wandb (optional extras; see fastfair/reports/tracking.py)
    track: str = "none"
    averaging: str = "none"  # weight averaging per epoch: none | ema | fawa (CFA Sec. 4.3); see fastfair/averaging.py
    avg_decay: float = 0.85  # EMA/FAWA decay (CFA paper 0.85, code 0.88)
    # FAWA: an epoch is averaged in only if worst-class val robust acc >= this (paper 0.2, code 0.24)
    avg_threshold: float = 0.2
    avg_begin: int = 50  # epochs before the first averaged in, from epoch avg_begin + 1 on (CFA paper 50, code 0)
    init_from: str = ""  # checkpoint whose model weights start training (FRL fine-tunes a robust model)
    # torchrun only: SyncBatchNorm (batch statistics over the global batch, CUDA only) instead of
    # per-rank BatchNorm statistics (the usual DDP default); see fastfair/distributed.py
    sync_bn: bool = False


@dataclass
class EvalConfig:
    attacks: list[str] = field(default_factory=lambda: ["clean", "pgd20", "cw20"])
    eps: float = 8 / 255
    alpha: float = 2 / 255
    cw_kappa: float = 50.0  # CW-20 margin clamp of the FAT/MART code
    # PGD/CW/T-PGD uniform start clipped to [0, 1] before the first step (Madry et al.'s code); false: the
    # first gradient is taken at x + U(-eps, eps) unclipped (TRADES pgd_attack_cifar10.py, MART train_*.py)
    clip_start: bool = True
    split: str = "test"
    seed: int = 0  # seeds every random start of evaluation attacks (PGD, CW, T-PGD, AutoAttack)
    # the model transfer:NAME attacks make their examples on: a fastfair run folder or checkpoint (--substitute)
    substitute: str = ""


CORE = {"data": DataConfig, "model": ModelConfig, "attack": AttackConfig, "train": TrainConfig, "eval": EvalConfig}

# Keys renamed when methods and options came to declare their own (issue 11): old name -> new
# name(s). Saved runs with old keys still load; a preset or --set using one gets the new name.
RENAMED: dict[str, tuple[str, ...]] = {
    "method.kl_normalize": ("method.normalize",),
    "method.ccm": ("ccm.enabled",), "method.ccm_lambda": ("ccm.lambda_1",),
    "method.ccr": ("ccr.enabled",), "method.ccr_lambda": ("ccr.lambda_2",),
    "method.calibrate_begin": ("ccm.begin", "ccr.begin"),
    "method.class_weights": ("cost_sensitive.weights",), "method.class_weights_auto": ("cost_sensitive.auto",),
    "method.adv_classes": ("adv_classes.classes",),
    "method.he_margin": ("he.margin",), "method.he_schedule": ("he.schedule",),
    "method.he_scale_end": ("he.scale_end",),
    "method.he_pmax_start": ("he.pmax_start",), "method.he_pmax_end": ("he.pmax_end",),
    "method.he_pmax_epoch": ("he.pmax_epoch",),
    "method.fat_tau": ("method.tau",), "method.fat_tau_milestones": ("method.tau_milestones",),
    "method.frl_bound": ("method.bound",), "method.frl_rate_weight": ("method.rate_weight",),
    "method.frl_rate_margin": ("method.rate_margin",), "method.frl_lim": ("method.lim",),
    "method.frl_halve_every": ("method.halve_every",),
}

# Keys that took true / false before they took auto | on | off (train.cudagraphs, issue 42): a saved run, preset or
# --set with the old value still loads, as the switch that means the same.
WERE_BOOLEAN = ("train.cudagraphs",)

_EPS = "attack.eps (the training attack) or eval.eps (evaluation); Adam's epsilon is train.adam_eps"
_ALPHA = "attack.alpha (the training attack's step) or eval.alpha (evaluation's)"
# What other code bases call a key (the TRADES/CFA/FAT scripts' argparse names, PyTorch optimizer arguments, timm's
# flags), looked up by the part after the last dot: learning_rate, train.learning_rate and optim.learning_rate all
# point at train.lr. Where the name means different keys here, both are named.
SYNONYMS: dict[str, str] = {
    "learning_rate": "train.lr", "lr_max": "train.lr", "base_lr": "train.lr", "wd": "train.weight_decay",
    "decay": "train.weight_decay", "lr_decay": "train.lr_gamma", "gamma": "train.lr_gamma",
    "milestones": "train.lr_milestones", "lr_steps": "train.lr_milestones", "decay_epochs": "train.lr_milestones",
    "scheduler": "train.lr_schedule", "lr_policy": "train.lr_schedule", "sched": "train.lr_schedule",
    "optim": "train.optimizer", "opt": "train.optimizer", "solver": "train.optimizer",
    "train.eps": "train.adam_eps (Adam's epsilon; attack.eps and eval.eps are attack budgets)",
    "betas": "train.adam_betas", "beta1": "train.adam_betas", "beta2": "train.adam_betas",
    "eta_min": "train.lr_min", "min_lr": "train.lr_min",
    "step_size_up": "train.lr_cycle_epochs (a whole cycle, in epochs)",
    "warmup_epochs": "train.lr_peak_epoch (train.lr_schedule=onecycle)",
    "num_epochs": "train.epochs", "n_epochs": "train.epochs", "max_epochs": "train.epochs", "epoch": "train.epochs",
    "bs": "data.batch_size", "batch": "data.batch_size", "train_batch_size": "data.batch_size",
    "test_batch_size": "data.eval_batch_size", "eval_bs": "data.eval_batch_size",
    "epsilon": _EPS, "budget": _EPS, "step_size": _ALPHA, "step": _ALPHA,
    "num_steps": "attack.steps", "perturb_steps": "attack.steps", "iters": "attack.steps",
    "attack_iters": "attack.steps", "k": "attack.steps",
    "beta": "method.kl_weight (TRADES' and CFA's beta; the ME paper's lambda) or method.entropy_weight (ME-AT and "
            "ME-TRADES' beta)",
    "lambda": "method.kl_weight (TRADES' beta, the ME paper's lambda)",
    "label_smoothing": "method.smoothing", "ls": "method.smoothing",
    "arch": "model.name", "architecture": "model.name", "net": "model.name", "model": "model.name",
    "data_path": "data.data_dir", "data_root": "data.data_dir", "root": "data.data_dir", "datadir": "data.data_dir",
    "fp16": "train.amp (auto | bf16 | off)", "bf16": "train.amp (auto | bf16 | off)",
    "mixed_precision": "train.amp (auto | bf16 | off)",
    "val_size": "data.val_per_class (validation images per class)",
    "num_val": "data.val_per_class (validation images per class)",
}


# Keys --resume may change, and why each leaves the epochs already trained valid: every other
# key changes what the run computes, so changing it mid-run would mix two experiments in one.
RESUMABLE: dict[str, str] = {
    "train.epochs": "train longer (or stop sooner); the epochs done stay as they are",
    "train.lr": "the schedule from the resumed epoch on: a lower rate is the fix for a diverged run",
    "train.lr_milestones": "the schedule of the epochs still to train, e.g. for more epochs",
    "train.lr_gamma": "the schedule of the epochs still to train",
    "train.lr_min": "the schedule of the epochs still to train",
    "train.lr_cycle_epochs": "the schedule of the epochs still to train",
    "train.lr_peak_epoch": "the schedule of the epochs still to train",
    "train.device": "where the same computation runs",
    "train.compile": "how the same computation runs", "train.compile_attack": "how the same computation runs",
    "train.cudagraphs": "how the same computation runs", "train.kernels": "how the same computation runs",
    "train.cpp_wrapper": "how the same computation runs", "train.onednn": "how the same computation runs",
    "train.progress": "display only",
    "train.progress_every_s": "display only",
    "train.track": "where the numbers are also sent; the run's files stay the same",
    "data.data_dir": "the same data in another folder", "data.beton_dir": "the same data in another folder",
    "data.eval_batch_size": "memory only: the same per-class accuracies",
    "data.workers": "how the same computation runs (the folder loader draws its crops from the seed, not the worker)",
    "eval.attacks": "the final evaluation, after training", "eval.split": "the final evaluation, after training",
}


# the origin of a resumed run's saved values (Config.origins): checked when the run started, against the layers
# of then, so what was only a warning then (a preset's milestones cut short by --epochs) must not refuse its resume
SAVED = "the saved run config"


class Config:
    """The run's sections by name (``cfg.data``, ``cfg.method``, ``cfg.ccm``, ...) and the preset's description."""

    def __init__(self, method: str = "pgd-at", preset: str = ""):
        self.preset = preset
        self.layers: dict[str, int] = {}  # key -> the layer (DEFAULTS, PRESET, USER) that set it; unset: DEFAULTS
        self.origins: dict[str, str] = {}  # key -> who set it, as messages say it ("the preset", "--set", "--method")
        # (preset name, [(key, the preset's value, the value a flag or --set gave it)]) of a new run (:func:`resolve`)
        self.overridden: tuple[str, list[tuple[str, Any, Any]]] = ("", [])
        self.sections = {name: cls() for name, cls in CORE.items()}
        self.sections["method"] = METHODS.get(method).section()(name=method)
        self.sections.update({name: OPTIONS.get(name).section()() for name in OPTIONS})

    def __getattr__(self, name: str):
        try:
            return self.__dict__["sections"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __eq__(self, other) -> bool:
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def enabled_options(self) -> list[str]:
        """Names of the options this run switches on (each decides from its own section)."""
        return [name for name in OPTIONS if OPTIONS.get(name).enabled(self)]

    def to_dict(self) -> dict[str, Any]:
        return {"preset": self.preset, **{name: dataclasses.asdict(s) for name, s in self.sections.items()}}

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


def _fields(cfg: Config) -> dict[str, dict[str, Any]]:
    """{section: {key: type}} of ``cfg``, what :func:`schema.qualified` and :func:`schema.unknown_key_hint` read."""
    return {s: schema.field_types(sec) for s, sec in cfg.sections.items()}


def _qualify(cfg: Config, key: str) -> str:
    """``a.b`` stays; a bare ``b`` is accepted when exactly one section has it."""
    return schema.qualified(_fields(cfg), key, SYNONYMS)


def qualify(key: str) -> str:
    """A key as ``section.key``, as :func:`resolve` reads it (a bare key when exactly one section has it)."""
    return _qualify(Config(), key)


def apply(cfg: Config, updates: dict[str, Any], origin: str, layer: int = USER) -> Config:
    """Apply flat ``{'section.key': value}`` updates in place, validating each key and value; ``layer`` records
    who chose them (:data:`DEFAULTS`, :data:`PRESET`, :data:`USER`)."""
    for raw_key, value in updates.items():
        key = _qualify(cfg, raw_key)
        if key == "preset":
            cfg.preset = str(value)
            continue
        section, _, name = key.partition(".")
        if key == "method.name" and value != cfg.method.name:
            raise UserError(f"method.name is {cfg.method.name} in {origin}'s config and cannot change to {value!r}; "
                            "start a new run (another --out) for another method")
        types_ = schema.field_types(cfg.sections[section]) if section in cfg.sections else {}
        if name not in types_:
            raise UserError(f"unknown config key {raw_key!r} (from {origin}).{_hint(cfg, key)}")
        if key in WERE_BOOLEAN and isinstance(value, bool):
            value = "on" if value else "off"
        setattr(cfg.sections[section], name, schema.coerce(key, value, types_[name]))
        cfg.layers[key] = layer
        cfg.origins[key] = origin
    return cfg


def _hint(cfg: Config, key: str) -> str:
    method_keys = {m: list(METHODS.get(m).keys_all()) for m in METHODS}
    return schema.unknown_key_hint(_fields(cfg), key, cfg.method.name, method_keys, RENAMED, SYNONYMS)


def renamed(flat: dict[str, Any]) -> dict[str, Any]:
    """A saved config's keys under their current names (:data:`RENAMED`); a run saved before train.lr_schedule
    existed, with train.lr_epochs, trained on the piecewise schedule those points now belong to."""
    out = {}
    for key, value in flat.items():
        for new in RENAMED.get(key, (key,)):
            out[new] = value
    if out.get("train.lr_epochs") and "train.lr_schedule" not in out:
        out["train.lr_schedule"] = "piecewise"
    return out


def _with_defaults(method: str, dataset: str, options: list[str]) -> Config:
    """A config holding every default that applies below the user's layers (module docstring)."""
    cfg = Config(method)
    apply(cfg, {"data.dataset": dataset}, "the command line", DEFAULTS)
    apply(cfg, METHODS.get(method).defaults, f"method {method}'s defaults", DEFAULTS)
    spec = DATASETS.get(dataset)
    apply(cfg, {"data.val_per_class": spec.val_per_class, "data.crop_padding": spec.crop_padding,
                "data.flip": spec.flip, "data.loader": spec.loader}, f"data set {dataset}'s defaults", DEFAULTS)
    for name in options:
        try:
            apply(cfg, OPTIONS.get(name).defaults, f"option {name}'s defaults", DEFAULTS)
        except UserError as err:
            raise UserError(f"option {name} does not combine with method {method}: {err}") from None
    return cfg


def resolve(preset: str | None = None, flags: dict[str, Any] | None = None,
            sets: list[str] | dict[str, Any] | None = None, base: dict[str, Any] | None = None,
            flag_names: dict[str, str] | None = None) -> Config:
    """Build the run's config by the layering in the module docstring.

    ``sets``: ``--set`` strings, or their values already parsed (``fastfair.train(sets=...)``);
    ``base`` (a saved run's config) replaces the defaults, used by ``--resume``; ``flag_names``: how the user gave
    each key of ``flags`` (``{"method.name": "--method"}``), which :func:`overrides_line` names.
    """
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    from_preset = read_preset(preset) if preset else {}
    layers = [
        ("the preset", PRESET, from_preset),
        *(((flag_names or {}).get(k, "the command line"), USER, {k: v}) for k, v in given.items()),
        ("--set", USER, dict(sets) if isinstance(sets, dict) else parse_set(sets or [])),
    ]
    probe = Config()
    merged = {_qualify(probe, k): v for _, _, layer in layers for k, v in layer.items()}
    chose = [(rank, origin) for origin, rank, layer in layers
             if any(_qualify(probe, k) == "method.name" for k in layer)]
    method_layer, method_origin = chose[-1] if chose else (DEFAULTS, "the defaults")  # the last layer wins
    # the method is chosen once, from every layer (a preset's method may be overridden by --set)
    layers = [(origin, rank, {k: v for k, v in layer.items() if _qualify(probe, k) != "method.name"})
              for origin, rank, layer in layers]
    if base is not None:
        saved = renamed(flatten(base))
        # a resumed run's saved values were chosen when it started: as a preset's, below this command's
        cfg = apply(Config(saved["method.name"]), saved, SAVED, PRESET)
        apply(cfg, {"method.name": merged.get("method.name", cfg.method.name)}, "the saved run", PRESET)
    else:
        method = merged.get("method.name", probe.method.name)
        dataset = merged.get("data.dataset", probe.data.dataset)
        # Which options are on depends on the layers, and their defaults go below the layers:
        # apply the layers once to see, then build again with those options' defaults.
        trial = _with_defaults(method, dataset, [])
        for origin, rank, layer in layers:
            apply(trial, layer, origin, rank)
        cfg = _with_defaults(method, dataset, trial.enabled_options())
        cfg.layers["method.name"], cfg.origins["method.name"] = method_layer, method_origin
    preset_values = {}  # as the config holds them after the preset, to tell which a later layer changed
    for origin, rank, layer in layers:
        apply(cfg, layer, origin, rank)
        if rank == PRESET:
            preset_values = {key: value_of(cfg, key) for key in (_qualify(cfg, k) for k in layer) if key != "preset"}
    if base is None and preset:
        said = {_qualify(probe, k): v for k, v in from_preset.items()}
        if "method.name" in said:  # applied before the layers (the method is chosen once); said first
            preset_values = {"method.name": said["method.name"], **preset_values}
        cfg.overridden = (preset, [(key, value, value_of(cfg, key)) for key, value in preset_values.items()
                                   if value_of(cfg, key) != value])
    for name in cfg.enabled_options():
        OPTIONS.get(name).check(cfg)
    return cfg


def value_of(cfg: Config, key: str) -> Any:
    """The value of ``section.key`` in ``cfg``."""
    section, _, name = key.partition(".")
    return getattr(cfg.sections[section], name)


def overrides_line(cfg: Config) -> str | None:
    """The preset keys a flag or ``--set`` changed, in one line said at the start of a new run:
    ``preset demo: method.name me-trades -> pgd-at (from --method)``; None when none was."""
    preset, changed = cfg.overridden
    if not changed:
        return None
    return f"preset {preset}: " + ", ".join(f"{key} {_shown(old)} -> {_shown(new)} (from {cfg.origins[key]})"
                                              for key, old, new in changed)


def _shown(value: Any) -> str:
    return f"{value!r}" if isinstance(value, str) and not value else str(value)


def resume_changes(saved: Config, new: Config) -> dict[str, list]:
    """``{key: [saved value, new value]}`` for the keys ``--resume`` changes; a key outside
    :data:`RESUMABLE` is a UserError listing what may change."""
    old, cur = flatten(saved.to_dict()), flatten(new.to_dict())
    changed = {k: [old.get(k), v] for k, v in cur.items() if k != "preset" and old.get(k) != v}
    refused = [f"{k} ({old!r} -> {new!r})" for k, (old, new) in changed.items() if k not in RESUMABLE]
    if refused:
        raise UserError(f"--resume continues the saved config, and {', '.join(refused)} would change what the run "
                        f"computes; drop those flags, or start a new run with another --out. Keys --resume may "
                        f"change: {', '.join(RESUMABLE)}")
    return changed


def _saved(text: str, where: str) -> dict[str, Any]:
    try:
        saved = renamed(flatten(tomllib.loads(text)))
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{where}: the saved run config is damaged ({err}); restore it, or start a new run") from None
    if "method.name" not in saved:
        raise UserError(f"{where}: the saved run config names no method; restore it, or start a new run")
    return saved


def load_saved(path: str | Path) -> dict[str, Any]:
    """A saved run config file (``RUN/config.toml``) as nested TOML; a damaged one is a UserError."""
    text = RunDir(Path(path).parent).read_config()
    _saved(text, str(path))
    return tomllib.loads(text)


def load_run(run: str | Path) -> Config:
    """The config a run folder saved (its ``config.toml``, checksum checked); errors name that file."""
    folder = RunDir(run)
    return load_saved_text(folder.read_config(), str(folder.config))


def load_saved_text(text: str, where: str = "the checkpoint") -> Config:
    """A saved run config (TOML text) as a Config; keys saved under an earlier name are renamed."""
    saved = _saved(text, where)
    return apply(Config(saved["method.name"]), saved, SAVED)
