"""RobustBench's models by name (``fastfair eval rb:NAME``): its list, its architectures, its file layout, and the
averages its leaderboard reports, evaluated per class with fastfair's attacks.

The architecture comes from RobustBench's own model list (``robustbench.model_zoo``) and the weights from
``MODEL_DIR/<dataset>/<threat>/<NAME>.pt``, RobustBench's layout. A file not there yet is fetched through
RobustBench's own download function (gdown, from the Google Drive file its list names; :func:`fetch`), whose
module imports without setuptools' pkg_resources. fastfair reads the file itself with ``weights_only=True``
(RobustBench's loader would unpickle it) and then applies RobustBench's own unwrapping and loading functions.
RobustBench's models take images in [0, 1]; their normalisation is inside.
The reported numbers are not in the robustbench package: ``robustbench_reported.json`` holds them, taken
from the RobustBench repository's ``model_info/`` (its commit is recorded there; ``python -m
fastfair.evaluation.robustbench GIT_DIR`` refreshes it).
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import json
import subprocess
import sys
import types
import warnings
import zipfile
from functools import cache
from pathlib import Path

import torch

from fastfair import build, config
from fastfair.errors import UserError
from fastfair.evaluation.foreign import load_weights_only
from fastfair.evaluation.per_class import evaluate_loaded
from fastfair.rundir import file_sha256, replacing
from fastfair.suggest import hint

PREFIX = "rb:"
DEFAULT_DIR = "./models"  # RobustBench's own default model_dir
DATASETS = ("cifar10", "cifar100")  # the RobustBench data sets fastfair holds (fastfair datasets)
THREAT = "Linf"  # fastfair's attacks are L-inf
EPS = 8 / 255  # the radius of RobustBench's CIFAR-10 and CIFAR-100 Linf leaderboards
REPORTED = Path(__file__).with_name("robustbench_reported.json")
INSTALL = "pip install 'fastfair[robustbench]'"
DRIVE = "https://drive.google.com/uc?export=download&id={}"  # a Google Drive file by the ID RobustBench's list holds
TORCH_SAVE = (b"PK\x03\x04", b"\x80")  # how torch.save's files start: a zip archive (torch >= 1.6), or a pickle


def installed() -> bool:
    """Whether the robustbench distribution is installed. A ``robustbench`` folder alone is not it: torchattacks
    3.5 ships a few of its modules under that name (no model zoo, no loaders), without robustbench's metadata."""
    try:
        importlib.metadata.version("robustbench")
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("robustbench") is not None


def _import(module: str):
    """A robustbench submodule. Where robustbench's package __init__ cannot run (it imports its benchmark,
    which needs the git-only autoattack and setuptools' pkg_resources), the package is entered without it:
    fastfair needs only the model zoo and the loading helpers."""
    if "robustbench" not in sys.modules:
        if not installed():
            raise UserError(f"RobustBench models need the robustbench package: {INSTALL}")
        spec = importlib.util.find_spec("robustbench")
        try:
            with warnings.catch_warnings():  # its pkg_resources import warns on every command
                warnings.simplefilter("ignore")
                importlib.import_module("robustbench")
        except ImportError:
            shell = types.ModuleType("robustbench")
            shell.__spec__, shell.__path__ = spec, list(spec.submodule_search_locations)
            sys.modules["robustbench"] = shell
    return importlib.import_module(module)


def check_threat(dataset: str, threat: str) -> None:
    if dataset not in DATASETS:
        raise UserError(f"RobustBench models here are of {' or '.join(DATASETS)}; got --dataset {dataset}")
    if threat != THREAT:
        raise UserError(f"fastfair's attacks are L-inf: --threat {THREAT} (RobustBench's {threat} models are "
                        "measured in another threat model)")


def _zoo(dataset: str, threat: str) -> dict:
    check_threat(dataset, threat)
    zoo = _import("robustbench.model_zoo")
    enums = _import("robustbench.model_zoo.enums")
    return zoo.model_dicts[enums.BenchmarkDataset(dataset)][enums.ThreatModel(threat)]


