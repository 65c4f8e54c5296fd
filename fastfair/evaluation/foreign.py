"""Per-class evaluation of a model file fastfair did not write: an authors' released checkpoint, a
RobustBench file, any state dict of a registry architecture.

The file is read with ``weights_only=True`` and turned into a fastfair state dict in four steps:
unwrap (``state_dict``, ``model``, ``net``, ...), strip wrapper prefixes (``module.`` of
DataParallel, ``_orig_mod.`` of torch.compile, ``model.``), take out the normaliser's mean and std
(fastfair's models normalise inside), and rename the authors' layer names to the registry's
(:data:`AUTHORS_KEYS`). A file that still does not match is refused with the keys that differ.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from fastfair import build, config, models, safe_load
from fastfair.errors import UserError
from fastfair.evaluation.per_class import evaluate_loaded
from fastfair.registry import Registry
from fastfair.rundir import file_sha256

NESTED = ("state_dict", "model_state_dict", "model", "net", "state")  # where authors' scripts keep the weights
WRAPPERS = ("module.", "_orig_mod.", "model.", "net.")  # DataParallel, torch.compile, wrapper modules
MEAN_NAMES, STD_NAMES = ("mean", "mu"), ("std", "sigma")  # RobustBench's models call them mu and sigma

# (regex at the start of a key, replacement string or function of the match; None: the key is dropped)
Rename = list[tuple[str, object]]
AUTHORS_KEYS: Registry[Rename] = Registry("architecture with authors' key names")


def _block(first: int, per_stage: list[int]):
    """``stage S, block B`` (S from 1) -> ``body.<index>.``: the registry models keep blocks in one Sequential,
    ``per_stage[s]`` blocks in stage s + 1 from index ``first``."""
    return lambda m: f"body.{first + sum(per_stage[:int(m[1]) - 1]) + int(m[2])}."


AUTHORS_KEYS.register("resnet18", "conv1, bn1, layer1-4.B, shortcut.0/1, linear (the CIFAR ResNet-18 of "
                                  "kuangliu/pytorch-cifar)")([
    (r"conv1\.", "body.0."), (r"bn1\.", "body.1."), (r"layer(\d)\.(\d)\.", _block(3, [2] * 4)),
    (r"(linear|fc)\.", "head.")])
AUTHORS_KEYS.register("preact-resnet18", "conv1, layer1-4.B (shortcut.0), bn, linear (the PreActResNet-18 of "
                                         "kuangliu/pytorch-cifar)")([
    (r"conv1\.", "body.0."), (r"layer(\d)\.(\d)\.shortcut\.0\.", lambda m: _block(1, [2] * 4)(m) + "shortcut."),
    (r"layer(\d)\.(\d)\.", _block(1, [2] * 4)), (r"bn\.", "body.9."), (r"(linear|fc)\.", "head.")])


AUTHORS_KEYS.register("resnet50", "conv1, bn1, layer1-4.B, fc (torchvision's ResNet-50, as Wong et al.'s ImageNet "
                                  "checkpoints save it)")([(r"fc\.", "head."), (r"", "body.")])


def _wide_resnet(depth: int) -> Rename:
    n = (depth - 4) // 6
    # the TRADES code's WideResNet (and MART's, copied from it) builds a sub_block1 its forward never calls, so a
    # state dict the authors saved holds its weights: dropped (RobustBench builds it, sub_block1=True, to load them)
    return [(r"sub_block1\.", None), (r"conv1\.", "body.0."),
            (r"block(\d)\.layer\.(\d+)\.convShortcut\.", lambda m: _block(1, [n] * 3)(m) + "shortcut."),
            (r"block(\d)\.layer\.(\d+)\.", _block(1, [n] * 3)), (r"bn1\.", f"body.{3 * n + 1}."), (r"fc\.", "head.")]


AUTHORS_KEYS.register("wrn-34-10", "conv1, block1-3.layer.i (convShortcut), bn1, fc (the WideResNet of the "
                                   "TRADES code)")(_wide_resnet(34))
AUTHORS_KEYS.register("wrn-28-10", "as wrn-34-10, 4 blocks per stage")(_wide_resnet(28))

# Benz et al.'s CIFAR architectures, as the code they follow names their layers
AUTHORS_KEYS.register("lenet", "conv1-2, fc1-3 (the LeNet of kuangliu/pytorch-cifar)")([
    (r"conv1\.", "body.0."), (r"conv2\.", "body.3."), (r"fc1\.", "body.7."), (r"fc2\.", "body.9."),
    (r"fc3\.", "head.")])
for _vgg in ("vgg16", "vgg19"):
    AUTHORS_KEYS.register(_vgg, "features.i, classifier (the VGG of kuangliu/pytorch-cifar)")([
        (r"features\.", "body."), (r"classifier\.", "head.")])
AUTHORS_KEYS.register("resnet50-cifar", "conv1, bn1, layer1-4.B, shortcut.0/1, linear (the CIFAR ResNet-50 of "
                                        "kuangliu/pytorch-cifar)")([
    (r"conv1\.", "body.0."), (r"bn1\.", "body.1."), (r"layer(\d)\.(\d)\.", _block(3, [3, 4, 6, 3])),
    (r"(linear|fc)\.", "head.")])
for _densenet in ("densenet121", "densenet169"):
    AUTHORS_KEYS.register(_densenet, "conv1, dense1-4, trans1-3, bn, linear (the DenseNet of "
                                     "kuangliu/pytorch-cifar)")([
        (r"conv1\.", "body.0."), (r"dense(\d)\.", lambda m: f"body.{2 * int(m[1]) - 1}."),
        (r"trans(\d)\.", lambda m: f"body.{2 * int(m[1])}."), (r"bn\.", "body.8."), (r"linear\.", "head.")])
AUTHORS_KEYS.register("googlenet", "pre_layers, a3-b5, linear (the GoogLeNet of kuangliu/pytorch-cifar)")([
    (r"pre_layers\.", "body."),
    *((rf"{block}\.", f"body.{i}.") for block, i in (("a3", 3), ("b3", 4), ("a4", 6), ("b4", 7), ("c4", 8),
                                                      ("d4", 9), ("e4", 10), ("a5", 12), ("b5", 13))),
    (r"linear\.", "head.")])
AUTHORS_KEYS.register("inception-v3", "Conv2d_1a_3x3-Conv2d_4a_3x3, Mixed_5b-7c, linear (the Inception-v3 of "
                                      "weiaicunzai/pytorch-cifar100)")([
    *((rf"{stem}\.{part}\.", f"body.{3 * i + j}.")
      for i, stem in enumerate(("Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "Conv2d_3b_1x1", "Conv2d_4a_3x3"))
      for j, part in enumerate(("conv", "bn"))),
    *((rf"Mixed_{block}\.", f"body.{15 + i}.")
      for i, block in enumerate(("5b", "5c", "5d", "6a", "6b", "6c", "6d", "6e", "7a", "7b", "7c"))),
    (r"linear\.", "head.")])


def load_weights_only(path: Path):
    """``torch.load(path, weights_only=True)`` on the CPU; a file that would need unpickling, or is no torch save,
    is a UserError (nothing is unpickled)."""
    try:
        return safe_load.weights_only(path)
    except UserError:
        raise
    except pickle.UnpicklingError:
        raise UserError(f"{path} is unsafe to load: it holds Python objects other than tensors, which could run "
                        "code; fastfair does not unpickle it. Save the model's state_dict() instead") from None
    except Exception as err:  # torch.load's errors on a file that is not a torch save vary by version and format
        raise UserError(f"{path} is not a file written by torch.save ({type(err).__name__}); pass a saved "
                        "state dict") from None


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a model file, unwrapped and without wrapper prefixes; nothing is unpickled."""
    if not path.is_file():
        raise UserError(f"no model file at {path}")
    obj = load_weights_only(path)
    # a state dict's values are tensors, so a dict under one of these names is always a wrapping
    while isinstance(obj, dict) and (inner := next((obj[k] for k in NESTED if isinstance(obj.get(k), dict)),
                                                   None)) is not None:
        obj = inner
    if not _is_state_dict(obj):
        raise UserError(f"{path} holds no state dict (a dict of tensors, also under {', '.join(NESTED)}); "
                        "save the model's state_dict()")
    state = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    stripped = True
    while stripped:
        stripped = False
        for prefix in WRAPPERS:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
                stripped = True
    return state


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and any(isinstance(v, torch.Tensor) for v in obj.values())


