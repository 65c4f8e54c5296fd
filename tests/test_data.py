import torch

from fastfair import data
from helpers import cifar_subset_npz


def test_val_split_is_first_n_of_each_class():
    x = torch.arange(12, dtype=torch.uint8).view(12, 1, 1, 1)
    y = torch.tensor([0, 1, 0, 1, 0, 1, 2, 2, 2, 0, 1, 2])
    b = data.DataBundle("t", x, y, x[:2], y[:2], ["a", "b", "c"])
    sp = data.split(b, 2)
    assert sp["val"][0].flatten().tolist() == [0, 1, 2, 3, 6, 7]
    assert sp["train"][0].flatten().tolist() == [4, 5, 8, 9, 10, 11]


def test_a_quick_run_keeps_the_first_n_per_class_after_the_validation_split():
    x = torch.arange(12, dtype=torch.uint8).view(12, 1, 1, 1)
    y = torch.tensor([0, 1, 0, 1, 0, 1, 2, 2, 2, 0, 1, 2])
    b = data.DataBundle("t", x, y, x, y, ["a", "b", "c"])
    sp = data.split(b, 1, train_per_class=2, test_per_class=1)
    assert sp["val"][0].flatten().tolist() == [0, 1, 6]  # as in the full run
    assert sp["train"][0].flatten().tolist() == [2, 3, 4, 5, 7, 8]  # then two of each class, in file order
    assert sp["test"][0].flatten().tolist() == [0, 1, 6] and sp["test"][1].tolist() == [0, 1, 2]
    assert data.subset_note("t", 2, 1) == "quick run: trained on the first 2/class and tested on the first 1/class of t"
    assert data.subset_note("t", 0, 0) == ""


def test_crop_is_a_shift_of_the_zero_padded_image():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 255, (64, 3, 8, 8), dtype=torch.uint8, generator=g)
    out = data.random_crop_flip(x, 2, False, torch.Generator().manual_seed(3))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    offsets = set()
    for i in range(64):
        hits = [(dy, dx) for dy in range(5) for dx in range(5)
                if torch.equal(padded[i, :, dy:dy + 8, dx:dx + 8], out[i])]
        assert len(hits) == 1
        offsets.add(hits[0])
    assert len(offsets) > 12  # offsets spread over the 5x5 grid


def test_reflect_crop_is_torchvisions_reflection_padded_crop_with_the_same_draws():
    """data.crop_mode = "reflect" (CFA's RandomCrop(padding_mode='reflect')): the crop of the mirrored image at the
    offsets the zero-padded crop draws from the same generator."""
    from torchvision.transforms import functional as TF

    g = torch.Generator().manual_seed(0)
    x = torch.randint(1, 255, (64, 3, 8, 8), dtype=torch.uint8, generator=g)
    zeros = data.random_crop_flip(x, 2, False, torch.Generator().manual_seed(3))
    reflect = data.random_crop_flip(x, 2, False, torch.Generator().manual_seed(3), mode="reflect")
    padded, mirrored = torch.nn.functional.pad(x, (2, 2, 2, 2)), TF.pad(x, [2], padding_mode="reflect")
    for i in range(64):
        (dy, dx), = [(dy, dx) for dy in range(5) for dx in range(5)
                     if torch.equal(padded[i, :, dy:dy + 8, dx:dx + 8], zeros[i])]
        assert torch.equal(mirrored[i, :, dy:dy + 8, dx:dx + 8], reflect[i])


def test_flip_rate_is_about_half():
    x = torch.arange(4, dtype=torch.uint8).view(1, 1, 1, 4).repeat(2000, 1, 1, 1)
    out = data.random_crop_flip(x, 0, True, torch.Generator().manual_seed(0))
    flipped = (out[:, 0, 0, 0] == 3).float().mean().item()
    assert 0.45 < flipped < 0.55


def test_device_loader_drop_last_and_reseeding(tmp_path):
    b = data.load("npz", cifar_subset_npz(tmp_path, 130, 10))
    ld = data.DeviceLoader(b.x_train, b.y_train, 32, device="cpu", train=True, crop_padding=4, flip=True, seed=1)
    first = [yb.clone() for _, yb in ld]
    assert len(first) == 4 and all(len(yb) == 32 for yb in first)
    ld.set_epoch(0)
    again = [yb for _, yb in ld]
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    x, _ = next(iter(ld))
    assert x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    test = data.DeviceLoader(b.x_test, b.y_test, 4, device="cpu", train=False)
    assert len(test) == 3 and sum(len(yb) for _, yb in test) == 10


def test_digits_are_scikit_learns_load_digits_with_or_without_its_data_file(monkeypatch):
    """datasets._digits reads scikit-learn's digits.csv.gz without importing scikit-learn (a process's 2 CPU s):
    the same images and labels as load_digits, and load_digits itself where the file is not found."""
    import importlib.util

    import numpy as np
    from sklearn.datasets import load_digits

    from fastfair.data import datasets

    want = load_digits()
    for find in (importlib.util.find_spec, lambda name: None):  # the file read; then no package found: load_digits
        monkeypatch.setattr(importlib.util, "find_spec", find)
        images, target = datasets._digits()
        np.testing.assert_array_equal(images, want.images)
        np.testing.assert_array_equal(target, want.target)
