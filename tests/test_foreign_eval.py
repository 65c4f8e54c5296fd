"""``fastfair eval FILE --model ARCH`` on a model file fastfair did not write: a fastfair model saved the way
the authors' repositories save theirs (their layer names, DataParallel's prefix, nested dicts, the
normaliser outside or inside) gives exactly the per-class results of the fastfair checkpoint."""
from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

from fastfair import cli
from helpers import cifar_subset_npz

ATTACKS = "clean,pgd2"


def as_authors_preact(state: dict) -> dict:
    """A fastfair preact-resnet18 state dict under the names of kuangliu/pytorch-cifar's PreActResNet-18
    (conv1, layerS.B, shortcut.0, bn, linear): written here from that layout, independently of fastfair's
    own renaming."""
    out = {}
    for key, value in state.items():
        m = re.match(r"body\.(\d+)\.(.*)", key)
        if key.startswith("head."):
            key = "linear." + key[5:]
        elif m and m[1] == "0":
            key = "conv1." + m[2]
        elif m and m[1] == "9":
            key = "bn." + m[2]
        elif m:
            block = int(m[1]) - 1
            rest = "shortcut.0." + m[2][len("shortcut."):] if m[2].startswith("shortcut.") else m[2]
            key = f"layer{block // 2 + 1}.{block % 2}.{rest}"
        out[key] = value
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(npz, run) of one short preact-resnet18 run on real CIFAR-10 images, evaluated by fastfair."""
    tmp = tmp_path_factory.mktemp("foreign")
    npz = cifar_subset_npz(tmp, n_train=700, n_test=60)
    run = tmp / "run"
    # fastfair trains this net's narrow 1x1 shortcuts without oneDNN (train.onednn=auto, fastfair/cpu.py), whose weight
    # gradient hung for more than 15 minutes or crashed the process on an AVX2-only CPU (tests/test_cpu_defaults.py)
    assert cli.main(["train", "--method", "pgd-at", "--dataset", "npz", "--data-dir", str(npz), "--model",
                     "preact-resnet18", "--epochs", "1", "--out", str(run), "--quiet", "--set", "model.width=4",
                     "--set", "data.val_per_class=5", "--set", "data.batch_size=50", "--set", "attack.steps=1",
                     "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean']"]) == 0
    assert cli.main(["eval", str(run), "--checkpoint", "last", "--attacks", ATTACKS, "--quiet"]) == 0
    return npz, run


def _per_class(result_file) -> dict:
    """Per-class accuracies and confusion of every attack, and the fingerprint of the weights (every tensor
    of the model as loaded, normaliser included), the data and the settings."""
    record = json.loads(result_file.read_text())
    return {"fingerprint": record["fingerprint"], **{name: (record["results"][name]["per_class"],
                                                            record["results"][name]["confusion"])
                                                     for name in ATTACKS.split(",")}}


def _eval(path, npz, *extra) -> int:
    return cli.main(["eval", str(path), "--model", "preact-resnet18", "--dataset", "npz", "--data-dir", str(npz),
                     "--attacks", ATTACKS, "--quiet", *extra])


def test_an_authors_checkpoint_gives_the_fastfair_checkpoints_per_class_results(trained, tmp_path):
    npz, run = trained
    ck = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    expected = _per_class(run / "eval" / "last-test.json")
    state = {k: v for k, v in ck["model"].items() if k not in ("mean", "std")}
    # normaliser outside the model (the user says which), DataParallel prefix, nested under "state_dict"
    outside = tmp_path / "outside" / "model_best.pth"
    outside.parent.mkdir()
    torch.save({"epoch": 99, "state_dict": {f"module.{k}": v for k, v in as_authors_preact(state).items()}}, outside)
    mean, std = (",".join(str(v) for v in ck["spec"][k]) for k in ("mean", "std"))
    assert _eval(outside, npz, "--normalize", f"{mean}/{std}") == 0
    result = outside.parent / "eval" / "model_best-test.json"
    assert _per_class(result) == expected
    source = json.loads(result.read_text())["source"]
    assert source["sha256"] == hashlib.sha256(outside.read_bytes()).hexdigest()
    assert source["model"] == "preact-resnet18" and source["normalization"]["source"] == "--normalize"
    assert source["key_names"].startswith("authors'") and source["file"] == str(outside)
    # normaliser inside, as nn.Sequential(normaliser, network) saves it, nested under "net", in torch.save's
    # format before PyTorch 1.6
    inside = tmp_path / "inside.pt"
    torch.save({"net": {"0.mean": ck["model"]["mean"], "0.std": ck["model"]["std"],
                        **{f"1.{k}": v for k, v in as_authors_preact(state).items()}}}, inside,
               _use_new_zipfile_serialization=False)
    assert _eval(inside, npz) == 0
    assert _per_class(tmp_path / "eval" / "inside-test.json") == expected
    # saved before PyTorch 0.4.1 counted BatchNorm steps: the same results (the counters never enter them)
    old = tmp_path / "old.pt"
    torch.save({k: v for k, v in ck["model"].items() if not k.endswith("num_batches_tracked")}, old)
    assert _eval(old, npz) == 0
    without_counters = _per_class(tmp_path / "eval" / "old-test.json")
    assert without_counters.pop("fingerprint")["weights"] != expected["fingerprint"]["weights"]
    assert without_counters == {k: v for k, v in expected.items() if k != "fingerprint"}


def _one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    return err[0]


def test_a_file_that_does_not_fit_is_one_line_naming_the_keys(trained, tmp_path, capsys):
    npz, run = trained
    state = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    bad = tmp_path / "bad.pt"
    torch.save({k.replace("body.9.", "final_bn."): v for k, v in state.items()}, bad)
    assert _eval(bad, npz) == 2
    line = _one_error(capsys)
    assert "does not fit --model preact-resnet18" in line and "missing body.9.bias" in line
    assert "unexpected final_bn.bias" in line
    no_norm = tmp_path / "no_norm.pt"
    torch.save({k: v for k, v in state.items() if k not in ("mean", "std")}, no_norm)
    # refused before the data loads: no CIFAR-10 is needed to learn that --normalize is missing
    assert cli.main(["eval", str(no_norm), "--model", "preact-resnet18", "--data-dir", str(tmp_path / "none")]) == 2
    assert "--normalize none" in _one_error(capsys)
    assert _eval(run / "checkpoints" / "last.pt", npz, "--normalize", "dataset") == 2  # it has its own
    assert "holds its own normalisation" in _one_error(capsys)
    assert _eval(no_norm, npz, "--normalize", "0.5,0.5/0.2") == 2
    assert "give 3 means and 3 positive stds" in _one_error(capsys)
    assert cli.main(["eval", str(no_norm), "--dataset", "npz"]) == 2  # --dataset without --model
    assert "add --model ARCH" in _one_error(capsys)
    assert not (tmp_path / "eval").exists()


def _bn(prefix: str, c: int) -> dict:
    return {f"{prefix}.{n}": (c,) for n in ("weight", "bias", "running_mean", "running_var")} | {
        f"{prefix}.num_batches_tracked": ()}


def authors_resnet18() -> dict:
    """Key -> shape of kuangliu/pytorch-cifar's ResNet-18 for CIFAR-10, from its layout."""
    keys = {"conv1.weight": (64, 3, 3, 3), **_bn("bn1", 64), "linear.weight": (10, 512), "linear.bias": (10,)}
    cin = 64
    for stage, c in enumerate((64, 128, 256, 512), 1):
        for b in range(2):
            p = f"layer{stage}.{b}"
            keys |= {f"{p}.conv1.weight": (c, cin, 3, 3), **_bn(f"{p}.bn1", c), f"{p}.conv2.weight": (c, c, 3, 3),
                     **_bn(f"{p}.bn2", c)}
            if cin != c:
                keys |= {f"{p}.shortcut.0.weight": (c, cin, 1, 1), **_bn(f"{p}.shortcut.1", c)}
            cin = c
    return keys