def split_normaliser(state: dict) -> tuple[dict, dict[str, list[float]] | None]:
    """(weights, {mean, std} of a normaliser inside the file or None). A normaliser is a buffer named mean/mu
    and std/sigma at the top or one level down (``normalize.mean``, or ``0.mean`` when the file is
    ``nn.Sequential(normaliser, network)``, whose ``1.`` prefix then goes too)."""
    found, rest = {}, {}
    for key, value in state.items():
        parts = key.split(".")
        kind = "mean" if parts[-1] in MEAN_NAMES else "std" if parts[-1] in STD_NAMES else None
        if kind and len(parts) <= 2:
            found[kind] = (parts[0] if len(parts) == 2 else "", value)
        else:
            rest[key] = value
    if set(found) != {"mean", "std"}:
        return state, None
    if found["mean"][0] == "0" and all(k.startswith("1.") for k in rest):
        rest = {k[2:]: v for k, v in rest.items()}
    return rest, {k: v.flatten().tolist() for k, (_, v) in found.items()}


def rename(state: dict, model: str, expected: set[str]) -> tuple[dict, str]:
    """(state with fastfair's key names, which naming the file used)."""
    if set(state) == expected or model not in AUTHORS_KEYS:
        return state, "fastfair"
    rules = [(re.compile(pattern), repl) for pattern, repl in AUTHORS_KEYS.get(model)]
    out = {}
    for key, value in state.items():
        for pattern, repl in rules:
            m = pattern.match(key)
            if m:
                key = None if repl is None else (repl(m) if callable(repl) else repl) + key[m.end():]
                break
        if key is not None:
            out[key] = value
    return out, f"authors' ({AUTHORS_KEYS.doc(model)})"


