"""Run configuration: dataclasses with defaults, TOML presets, and ``--set a.b=value`` overrides.

Resolution order (later wins): dataclass defaults < the method's defaults (attack objective,
init and BN mode of its paper's code) < the data set's defaults (validation size, augmentation)
< the TOML preset < command-line flags < ``--set``. Every key is validated against the
dataclasses: an unknown key is an error that lists the close matches.
"""
from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

import tomli_w

from fastfair.errors import UserError


@dataclass
class DataConfig:
    dataset: str = "cifar10"
    data_dir: str = ""  # folder (torchvision sets, Tiny-ImageNet) or file (npz)
    val_per_class: int = 100  # CFA: first N training images of each class form the validation split
    crop_padding: int = 4
    flip: bool = True
    batch_size: int = 128
    eval_batch_size: int = 500
    loader: str = "device"  # device | ffcv (fastfair data convert, then --loader ffcv --beton-dir DIR)
    beton_dir: str = ""  # ffcv: folder with train/val/test.beton and meta.json
    os_cache: bool = True  # ffcv: let the OS page cache hold the .beton file (false: FFCV reads pages)
    order: str = "random"  # ffcv training order: random (the device loader's) | quasi_random | sequential
    # ME paper Sec. 2.2 binary/subset experiments: keep only these classes, relabelled 0..k-1 in
    # the order given (e.g. [3, 5] = cat vs dog); empty keeps all
    classes: list[int] = field(default_factory=list)


@dataclass
class ModelConfig:
    name: str = "resnet18"
    norm: str = "bn"
    width: int = 0  # 0: the paper's width; smaller for quick experiments
    channels_last: str = "auto"  # auto (on for CUDA) | on | off
    head: str = "linear"  # linear | cosine (HE, Pang et al. 2020: normalised features and class weights)
    head_scale: float = 15.0  # HE scale s (1/T in Tian et al.); the start value when a schedule moves it


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
class MethodConfig:
    name: str = "pgd-at"
    smoothing: float = 0.0  # label smoothing alpha, any method (ME paper Table 1: 0.1)
    kl_weight: float = 6.0  # TRADES regulariser: lambda in the ME paper, beta in TRADES/CFA
    entropy_weight: float = 0.0  # ME-AT/ME-TRADES beta
    # --- class-wise options shared by methods (fastfair/methods/options.py, cfa.py, ...) ---
    kl_weight_per_class: list[float] = field(default_factory=list)  # class-wise beta (Tian KDD Eq. 5); empty: kl_weight for all
    kl_normalize: bool = False  # divide the TRADES loss by (1 + beta_y), as CFA's code does even without CCR
    ccm: bool = False  # CFA Class-wise Calibrated Margin: eps_k = (ccm_lambda + A_k) eps (CFA Eq. 6)
    ccm_lambda: float = 0.5  # CFA lambda_1: 0.5 AT, 0.3 TRADES, 0.7 FAT (CFA Sec. 5.1)
    ccr: bool = False  # CFA Class-wise Calibrated Regularisation: beta_k = (ccr_lambda + A_k) beta (CFA Eq. 7-8)
    ccr_lambda: float = 0.5  # CFA lambda_2
    calibrate_begin: int = 10  # first epoch whose eps_k / beta_k use A_k (CFA code's --begin; the paper gives none)
    class_weights: list[float] = field(default_factory=list)  # cost-sensitive per-class loss weights w_y (Benz et al.)
    class_weights_auto: bool = False  # derive w_k from train robust accuracy each epoch (fastfair's rule, docs/methods.md)
    adv_classes: list[int] = field(default_factory=list)  # ME paper single AT: adversarial examples only for these classes (indices after data.classes)
    he_margin: float = 0.0  # HE angular margin m on the CE terms (Pang et al. 2020: 0.2); needs model.head = "cosine"
    he_schedule: str = "fixed"  # HE scale schedule: fixed | lis | cmp (Tian ICLR App. G)
    he_scale_end: float = 75.0  # LIS: 1/T at the last epoch (Tian: 1 -> 75)
    he_pmax_start: float = 0.2  # CMP: controlled maximum probability at epoch 0 (Tian: 0.2)
    he_pmax_end: float = 1.0  # CMP: ... reached at he_pmax_epoch (Tian: 1)
    he_pmax_epoch: int = 90  # CMP: end of the interpolation (Tian: 90 of 100)
    fat_tau: int = 0  # FAT: extra misclassified PGD steps allowed before a sample stops (Zhang et al. 2020)
    fat_tau_milestones: list[int] = field(default_factory=list)  # FAT dynamic tau: +1 at each of these epochs
    frl_bound: float = 0.1  # FRL: tolerance of class error above average (code: bound0 = bound1 = 0.1)
    frl_rate_weight: float = 0.05  # FRL: multiplier step of the reweight terms (code: rate1)
    frl_rate_margin: float = 0.1  # FRL: multiplier step of the remargin term (code: rate2)
    frl_lim: float = 0.5  # FRL: reweight multipliers are rescaled to sum <= lim
    frl_halve_every: int = 40  # FRL code halves rate1 every 40 epochs