def _wrn_stage(prefix: str, cin: int, c: int) -> dict:
    keys = {}
    for i in range(5):
        p = f"{prefix}.layer.{i}"
        keys |= {**_bn(f"{p}.bn1", cin), f"{p}.conv1.weight": (c, cin, 3, 3), **_bn(f"{p}.bn2", c),
                 f"{p}.conv2.weight": (c, c, 3, 3)}
        if cin != c:
            keys |= {f"{p}.convShortcut.weight": (c, cin, 1, 1)}
        cin = c
    return keys


def authors_wrn34_10() -> dict:
    """Key -> shape of the TRADES code's WideResNet-34-10, from its layout (5 blocks per stage), with the sub_block1
    its __init__ builds beside block1 and its forward never calls (MART's copy has it too)."""
    return {"conv1.weight": (16, 3, 3, 3), **_bn("bn1", 640), "fc.weight": (10, 640), "fc.bias": (10,),
            **_wrn_stage("block1", 16, 160), **_wrn_stage("block2", 160, 320), **_wrn_stage("block3", 320, 640),
            **_wrn_stage("sub_block1", 16, 160)}


@pytest.mark.parametrize("model, authors", [("resnet18", authors_resnet18), ("wrn-34-10", authors_wrn34_10)])
def test_authors_layer_names_map_onto_the_registry_model_shape_for_shape(model, authors):
    from fastfair import models
    from fastfair.evaluation import foreign

    with torch.device("meta"):
        ours = {k: tuple(v.shape) for k, v in models.build(model, num_classes=10, in_channels=3, mean=[0.0] * 3,
                                                          std=[1.0] * 3).state_dict().items()
                if k not in ("mean", "std")}
    theirs = authors()
    renamed, naming = foreign.rename({k: torch.empty(s, device="meta") for k, s in theirs.items()}, model, set(ours))
    assert naming.startswith("authors'")
    assert {k: tuple(v.shape) for k, v in renamed.items()} == ours