def names(dataset: str = "cifar10", threat: str = THREAT) -> list[str]:
    """RobustBench's own model list for ``dataset`` and ``threat``, in its order."""
    return list(_zoo(dataset, threat))


@cache
def _reported_all() -> dict:
    return json.loads(REPORTED.read_text())


def reported(dataset: str = "cifar10", threat: str = THREAT) -> dict[str, dict]:
    """{name: {clean, autoattack (percent), architecture, venue, title, additional_data, eps}} as RobustBench's
    leaderboard reports them; a name the leaderboard has no entry for is absent."""
    return _reported_all()["models"].get(f"{dataset}/{threat}", {})


def model_file(name: str, dataset: str = "cifar10", threat: str = THREAT, model_dir: str | Path | None = None) -> Path:
    """``MODEL_DIR/<dataset>/<threat>/<name>.pt``, where RobustBench keeps (and downloads) a model's weights."""
    return Path(model_dir or DEFAULT_DIR) / dataset / threat / f"{name}.pt"


def entry(name: str, dataset: str, threat: str) -> dict:
    """RobustBench's entry for a single model (its constructor); an unknown name, an ensemble or a model whose
    weights are no RobustBench file is a UserError."""
    zoo = _zoo(dataset, threat)
    if name not in zoo:
        raise UserError(f"no RobustBench model {name!r} for {dataset} {threat}.{hint(name, zoo)} The names: "
                        f"fastfair zoo --dataset {dataset}")
    found = zoo[name]
    if isinstance(found["gdrive_id"], list):
        raise UserError(f"{name} is an ensemble of {len(found['gdrive_id'])} files; fastfair evaluates single models "
                        "from RobustBench")
    if found["gdrive_id"] is None:
        raise UserError(f"{name}'s weights come with timm's pretrained models, not as a RobustBench file; fastfair "
                        "evaluates RobustBench's file models (fastfair zoo lists them)")
    return found


def single_file(name: str, dataset: str, threat: str) -> bool:
    """Whether RobustBench's model ``name`` is one file of weights, the models fastfair evaluates."""
    return isinstance(_zoo(dataset, threat)[name]["gdrive_id"], str)


def place(name: str, dataset: str, threat: str, model_dir: str | Path | None) -> str:
    """How to put ``name``'s weights where fastfair reads them: ``fastfair zoo --fetch`` where a network is
    reachable (another machine's, the folder copied over), or the file downloaded by hand and saved there."""
    where = f" --model-dir {model_dir}" if model_dir else ""
    data = f" --dataset {dataset}" if dataset != "cifar10" else ""
    return (f"fetch them with `fastfair zoo --fetch --models {name}{data}{where}` where a network is reachable, or "
            f"download {DRIVE.format(entry(name, dataset, threat)['gdrive_id'])} (RobustBench's file of {name}) and "
            f"save it as {model_file(name, dataset, threat, model_dir).resolve()}")