@dataclass
class TrainConfig:
    epochs: int = 100
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    nesterov: bool = False
    lr_milestones: list[int] = field(default_factory=lambda: [75, 90])
    lr_gamma: float = 0.1
    seed: int = 0
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    amp: str = "auto"  # auto (bf16 on CUDA) | bf16 | off
    kernels: str = "auto"  # auto (triton on CUDA) | triton | torch: backend of the loss and PGD-step ops
    compile: str = "auto"  # auto (on for CUDA) | on | off: torch.compile the model and the method's loss
    cudagraphs: bool = False  # compile with mode="reduce-overhead" (CUDA graphs); not yet measured, so off
    val_attack: str = "pgd10"  # per-class validation robustness each epoch (CFA: PGD-10)
    select: str = "pgd"  # checkpoint the final evaluation uses: pgd | fair | last
    progress: bool = True
    averaging: str = "none"  # weight averaging per epoch: none | ema | fawa (CFA Sec. 4.3); see fastfair/averaging.py
    avg_decay: float = 0.85  # EMA/FAWA decay (CFA paper 0.85, code 0.88)
    avg_threshold: float = 0.2  # FAWA: an epoch is averaged in only if worst-class val robust acc >= this (paper 0.2, code 0.24)
    avg_begin: int = 50  # first epoch averaged in (CFA paper 50, code 0)
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
    split: str = "test"


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    attack: AttackConfig = field(default_factory=AttackConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    preset: str = ""  # which paper table this preset reproduces (documentation only)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_toml(self) -> str:
        return tomli_w.dumps(self.to_dict())


SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "preset"}


