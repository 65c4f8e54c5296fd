"""From a config to the objects a run needs: device, data splits, loaders, model."""
from __future__ import annotations

import collections
import contextlib
import functools
import logging
import re
from pathlib import Path

import torch

from fastfair import data, gpu_defaults, gpu_figures, identity, models
from fastfair.data import subsets
from fastfair.config import Config
from fastfair.errors import UserError
from fastfair.ops import BACKENDS
from fastfair.rundir import RunDir, load_checkpoint
from fastfair.config import apply, load_run, load_saved_text


def device(cfg: Config) -> torch.device:
    return device_named(cfg.train.device)


def check_device_name(name: str) -> torch.device | None:
    """The device ``name`` (``--device``, ``train.device``) names, None for auto; a name torch does not know is a
    UserError. Whether this machine has it is :func:`device_named`'s to say (a grid checks on another host)."""
    if name == "auto":
        return None
    try:
        return torch.device(name)
    except (RuntimeError, TypeError):
        raise UserError(f"train.device={name!r} is not a device; use auto, cpu, cuda or cuda:N") from None


def device_named(name: str) -> torch.device:
    """The device ``--device``, ``train.device`` or ``fastfair.method(device=...)`` names: auto (CUDA where there
    is one), cpu, cuda or cuda:N; an unknown name, or CUDA where there is none, is a UserError."""
    dev = check_device_name(name)
    if dev is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"train.device={name!r}, but CUDA is not available here; use cpu or auto")
    return dev


@contextlib.contextmanager
def fastest_convolutions(dev: torch.device):
    """While training on CUDA, cuDNN times its algorithms per (static) shape and keeps the fastest.

    Restored afterwards: the choice may differ between processes, and evaluation must repeat.
    """
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = before or dev.type == "cuda"
    try:
        yield
    finally:
        torch.backends.cudnn.benchmark = before