def fetch(name: str, *, dataset: str = "cifar10", threat: str = THREAT, model_dir: str | Path | None = None,
          echo=print) -> Path:
    """``name``'s weights at :func:`model_file`, downloaded first where they are not there: through RobustBench's
    own ``download_gdrive_new`` (gdown) into a temporary file that replaces nothing until it is whole and starts
    as a torch.save file does (Google Drive answers a quota or sharing problem with a web page). RobustBench's
    list names each file by its Google Drive ID and holds no checksum of it, so none is checked here; the file's
    SHA-256 goes into every result (``source.sha256``). Offline, one error line says which file to put where."""
    spec = entry(name, dataset, threat)
    path = model_file(name, dataset, threat, model_dir)
    if path.is_file():
        return path
    url = DRIVE.format(spec["gdrive_id"])
    utils = _import("robustbench.utils")
    echo(f"fetching {name}'s weights from {url} to {path}")
    with replacing(path) as tmp:
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # its own line names the temporary file; gdown's
                utils.download_gdrive_new(spec["gdrive_id"], tmp)  # progress bar goes to stderr
        except Exception as err:  # requests' and gdown's errors: no network, no such file, Drive's refusal
            for left in tmp.parent.glob(f"{tmp.name}?*"):  # gdown's own temporary file beside its output
                left.unlink(missing_ok=True)
            why = " ".join(str(err).split())[:200]
            if type(err).__name__ == "ChunkedEncodingError":  # urllib3 >= 2 raises where a transfer is cut short
                raise UserError(f"the download of {url} ended early (the connection broke: {why}); run the same "
                                f"command again, or download it in a browser and save it as {path.resolve()}") from None
            raise UserError(f"could not fetch {name}'s weights ({type(err).__name__}: {why}); "
                            f"{place(name, dataset, threat, model_dir)}") from None
        with tmp.open("rb") as f:
            start = f.read(64)
        if not start.startswith(TORCH_SAVE):
            said = start.decode("utf-8", "replace").split("\n", 1)[0][:60]
            raise UserError(f"what came from {url} is not a torch.save file (it starts {said!r}: Google Drive's page "
                            f"when a file is over its download quota or not shared); download it in a browser and "
                            f"save it as {path.resolve()}")
        if start.startswith(TORCH_SAVE[0]) and not zipfile.is_zipfile(tmp):  # urllib3 < 2 takes a short read
            raise UserError(f"the download of {url} ended early ({tmp.stat().st_size:,} bytes, no zip directory at "
                            f"the end); run the same command again, or download it in a browser and save it as "
                            f"{path.resolve()}")
    return path


def load(name: str, *, dataset: str = "cifar10", threat: str = THREAT,
         model_dir: str | Path | None = None, echo=print) -> tuple[torch.nn.Module, dict]:
    """(RobustBench's model ``name`` with its weights, in eval mode on the CPU, inputs in [0, 1]; the record of
    where it came from: name, data set, threat, file and SHA-256, architecture, RobustBench's reported numbers).
    Weights not in ``model_dir`` yet are fetched first (:func:`fetch`)."""
    spec = entry(name, dataset, threat)
    path = fetch(name, dataset=dataset, threat=threat, model_dir=model_dir, echo=echo)
    checkpoint = load_weights_only(path)
    if "Kireev2021Effectiveness" in name or name == "Andriushchenko2020Understanding":
        checkpoint = checkpoint["last"]  # RobustBench's loader takes the last of these files' two models
    state = checkpoint.get("state_dict", checkpoint) if isinstance(checkpoint, dict) else checkpoint
    if not isinstance(state, dict):
        raise UserError(f"{path} holds no state dict")
    utils = _import("robustbench.utils")
    enums = _import("robustbench.model_zoo.enums")
    for wrapper in ("module.", "model."):  # DataParallel and wrapper prefixes, as RobustBench strips them
        state = utils.rm_substr_from_state_dict(state, wrapper)
    model = spec["model"]()
    try:
        model = utils._safe_load_state_dict(model, name, state, enums.BenchmarkDataset(dataset))
    except RuntimeError as err:
        detail = " ".join(str(err).split())[:300]
        raise UserError(f"{path} does not fit RobustBench's {name} ({detail})") from None
    info = reported(dataset, threat).get(name)
    source = {"robustbench": name, "dataset": dataset, "threat": threat, "file": str(path), "sha256": file_sha256(path),
              "architecture": info["architecture"] if info else type(model).__name__,
              "reported": {"clean": info["clean"], "autoattack": info["autoattack"]} if info else None,
              "robustbench_version": importlib.metadata.version("robustbench")}
    return model.eval(), source


def reported_line(source: dict, results: dict) -> str:
    """RobustBench's reported averages beside ours, one line under the table."""
    rep = source.get("reported")
    ours = ", ".join(f"{a} {r['summary']['overall']:.2f}" for a, r in results.items() if a in ("clean", "aa"))
    theirs = f"clean {rep['clean']:.2f}, AutoAttack {rep['autoattack']:.2f}" if rep else "no reported numbers"
    return (f"RobustBench reports {theirs} (share of its full test set correct); here, as a share of these images: "
            f"{ours or 'no clean or aa run'}")