def normalisation(flag: str | None, in_file: dict | None, dataset_mean_std, channels: int) -> dict:
    """{source, mean, std}: the file's own normaliser, else what ``--normalize`` says."""
    if in_file:
        if flag is not None:
            shown = {k: [round(v, 4) for v in in_file[k]] for k in ("mean", "std")}
            raise UserError(f"the file holds its own normalisation (mean {shown['mean']}, std {shown['std']}); "
                            "leave out --normalize")
        return {"source": "the file", **in_file}
    if flag is None:
        raise UserError("say how the model expects its input: --normalize none (images in [0, 1], as the TRADES code "
                        "trains), dataset (the data set's mean and std), or MEAN/STD such as "
                        "0.4914,0.4822,0.4465/0.2471,0.2435,0.2616")
    if flag == "none":
        return {"source": "none", "mean": [0.0] * channels, "std": [1.0] * channels}
    if flag == "dataset":
        mean, std = dataset_mean_std()
        return {"source": "the data set", "mean": mean, "std": std}
    try:
        mean, std = ([float(v) for v in half.split(",")] for half in flag.split("/"))
    except ValueError:
        raise UserError(f"--normalize takes none, dataset or MEAN/STD (comma-separated numbers); "
                        f"got {flag!r}") from None
    if len(mean) == 1 and len(std) == 1:
        mean, std = mean * channels, std * channels
    if len(mean) != channels or len(std) != channels or min(std) <= 0:
        raise UserError(f"--normalize {flag}: give {channels} means and {channels} positive stds (or one of each)")
    return {"source": "--normalize", "mean": mean, "std": std}


def _refuse(path: Path, model: str, loaded: set[str], expected: set[str]) -> UserError:
    missing, unexpected = sorted(expected - loaded), sorted(loaded - expected)
    few = lambda keys: ", ".join(keys[:4]) + (f" and {len(keys) - 4} more" if len(keys) > 4 else "")
    known = ", ".join(AUTHORS_KEYS)
    return UserError(f"{path} does not fit --model {model}: missing {few(missing) or 'none'}; unexpected "
                     f"{few(unexpected) or 'none'}. Pass the architecture it was trained with; authors' key names "
                     f"are read for {known} (docs/evaluation-and-report.md, Any model)")