def cpu_has_native_bf16() -> bool:
    """Whether this CPU multiplies bf16 in hardware (x86 avx512_bf16 or AMX), read from Linux's /proc/cpuinfo."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no evidence, so fp32
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) is not None


def autocast_dtype(cfg: Config, dev: torch.device) -> torch.dtype | None:
    """bf16 autocast for training on CUDA, and on a CPU with native bf16, where it measured 1.2-6x faster with the
    demo's numbers within seed noise (bench/results/cpu-amp-cpu.md); fp32 elsewhere (``train.amp``: auto | bf16 | off).
    """
    choice = cfg.train.amp
    if choice not in ("auto", "bf16", "off"):
        raise UserError(f"train.amp must be auto, bf16 or off; got {choice!r}")
    if choice == "off" or (choice == "auto" and not (dev.type == "cuda" or (dev.type == "cpu" and
                                                                           cpu_has_native_bf16()))):
        return None
    return torch.bfloat16


def channels_last(cfg: Config, dev: torch.device) -> bool:
    """Channels-last activations; ``auto`` is on where measured faster: on CUDA, and on a CPU, where PGD-AT steps
    took 0.55-0.93 of NCHW's time in fp32 and in bf16 (2-core CPU, 6 models and batch sizes,
    bench/results/cpu-layout-cpu.md)."""
    return _auto_switch(cfg.model.channels_last, "model.channels_last", dev, auto_on=("cuda", "cpu"))


def model_spec(cfg: Config, bundle: data.DataBundle) -> dict:
    """Everything needed to rebuild the model from a checkpoint alone."""
    return _spec(cfg, bundle, *bundle.mean_std())


def _spec(cfg: Config, bundle: data.DataBundle, mean: list[float], std: list[float]) -> dict:
    return {"name": cfg.model.name, "norm": cfg.model.norm, "width": cfg.model.width,
            "num_classes": bundle.num_classes, "in_channels": bundle.shape[0], "mean": mean, "std": std,
            "classes": list(bundle.classes), "head": cfg.model.head, "head_scale": cfg.model.head_scale,
            "feature_dim": cfg.model.feature_dim}


def _build_model(spec: dict) -> models.Classifier:
    return models.build(spec["name"], num_classes=spec["num_classes"], in_channels=spec["in_channels"],
                        mean=spec["mean"], std=spec["std"], norm=spec["norm"], width=spec["width"],
                        head=spec.get("head", "linear"), head_scale=spec.get("head_scale", 15.0),
                        feature_dim=spec.get("feature_dim", 0))


def model_from_spec(spec: dict, dev: torch.device, cl: bool) -> models.Classifier:
    m = _build_model(spec).to(dev)
    return m.to(memory_format=torch.channels_last) if cl else m


def check_input_size(cfg: Config, bundle: data.DataBundle) -> None:
    """Refuses, before any data moves, a model that cannot take the run's images (VGG's five 2x2 max-pools on
    8x8 digits or 28x28 MNIST): one forward per image size the run uses on the meta device, which computes
    shapes only (the normalisation's statistics do not matter there)."""
    d, channels = cfg.data, bundle.shape[0]
    first = (d.image_size,) * 2 if d.loader == "folder" else tuple(bundle.shape[1:])  # a folder's crop is asked for
    spec = _spec(cfg, bundle, [0.0] * channels, [1.0] * channels)
    with torch.device("meta"):
        model = _build_model(spec).eval()  # eval: BatchNorm of a 1x1 map takes any batch
    for h, w in sorted({first, *((side, side) for side in d.phase_image_sizes)}):
        try:
            model(torch.empty(2, spec["in_channels"], h, w, device="meta"))
        except (RuntimeError, ValueError) as e:
            raise UserError(f"model {spec['name']} cannot take {h}x{w} images ({str(e).splitlines()[0]}); "
                            "pick a model for this size (fastfair models says which sizes each takes)") from None


def splits(cfg: Config, loaded: data.DataBundle | None = None) -> tuple[data.DataBundle, dict]:
    """The run's data set and its train / val / test splits; ``loaded``: the data set as :func:`data.load`
    returned it, when the caller has it already (a grid checks many runs of one data set)."""
    d = cfg.data
    need = data.DATASETS.get(d.dataset).loader
    if d.loader != need and "folder" in (d.loader, need):  # a folder bundle holds file indices, the others images
        raise UserError(f"data.loader={d.loader} cannot read {d.dataset}: it needs --loader {need}"
                        + (" (its images do not fit in memory)" if need == "folder" else ""))
    raw = data.load(d.dataset, d.data_dir or None) if loaded is None else loaded
    bundle = subsets.select(raw, d.classes)
    # .beton files hold every class's training images; the device and folder loaders read what the split indexes
    if d.drop_classes and d.loader not in ("device", "folder"):
        raise UserError(f"data.drop_classes needs data.loader=device (or folder); the {d.loader} loader reads the "
                        "training images from its own files, which still hold the dropped classes")
    on_test = cfg.train.select_split == "test"  # the ME paper's rule: no held-out split, the test set scores
    sp = data.split(bundle, 0 if on_test else d.val_per_class, d.train_per_class, d.test_per_class)
    if on_test:
        sp["val"] = sp["test"]
    return bundle, subsets.drop_from_training(bundle, sp, d.drop_classes)


def training_splits(cfg: Config, loaded: data.DataBundle | None = None) -> tuple[data.DataBundle, dict]:
    """:func:`splits`, and the checks of them a training run needs: the trainer's, and a grid's for every run
    before the first launches."""
    bundle, sp = splits(cfg, loaded)
    check_input_size(cfg, bundle)
    if cfg.data.drop_classes and cfg.train.select in ("fair", "worst"):
        raise UserError(f"train.select={cfg.train.select} scores the worst class on the validation split, and a class "
                        f"of data.drop_classes={cfg.data.drop_classes} has no validation images (accuracy 0, always "
                        "the worst); use train.select=pgd or last")
    n, d = len(sp["train"][1]), cfg.data
    largest = max(d.phase_batch_sizes or [d.batch_size])  # with resolution phases, data.batch_size is not trained on
    if n < largest:
        key, said = (("data.phase_batch_sizes", f"{d.phase_batch_sizes} (a batch of {largest})") if d.phase_batch_sizes
                     else ("data.batch_size", largest))
        raise UserError(f"{key}={said} is more than the {n} training images (after the validation split); lower {key}")
    return bundle, sp


def _loader_options(cfg: Config) -> dict:
    d = cfg.data
    if d.loader == "device":
        return {}
    if d.loader == "folder":
        return {"data_dir": d.data_dir, "image_size": d.image_size, "workers": d.workers,
                "phases": list(zip(d.phase_epochs, d.phase_image_sizes, d.phase_batch_sizes))}
    return {"beton_dir": d.beton_dir, "os_cache": d.os_cache, "dataset": d.dataset, "val_per_class": d.val_per_class}


def train_loader(cfg: Config, split, dev, cl: bool):
    """The training loader named by ``data.loader`` (``data.LOADERS``): shuffled, augmented, drop_last."""
    x, y = split
    return data.LOADERS.get(cfg.data.loader)(
        "train", x, y, cfg.data.batch_size, device=dev, train=True, crop_padding=cfg.data.crop_padding,
        crop_mode=cfg.data.crop_mode, flip=cfg.data.flip, seed=cfg.train.seed, channels_last=cl, order=cfg.data.order,
        **_loader_options(cfg))


def eval_loader(cfg: Config, split, dev, cl: bool, name: str | None = None):
    """Evaluation batches in split order; through ``data.loader`` when the split's ``name`` is given
    (the trainer's validation) or the data set is read from its files (imagenet), else on the device
    (evaluating a checkpoint needs no .beton files)."""
    x, y = split
    through = bool(name) or cfg.data.loader == "folder"
    kind = cfg.data.loader if through else "device"
    opts = _loader_options(cfg) if through else {}
    return data.LOADERS.get(kind)(name, x, y, cfg.data.eval_batch_size, device=dev, train=False,
                                  channels_last=cl, **opts)


def _auto_on_off(cfg_value: str, key: str) -> None:
    if cfg_value not in ("auto", "on", "off"):
        raise UserError(f"{key} must be auto, on or off; got {cfg_value!r}")


def _auto_switch(cfg_value: str, key: str, dev: torch.device, auto_on: tuple[str, ...] = ("cuda",)) -> bool:
    """``on``, ``off``, or ``auto``: on for the device types in ``auto_on``."""
    _auto_on_off(cfg_value, key)
    return cfg_value == "on" or (cfg_value == "auto" and dev.type in auto_on)


def kernels(cfg: Config, dev: torch.device, compiled_descent: bool = False) -> str:
    """The ops backend; ``auto`` picks where each wins (bench/results/gpu-codegen-predicted-*.md, issue 26).

    On CUDA with the attack compiled as one graph, Inductor already fuses the reference loss rows and
    PGD step into its own kernels, and a fused kernel is opaque to that fusion: it added launches (ResNet-18,
    batch 128: PGD-AT 2,437 against 2,436; TRADES 1,525 against 1,499) and saved under 0.1 GB of 15-21 GB
    per step. Only the random start, drawn eagerly outside the graphs, gains (2 launches instead of 7).
    So ``auto`` is ``inductor`` there, ``triton`` where the attack loop runs eagerly on CUDA, ``torch``
    elsewhere.
    """
    choice = cfg.train.kernels
    if choice == "auto":
        if dev.type != "cuda":
            return "torch"
        return "inductor" if compiled_descent else "triton"
    BACKENDS.get(choice)
    return choice


def batch_size(cfg: Config, epoch: int) -> int:
    """The training batch size of 0-based ``epoch``: its resolution phase's (data.phase_*), else data.batch_size."""
    d = cfg.data
    return next((b for first, b in reversed(list(zip(d.phase_epochs, d.phase_batch_sizes))) if first <= epoch),
                d.batch_size)


def compiles(cfg: Config, dev: torch.device) -> bool:
    """Whether the run compiles its step and validation model (train.compile: auto | on | off; auto: on for CUDA)."""
    return _auto_switch(cfg.train.compile, "train.compile", dev)


def auto_cpp_wrapper(dev: torch.device) -> bool:
    """What train.cpp_wrapper=auto means: on CUDA, what the GPU measurements the package ships say
    (:func:`fastfair.gpu_defaults.cpp_wrapper`: off until a GPU measured it faster, with CUDA graphs as they
    default); off on other devices. docs/performance.md says what it rests on."""
    if dev.type != "cuda":
        return False
    fig = gpu_figures.shipped()
    return gpu_defaults.cpp_wrapper(fig, gpu_defaults.cudagraphs(fig).on).on


def auto_cudagraphs(dev: torch.device) -> bool:
    """What train.cudagraphs=auto means for a run that compiles: on CUDA, what the GPU measurements the package ships
    say (:func:`fastfair.gpu_defaults.cudagraphs`: on unless a GPU measured them slower or failing). Until one has,
    it rests on a PREDICTION: the default step measured host-bound on an H200 (46.8 ms issuing 2,436 launches for
    about 10 ms of GPU work), which is what CUDA graphs remove (predicted 3.93 s per epoch there instead of 18.3 s;
    docs/performance.md)."""
    return dev.type == "cuda" and gpu_defaults.cudagraphs(gpu_figures.shipped()).on


def cpp_wrapper(cfg: Config, dev: torch.device) -> bool:
    """Whether Inductor writes the compiled code's wrapper in C++ (train.cpp_wrapper: auto | on | off)."""
    choice = cfg.train.cpp_wrapper
    _auto_on_off(choice, "train.cpp_wrapper")
    if choice == "on" and not compiles(cfg, dev):
        raise UserError("train.cpp_wrapper=on needs train.compile on: the wrapper is that of Inductor's compiled code")
    return compiles(cfg, dev) and (choice == "on" or (choice == "auto" and auto_cpp_wrapper(dev)))


@functools.cache
def graphs_under_cpp_wrapper() -> bool:
    """Whether this torch's Inductor records CUDA graphs of code with its C++ wrapper, asked of Inductor itself
    (``get_cpp_wrapper_config``, under :func:`compile_options`' settings). torch 2.11 turns them off whatever it is
    asked ("skipping cudagraphs due to cpp wrapper enabled"); torch 2.13 keeps them where graph partitioning is off.
    The skip Inductor counts and logs while answering is undone."""
    from torch._dynamo.utils import counters
    from torch._inductor import compile_fx, config as inductor_config

    saved = dict(counters).get("inductor")  # a copy, or None where Inductor has counted nothing yet
    saved = None if saved is None else collections.Counter(saved)
    quiet = logging.getLogger("torch._inductor.cudagraph_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        # cudagraph_or_error off: the answer, not the error its compilation would raise
        with inductor_config.patch({**compile_options(cpp_wrapper=True, graphs=True),
                                    "triton.cudagraph_or_error": False}):
            return bool(compile_fx.get_cpp_wrapper_config()["triton.cudagraphs"])
    finally:
        quiet.setLevel(level)
        if saved is None:
            counters.pop("inductor", None)
        else:
            counters["inductor"] = saved


def cudagraphs(cfg: Config, dev: torch.device) -> tuple[bool, str]:
    """Whether the training step records CUDA graphs (train.cudagraphs: auto | on | off; auto: :func:`auto_cudagraphs`
    for a run that compiles), and where ``auto`` came out off for a reason the user may not expect, that reason."""
    choice = cfg.train.cudagraphs
    _auto_on_off(choice, "train.cudagraphs")
    compiled, wrapper = compiles(cfg, dev), cpp_wrapper(cfg, dev)
    conflict = wrapper and not graphs_under_cpp_wrapper()
    if choice == "on":
        if not compiled:
            raise UserError("train.cudagraphs=on needs train.compile on: CUDA graphs record the compiled step")
        if dev.type != "cuda":
            raise UserError(f"train.cudagraphs=on needs a CUDA device (this run is on {dev}); use --cudagraphs off")
        if conflict:
            raise UserError(f"train.cudagraphs=on and train.cpp_wrapper=on: torch {torch.__version__}'s Inductor "
                            "records no CUDA graph of code with its C++ wrapper; set one of them off (torch 2.13 "
                            "records both)")
        return True, ""
    if choice == "off" or not (compiled and auto_cudagraphs(dev)):
        return False, ""
    if conflict:
        return False, (f"train.cudagraphs=auto: off, because train.cpp_wrapper=on and torch {torch.__version__}'s "
                       "Inductor records no CUDA graph of code with its C++ wrapper")
    return True, ""


def compile_options(cpp_wrapper: bool, graphs: bool) -> dict:
    """Inductor's settings for the run's compiled code: the one place fastfair chooses them (torch.compile refuses
    ``mode=`` beside ``options=``, so CUDA graphs are asked for by their own key, as mode="reduce-overhead" does).

    - ``cpp_wrapper``: the code calls its kernels from C++ (CUDA: ``cuLaunchKernel`` for Triton kernels, AOTI's C
      shims for cuDNN / cuBLAS and ATen) instead of Python; Triton's own launches already go through Inductor's
      static CUDA launcher on both torch ends (``use_static_cuda_launcher``, on by default).
    - ``graphs``: CUDA graphs (``triton.cudagraphs``), and ``triton.cudagraph_or_error``: a region Inductor would run
      without graphs raises instead, so the step's check (training/fallback.py) says why and falls back rather than
      the setting doing nothing in silence. Under the C++ wrapper, torch 2.13 records graphs only without graph
      partitions (``get_cpp_wrapper_config``); torch 2.11 records none (:func:`graphs_under_cpp_wrapper`).
    """
    options = {"cpp_wrapper": True} if cpp_wrapper else {}
    if graphs:
        options.update({"triton.cudagraphs": True, "triton.cudagraph_or_error": True})
        if cpp_wrapper:
            options["graph_partition"] = False
    return options


def compiler(cfg: Config, dev: torch.device, graphs: bool = False):
    """``torch.compile`` configured for the run (:func:`compile_options`), or ``None`` when compilation is off;
    ``graphs``: with CUDA graphs (the training step's, where :func:`cudagraphs` says the run records them)."""
    if not compiles(cfg, dev):
        return None
    options = compile_options(cpp_wrapper(cfg, dev), graphs) or None
    return lambda fn: torch.compile(fn, options=options)


def from_checkpoint(path, *, split: str, device_name: str, data_dir: str | None, batch_size: int | None,
                    channels_last_ok: bool = True, test_per_class: int | None = None):
    """A checkpoint's model (weights loaded), its config and data: what eval and diagnose share.
    ``test_per_class`` replaces the run's ``data.test_per_class`` (``eval --per-class``).

    Returns ``(ck, cfg, dev, model, bundle, (x, y) of split)``."""

    if split not in ("test", "val"):
        raise UserError(f"--split must be test or val; got {split!r}")
    ck = load_checkpoint(path)
    identity.check_in_run(path, ck)  # a checkpoint copied into a run's checkpoints/ from another is refused
    cfg = apply(load_saved_text(ck["config"]), {"train.device": device_name}, "the command line")
    if data_dir:
        apply(cfg, {"data.data_dir": data_dir}, "--data-dir")
    if batch_size:
        apply(cfg, {"data.eval_batch_size": batch_size}, "--batch-size")
    if test_per_class is not None:
        apply(cfg, {"data.test_per_class": test_per_class}, "--per-class")
    dev = device(cfg)
    model = model_from_spec(ck["spec"], dev, channels_last_ok and channels_last(cfg, dev))
    model.load_state_dict(ck["model"])
    bundle, sp = splits(cfg)
    return ck, cfg, dev, model, bundle, sp[split]



def checkpoint_path(target: str | Path, checkpoint: str = "auto") -> Path:
    """RUN_DIR -> RUN_DIR/checkpoints/<checkpoint>.pt (auto: the run's train.select); a .pt path stays."""
    path = Path(target)
    if not path.is_dir():
        return path
    run = RunDir(path)
    if checkpoint != "auto":
        return run.existing_checkpoint(checkpoint)
    return run.selected_checkpoint(load_run(run.path).train.select)


def checkpoint_model(target: str | Path, dev: torch.device) -> tuple[models.Classifier, Path]:
    """(the model of a fastfair run folder or checkpoint file, weights loaded, in eval mode on ``dev``; its path)."""
    path = checkpoint_path(target)
    ck = load_checkpoint(path)
    model = model_from_spec(ck["spec"], dev, False)
    model.load_state_dict(ck["model"])
    return model.eval(), path


def substitute_model(target: str | Path, dev: torch.device, like: torch.nn.Module, example: torch.Tensor):
    """The model of a fastfair run or checkpoint (weights only), in eval mode on ``dev``, for transfer attacks on
    ``like``: a substitute with another number of classes or input shape than ``like`` takes on ``example``
    (a batch of the target's inputs) is a UserError."""
    model, path = checkpoint_model(target, dev)
    with torch.no_grad():
        try:
            theirs = model(example[:1].to(dev)).shape[1:]
        except RuntimeError as err:
            raise UserError(f"the substitute {path} does not take the evaluated images {list(example.shape[1:])} "
                            f"({type(err).__name__}); give a substitute trained on the same data set") from None
        ours = like(example[:1]).shape[1:]
    if theirs != ours:
        raise UserError(f"the substitute {path} has {theirs[0]} outputs and the evaluated model {ours[0]}; give a "
                        "substitute trained on the same classes")
    return model, path