def evaluate_robustbench(name: str, *, dataset: str, threat: str, model_dir: str | None, attacks: list[str],
                         split: str, data_dir: str | None, device: str, batch_size: int | None, amp: bool,
                         quiet: bool, aa_backend: str, seed: int | None, per_class: int | None = None,
                         substitute: str | None = None, eps=None, alpha: float | None = None,
                         run_dir: Path | None = None) -> dict:
    """``fastfair eval rb:NAME``: the per-class attacks, table and JSON of any model file, the JSON beside the
    weights (``MODEL_DIR/<dataset>/<threat>/eval/``; in ``run_dir/eval/`` where given: a reproduce row's), its
    ``source`` naming the model and RobustBench's numbers. ``eps`` (one radius or one per class) defaults to the
    leaderboard's 8/255 and ``alpha`` (the PGD step) to fastfair's default for it."""
    check_threat(dataset, threat)
    entry(name, dataset, threat)  # an unknown name fails before the data loads
    # the data: the data set's folder, or its images in an .npz file (fastfair's npz data set)
    data = "npz" if data_dir and str(data_dir).endswith(".npz") else dataset
    cfg = config.resolve(None, {"method.name": "standard", "data.dataset": data, "data.data_dir": data_dir,
                                "train.device": device, "data.eval_batch_size": batch_size,
                                "data.test_per_class": per_class, "eval.eps": EPS,
                                **({"eval.alpha": alpha} if alpha is not None else {})})
    dev = build.device(cfg)
    bundle, splits = build.splits(cfg)  # the data before the weights, which may be fetched first: a long wait
    net, source = load(name, dataset=dataset, threat=threat, model_dir=model_dir)
    with torch.no_grad():
        outputs = net(torch.zeros(1, *bundle.shape)).shape[1]
    if outputs != bundle.num_classes:
        raise UserError(f"{name} has {outputs} outputs and {dataset} has {bundle.num_classes} classes; pass the data "
                        "it was trained on (--dataset, --data-dir)")
    cl = build.channels_last(cfg, dev)
    net = net.to(dev, memory_format=torch.channels_last) if cl else net.to(dev)
    path = model_file(name, dataset, threat, model_dir) if run_dir is None else \
        Path(run_dir) / "checkpoints" / f"{name}.pt"  # the JSON goes to RUN/eval/, the weights stay where they are
    record = evaluate_loaded(path, net, cfg, dev, bundle, splits[split],
                             attacks=attacks, split=split, amp=amp, quiet=quiet, aa_backend=aa_backend, seed=seed,
                             record={"epoch": None, "source": source},
                             title=f"{name} (RobustBench, {dataset} {threat})", substitute=substitute, eps=eps)
    if not quiet:
        print(reported_line(source, record["results"]))
    return record


def refresh(git_dir: str) -> None:
    """Rewrite :data:`REPORTED` from a RobustBench git repository's ``model_info/`` (its HEAD)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", git_dir, *args], check=True, capture_output=True, text=True).stdout

    models: dict[str, dict] = {}
    for path in git("ls-tree", "-r", "--name-only", "HEAD", "model_info").split():
        parts = path.split("/")  # model_info/<dataset>/<threat>/<name>.json
        if len(parts) != 4 or parts[1] not in DATASETS or parts[2] not in ("Linf", "L2"):
            continue
        info = json.loads(git("show", f"HEAD:{path}"))
        models.setdefault(f"{parts[1]}/{parts[2]}", {})[parts[3][:-5]] = {
            "clean": float(info["clean_acc"]), "autoattack": float(info["autoattack_acc"]),
            "architecture": info.get("architecture", ""), "venue": info.get("venue", ""),
            "title": info.get("name", ""), "additional_data": bool(info.get("additional_data", False)),
            "eps": info.get("eps", "")}
    out = {"source": f"RobustBench/robustbench model_info/ at {git('rev-parse', 'HEAD').strip()}",
           "models": {k: dict(sorted(v.items())) for k, v in sorted(models.items())}}
    REPORTED.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    refresh(sys.argv[1])
