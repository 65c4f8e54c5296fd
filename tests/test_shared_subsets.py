"""``fastfair data subset``: the real-data subsets the tests read, made from the official data sets. The official
files are not here (torchvision checks their MD5 sums, so they cannot be made up): a data set of the official
size stands in, loaded where torchvision's would be, and the command must take the project's positions from it;
where the project's own files are here, one made from them in those positions must come out equal to them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import fastfair.data
from fastfair import cli
from fastfair.data.datasets import DataBundle
from helpers import real_data

OFFICIAL = {"cifar10": ((50_000, 3, 32, 32), 10_000), "mnist": ((60_000, 1, 28, 28), 10_000)}


def official(dataset: str, monkeypatch, fill=None) -> DataBundle:
    """A stand-in of ``dataset``'s official training and test sets, loaded as ``fastfair.data.load`` would load
    them; each image's first two pixels hold its position (``fill`` places other images)."""
    shape, n_test = OFFICIAL[dataset]
    sets = {}
    for split, n in (("train", shape[0]), ("test", n_test)):
        x = np.zeros((n, *shape[1:]), dtype=np.uint8)
        x.reshape(n, -1)[:, 0], x.reshape(n, -1)[:, 1] = np.arange(n) // 256, np.arange(n) % 256
        sets[split] = [x, np.arange(n) % 10]
    if fill:
        fill(sets)
    bundle = DataBundle(dataset, *(torch.from_numpy(a) for s in ("train", "test") for a in sets[s]),
                        [str(c) for c in range(10)])
    monkeypatch.setattr(fastfair.data, "load", lambda name, data_dir=None: bundle if name == dataset else None)
    return bundle


def positions(x: np.ndarray) -> np.ndarray:
    flat = x.reshape(len(x), -1).astype(np.int64)
    return flat[:, 0] * 256 + flat[:, 1]


@pytest.mark.parametrize("dataset, train, test, shape", [
    ("cifar10", np.concatenate([np.arange(b * 10_000, b * 10_000 + 1017) for b in range(5)]), np.arange(1017),
     (3, 32, 32)),
    ("mnist", np.arange(17_435), np.arange(10_000), (28, 28)),
])
def test_the_subset_takes_the_project_s_positions(dataset, train, test, shape, monkeypatch, tmp_path, capsys):
    official(dataset, monkeypatch)
    out = tmp_path / f"{dataset}-subset.npz"
    assert cli.main(["data", "subset", dataset, "--out", str(out)]) == 0
    assert f"written: {out}" in capsys.readouterr().out
    with np.load(out) as f:
        assert sorted(f.files) == ["x_test", "x_train", "y_test", "y_train"]
        assert f["x_train"].shape[1:] == shape and f["x_train"].dtype == np.uint8 and f["y_train"].dtype == np.int64
        assert np.array_equal(positions(f["x_train"]), train) and np.array_equal(positions(f["x_test"]), test)
        assert np.array_equal(f["y_train"], train % 10) and np.array_equal(f["y_test"], test % 10)


@pytest.mark.parametrize("dataset", ["cifar10", "mnist"])
def test_made_from_the_official_order_it_is_the_project_s_file(dataset, monkeypatch, tmp_path):
    """The project's file, its images put where the official set holds them (the rest made up), comes back equal."""
    with np.load(real_data(f"{dataset}-subset.npz")) as f:
        want = {k: f[k] for k in f.files}
    train, test = (np.concatenate([np.arange(b * 10_000, b * 10_000 + 1017) for b in range(5)]), np.arange(1017)) \
        if dataset == "cifar10" else (np.arange(17_435), np.arange(10_000))

    def fill(sets):
        for split, where in (("train", train), ("test", test)):
            x = want[f"x_{split}"]
            sets[split][0][where] = x if x.ndim == 4 else x[:, None]
            sets[split][1][where] = want[f"y_{split}"]

    official(dataset, monkeypatch, fill)
    out = tmp_path / f"{dataset}-subset.npz"
    assert cli.main(["data", "subset", dataset, "--out", str(out)]) == 0
    with np.load(out) as f:
        assert {k: (f[k].shape, f[k].dtype) for k in f.files} == {k: (v.shape, v.dtype) for k, v in want.items()}
        for k, v in want.items():
            assert np.array_equal(f[k], v), k


@pytest.mark.parametrize("argv, says", [
    (["svhn"], "unknown data set with a test subset 'svhn'"),
    (["cifar10", "--out", "x.txt"], "the subset is written as an .npz"),
])
def test_mistakes_are_one_line(argv, says, tmp_path, capsys):
    assert cli.main(["data", "subset", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and says in err and err.count("\n") == 1


def test_reproduce_with_a_missing_subset_file_says_how_to_make_it(tmp_path):
    from fastfair.errors import UserError
    from fastfair.reproduce.command import reproduce

    missing = tmp_path / "cifar10-subset.npz"
    with pytest.raises(UserError, match=f"--data-dir {missing} does not exist; make it from the official cifar10 files "
                                        f"with `fastfair data subset cifar10 --data-dir FOLDER --out {missing}`"):
        reproduce("me-t3", scale="subset", data_dir=str(missing), out=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()