def _section_types(section: str) -> dict[str, Any]:
    cls = {"data": DataConfig, "model": ModelConfig, "attack": AttackConfig, "method": MethodConfig,
           "train": TrainConfig, "eval": EvalConfig}[section]
    return typing.get_type_hints(cls)


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """Check ``value`` against the field type; ints are accepted for floats."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        for t in typing.get_args(typ):
            try:
                return _coerce(key, value, t)
            except UserError:
                pass
        raise UserError(f"{key}: {value!r} is not a {typ}")
    if origin is list:
        if not isinstance(value, list):
            raise UserError(f"{key} takes a list, for example {key}=[1, 2]; got {value!r}")
        (item,) = typing.get_args(typ)
        return [_coerce(key, v, item) for v in value]
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if typ is bool and not isinstance(value, bool):
        raise UserError(f"{key} takes true or false; got {value!r}")
    if typ is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UserError(f"{key} takes an integer; got {value!r}")
    if not isinstance(value, typ):
        raise UserError(f"{key} takes a {typ.__name__}; got {value!r}")
    return value


def _all_keys() -> list[str]:
    return [f"{s}.{k}" for s in SECTIONS for k in _section_types(s)]


def _qualify(key: str) -> str:
    """``a.b`` stays; a bare ``b`` is accepted when exactly one section has it."""
    if "." in key:
        return key
    owners = [s for s in SECTIONS if key in _section_types(s)]
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    if len(owners) > 1:
        raise UserError(f"{key!r} is ambiguous; write one of {', '.join(f'{s}.{key}' for s in owners)}")
    return key


def apply(cfg: Config, updates: dict[str, Any], origin: str) -> Config:
    """Apply flat ``{'section.key': value}`` updates in place, validating each key and value."""
    for raw_key, value in updates.items():
        key = _qualify(raw_key)
        if key == "preset":
            cfg.preset = str(value)
            continue
        section, _, name = key.partition(".")
        types_ = _section_types(section) if section in SECTIONS else {}
        if name not in types_:
            close = difflib.get_close_matches(key, _all_keys(), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UserError(f"unknown config key {raw_key!r} (from {origin}).{hint}")
        setattr(getattr(cfg, section), name, _coerce(key, value, types_[name]))
    return cfg


def flatten(nested: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in nested.items():
        if isinstance(v, dict):
            out.update({f"{k}.{kk}": vv for kk, vv in v.items()})
        else:
            out[k] = v
    return out


def parse_set(items: list[str]) -> dict[str, Any]:
    """``key=value`` strings; the value is read as TOML (numbers, true/false, [lists]), else as text."""
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UserError(f"--set takes key=value (for example --set train.lr=0.05); got {item!r}")
        try:
            out[key.strip()] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            out[key.strip()] = raw
    return out


def preset_names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("fastfair.presets").iterdir() if p.name.endswith(".toml"))


def read_preset(name_or_path: str) -> dict[str, Any]:
    """A TOML file path, or the name of a preset shipped in ``configs/`` (``fastfair presets``)."""
    path = Path(name_or_path)
    if path.is_file():
        text = path.read_text()
    else:
        res = resources.files("fastfair.presets") / f"{name_or_path.removesuffix('.toml')}.toml"
        if not res.is_file():
            close = difflib.get_close_matches(name_or_path, preset_names(), n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise UserError(f"no config file or preset {name_or_path!r}.{hint} List presets with: fastfair presets")
        text = res.read_text()
    try:
        return flatten(tomllib.loads(text))
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{name_or_path}: not valid TOML ({err})") from None


def resolve(preset: str | None = None, flags: dict[str, Any] | None = None,
            sets: list[str] | None = None, base: dict[str, Any] | None = None) -> Config:
    """Build the run's config by the layering in the module docstring.

    ``base`` (a saved run's config) replaces the defaults, used by ``--resume``.
    """
    from fastfair.data import DATASETS
    from fastfair.methods import METHODS

    layers = [
        ("the preset", read_preset(preset) if preset else {}),
        ("the command line", {k: v for k, v in (flags or {}).items() if v is not None}),
        ("--set", parse_set(sets or [])),
    ]
    merged = {_qualify(k): v for _, layer in layers for k, v in layer.items()}
    cfg = Config()
    if base is not None:
        cfg = apply(cfg, flatten(base), "the saved run config")
    else:
        method = merged.get("method.name", cfg.method.name)
        dataset = merged.get("data.dataset", cfg.data.dataset)
        apply(cfg, {"method.name": method, "data.dataset": dataset}, "the command line")
        apply(cfg, METHODS.get(method).defaults, f"method {method}'s defaults")
        spec = DATASETS.get(dataset)
        apply(cfg, {"data.val_per_class": spec.val_per_class, "data.crop_padding": spec.crop_padding,
                    "data.flip": spec.flip}, f"data set {dataset}'s defaults")
    for origin, layer in layers:
        apply(cfg, layer, origin)
    METHODS.get(cfg.method.name)  # a method renamed by --set must exist too
    return cfg


def load_saved(path: str | Path) -> dict[str, Any]:
    return tomllib.loads(Path(path).read_text())


def load_saved_text(text: str) -> Config:
    """A saved run config (TOML text) as a Config."""
    return apply(Config(), flatten(tomllib.loads(text)), "the saved run config")
