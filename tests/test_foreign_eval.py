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


def as_cfa_preact(state: dict) -> dict:
    """A fastfair preact-resnet18 state dict under the CFA code's names (conv1, layerS.B, shortcut.0, bn,
    linear): written here from the layout of that code, independently of fastfair's own renaming."""
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
    torch.save({"epoch": 99, "state_dict": {f"module.{k}": v for k, v in as_cfa_preact(state).items()}}, outside)
    mean, std = (",".join(str(v) for v in ck["spec"][k]) for k in ("mean", "std"))
    assert _eval(outside, npz, "--normalize", f"{mean}/{std}") == 0
    result = outside.parent / "eval" / "model_best-test.json"
    assert _per_class(result) == expected
    source = json.loads(result.read_text())["source"]
    assert source["sha256"] == hashlib.sha256(outside.read_bytes()).hexdigest()
    assert source["model"] == "preact-resnet18" and source["normalization"]["source"] == "--normalize"
    assert source["key_names"].startswith("authors'") and source["file"] == str(outside)
    # normaliser inside, as nn.Sequential(normaliser, network) saves it, nested under "net"
    inside = tmp_path / "inside.pt"
    torch.save({"net": {"0.mean": ck["model"]["mean"], "0.std": ck["model"]["std"],
                        **{f"1.{k}": v for k, v in as_cfa_preact(state).items()}}}, inside)
    assert _eval(inside, npz) == 0
    assert _per_class(tmp_path / "eval" / "inside-test.json") == expected


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
    assert _eval(no_norm, npz) == 2
    assert "--normalize none" in _one_error(capsys)
    assert _eval(no_norm, npz, "--normalize", "0.5,0.5/0.2") == 2
    assert "give 3 means and 3 positive stds" in _one_error(capsys)
    assert cli.main(["eval", str(no_norm), "--dataset", "npz"]) == 2  # --dataset without --model
    assert "add --model ARCH" in _one_error(capsys)
    assert not (tmp_path / "eval").exists()