def load_foreign(path: Path, *, model: str, dataset: str, normalize: str | None, num_classes: int | None,
                 split: str, device: str, data_dir: str | None, batch_size: int | None,
                 per_class: int | None = None, eps: float | None = None, alpha: float | None = None):
    """(cfg, dev, model, bundle, (x, y) of split, the record of where the model came from); ``eps`` and ``alpha``
    (the PGD step) default to fastfair's evaluation defaults."""
    models.MODELS.get(model)  # an unknown name fails before the file or the data is read
    state, in_file = split_normaliser(read_state_dict(path))
    with torch.device("meta"):  # only the key names, which do not depend on classes or channels: no memory
        probe = models.build(model, num_classes=10, in_channels=3, mean=[0.0] * 3, std=[1.0] * 3)
    expected = {k for k in probe.state_dict() if k not in ("mean", "std")}
    state, naming = rename(state, model, expected)
    # files saved before PyTorch 0.4.1 have no BatchNorm step counters, which evaluation never reads
    state.update({k: torch.tensor(0) for k in expected - set(state) if k.endswith(".num_batches_tracked")})
    if set(state) != expected:
        raise _refuse(path, model, set(state), expected)
    # the registry models' first convolution and head give the width, channels and classes as trained (a
    # model registered with other names keeps its paper's width and takes the data set's channels and classes)
    first, head = state.get("body.0.weight"), state.get("head.weight")
    width, channels = (first.shape[0], first.shape[1]) if first is not None and first.dim() == 4 else (0, None)
    classes = head.shape[0] if head is not None else num_classes
    if num_classes is not None and num_classes != classes:
        raise UserError(f"--num-classes {num_classes}, but the model in {path} has {classes} outputs")
    # every mistake in --normalize shows before the data loads; only `dataset` needs the data
    early = channels is not None and not (normalize == "dataset" and not in_file)
    norm = normalisation(normalize, in_file, None, channels) if early else None
    cfg = config.resolve(None, {"method.name": "standard", "data.dataset": dataset, "data.data_dir": data_dir,
                                "model.name": model, "train.device": device, "data.eval_batch_size": batch_size,
                                "data.test_per_class": per_class,
                                **{f"eval.{k}": v for k, v in (("eps", eps), ("alpha", alpha)) if v is not None}})
    dev = build.device(cfg)
    bundle, splits = build.splits(cfg)
    classes, channels = classes or bundle.num_classes, channels or bundle.shape[0]
    if (classes, channels) != (bundle.num_classes, bundle.shape[0]):
        raise UserError(f"the model in {path} takes {channels}-channel images and has {classes} outputs; "
                        f"{dataset} has {bundle.shape[0]}-channel images and {bundle.num_classes} classes; "
                        "pass the data set it was trained on (--dataset)")
    norm = norm or normalisation(normalize, in_file, bundle.mean_std, channels)
    net = models.build(model, num_classes=classes, in_channels=channels, mean=norm["mean"], std=norm["std"],
                       width=width)
    try:
        net.load_state_dict({**state, "mean": net.mean, "std": net.std})
    except RuntimeError as err:
        detail = next((line.strip() for line in str(err).splitlines() if "size mismatch" in line), str(err))
        raise UserError(f"{path} does not fit --model {model}: {detail}; check --model") from None
    cl = build.channels_last(cfg, dev)
    net = net.to(dev, memory_format=torch.channels_last) if cl else net.to(dev)
    source = {"file": str(path), "sha256": file_sha256(path), "model": model, "width": width,
              "key_names": naming, "normalization": norm}
    return cfg, dev, net, bundle, splits[split], source


def evaluate_foreign(path: Path, *, model: str, dataset: str, normalize: str | None, num_classes: int | None,
                     attacks: list[str], split: str, data_dir: str | None, device: str, batch_size: int | None,
                     amp: bool, quiet: bool, aa_backend: str, seed: int | None, per_class: int | None = None,
                     substitute: str | None = None, eps=None, alpha: float | None = None,
                     run_dir: Path | None = None) -> dict:
    """``fastfair eval FILE --model ARCH``: the same per-class attacks, table and JSON as for a fastfair checkpoint;
    the JSON's ``source`` says which file (and its SHA-256), architecture and normalisation were used. It goes
    beside the file, or into ``run_dir/eval/`` (a reproduce row's)."""
    cfg, dev, net, bundle, data, source = load_foreign(
        path, model=model, dataset=dataset, normalize=normalize, num_classes=num_classes, split=split,
        device=device, data_dir=data_dir, batch_size=batch_size, per_class=per_class, alpha=alpha)
    if run_dir is not None:  # the JSON goes to RUN/eval/, the weights stay where they are
        path = Path(run_dir) / "checkpoints" / path.name
    return evaluate_loaded(path, net, cfg, dev, bundle, data, attacks=attacks, split=split, amp=amp, quiet=quiet,
                           aa_backend=aa_backend, seed=seed, record={"epoch": None, "source": source},
                           title=f"{path.name} ({model}, normalisation: {source['normalization']['source']})",
                           substitute=substitute, eps=eps)
