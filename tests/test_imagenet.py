"""ImageNet streamed from its folder (fastfair/data/folder.py), ResNet-50, and a CLI run on a generated ImageFolder."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from test_cli import fastfair

from fastfair import build, config, data, models
from fastfair.data.folder import MEAN, STD, resized_crop_box
from fastfair.errors import UserError

CLASSES = ["n01440764", "n01443537", "n01484850"]


def image_folder(root, train=7, val=3, classes=CLASSES):
    """DIR/train/<wnid>/*.JPEG and DIR/val/<wnid>/*.JPEG of random sizes, each class its own mean colour."""
    rng = np.random.default_rng(0)
    for split, n in (("train", train), ("val", val)):
        for c, wnid in enumerate(classes):
            (root / split / wnid).mkdir(parents=True)
            for i in range(n):
                h, w = rng.integers(40, 80, 2)
                pixels = np.clip(rng.normal(60 + 70 * c, 30, (h, w, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(root / split / wnid / f"{wnid}_{i}.JPEG")
    return root


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return image_folder(tmp_path_factory.mktemp("imagenet"))


def loader(folder, split, *, train, seed=0, workers=0, size=32, batch_size=4):
    x, y = split
    return data.LOADERS.get("folder")("x", x, y, batch_size, device="cpu", train=train, flip=True, seed=seed,
                                      data_dir=str(folder), image_size=size, workers=workers)


def test_the_folder_loads_as_file_indices_with_imagefolders_classes_and_labels(folder):
    b = data.load("imagenet", folder)
    assert b.classes == CLASSES and b.num_classes == 3
    assert b.y_train.tolist() == [0] * 7 + [1] * 7 + [2] * 7 and b.y_test.tolist() == [0] * 3 + [1] * 3 + [2] * 3
    assert b.x_train.dtype == torch.int64 and b.x_test.tolist() == list(range(21, 30))
    assert b.mean_std() == (MEAN, STD) and b.shape[0] == 3
    sp = data.split(b, val_per_class=2)  # CFA's rule over indices: the first two files of each class
    assert sp["val"][0].tolist() == [0, 1, 7, 8, 14, 15] and len(sp["train"][1]) == 15


def test_batches_are_crops_in_0_1_with_their_labels_and_repeat_with_the_seed_whatever_the_workers(folder):
    b = data.load("imagenet", folder)
    first = list(loader(folder, (b.x_train, b.y_train), train=True, seed=3))
    assert len(first) == 5 and all(x.shape == (4, 3, 32, 32) and x.dtype == torch.float32 for x, _ in first)
    assert all(0 <= x.min() and x.max() <= 1 for x, _ in first)
    # each class's images keep their label: class c's colour is brightest for the largest c
    x, y = torch.cat([x for x, _ in first]), torch.cat([y for _, y in first])
    means = [x[y == c].mean() for c in range(3)]
    assert means[0] < means[1] < means[2]
    again = list(loader(folder, (b.x_train, b.y_train), train=True, seed=3, workers=2))
    assert all(torch.equal(a, c) and torch.equal(ya, yc) for (a, ya), (c, yc) in zip(first, again))
    other = torch.cat([x for x, _ in loader(folder, (b.x_train, b.y_train), train=True, seed=4)])
    assert not torch.equal(other, x)
    epochs = loader(folder, (b.x_train, b.y_train), train=True, seed=3)
    epochs.set_epoch(1)
    assert not torch.equal(torch.cat([x for x, _ in epochs]), x)  # each epoch its own order and crops


def test_test_batches_are_centre_crops_in_file_order_keeping_the_last_partial_batch(folder):
    b = data.load("imagenet", folder)
    batches = list(loader(folder, (b.x_test, b.y_test), train=False, size=24))
    assert [len(y) for _, y in batches] == [4, 4, 1]
    assert torch.cat([y for _, y in batches]).tolist() == b.y_test.tolist()
    assert batches[0][0].shape == (4, 3, 24, 24)
    assert all(torch.equal(a[0], c[0]) for a, c in zip(batches, loader(folder, (b.x_test, b.y_test), train=False,
                                                                      size=24)))


def test_each_resolution_phase_trains_on_its_own_crop_and_batch_size_and_evaluation_keeps_image_size(folder):
    b = data.load("imagenet", folder)
    phases = [(0, 24, 4), (2, 40, 6)]
    train = data.LOADERS.get("folder")("train", b.x_train, b.y_train, 99, device="cpu", train=True, flip=True,
                                       data_dir=str(folder), image_size=32, phases=phases)
    test = data.LOADERS.get("folder")("test", b.x_test, b.y_test, 9, device="cpu", train=False,
                                      data_dir=str(folder), image_size=32, phases=phases)
    for epoch, (size, batch) in ((0, (24, 4)), (1, (24, 4)), (2, (40, 6)), (5, (40, 6))):
        train.set_epoch(epoch)
        test.set_epoch(epoch)
        assert len(train) == 21 // batch and {tuple(x.shape) for x, _ in train} == {(batch, 3, size, size)}
        assert [tuple(x.shape) for x, _ in test] == [(9, 3, 32, 32)]


def test_random_resized_crops_stay_in_the_image_within_the_area_and_aspect_ranges():
    import random

    rng = random.Random(0)
    for width, height in ((500, 375), (64, 40), (40, 300)):
        for _ in range(200):
            top, left, h, w = resized_crop_box(width, height, rng)
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width and h > 0 and w > 0


def test_resnet50_takes_images_in_0_1_and_gives_2048_features_and_the_logits():
    m = models.build("resnet50", num_classes=5, in_channels=3, mean=MEAN, std=STD).eval()
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        assert m.forward_features(x).shape == (2, 2048) and m(x).shape == (2, 5)
    assert m.head.weight.shape == (5, 2048)
    assert 25.5e6 < sum(p.numel() for p in m.parameters()) - 5 * 2049 + 1000 * 2049 < 25.6e6  # He et al.'s 25.6M


def test_the_fgsm_rs_preset_trains_from_the_cli_on_its_phases_and_schedule_and_evaluates_per_class(folder, tmp_path):
    # the file, not the name: a subprocess's fastfair.presets is the installed checkout's (tests/conftest.py)
    preset = Path(__file__).parents[1] / "configs" / "tian-kdd-t5-imagenet-fgsm-rs.toml"
    done = fastfair("train", "--config", str(preset), "--data-dir", str(folder), "--epochs", "2", "--quiet",
                    "--out", str(tmp_path / "run"), "--set", "model.name=tiny-cnn", "--set", "model.width=4",
                    "--set", "data.image_size=32", "--set", "data.val_per_class=2", "--set", "data.workers=0",
                    "--set", "train.lr_epochs=[0, 1, 2]", "--set", "train.lr_values=[0, 0.3, 0.03]",
                    "--set", "data.phase_epochs=[0, 1]", "--set", "data.phase_image_sizes=[24, 32]",
                    "--set", "data.phase_batch_sizes=[5, 3]",
                    "--set", "train.select_epoch=2")  # the preset's 14th-epoch model lies past the 2 epochs here
    assert done.returncode == 0, done.stderr
    # 21 training images (train.select_split = test: none held out): 4 steps in epoch 1 (whole batches of 5), 7 in
    # epoch 2 (of 3); each line has its first step's rate
    lrs = [json.loads(line)["lr"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([0.3 / 4, 0.3 - 0.27 / 7])
    result = json.loads((tmp_path / "run" / "eval" / "epoch-test.json").read_text())  # train.select = epoch
    assert result["classes"] == CLASSES and result["images"] == 9
    assert {k: len(v["per_class"]) for k, v in result["results"].items()} == {"clean": 3, "pgd50": 3}
    assert result["eps"] == 0.007 and result["alpha"] == 0.003
    again = fastfair("eval", str(tmp_path / "run"), "--attacks", "clean", "--per-class", "2")
    assert again.returncode == 0, again.stderr
    written = [json.loads(p.read_text()) for p in (tmp_path / "run" / "eval").glob("*.json")]
    assert sorted(r["images"] for r in written) == [6, 9]  # and the first two val images of each class


def test_a_torchvision_resnet50_checkpoint_as_wong_et_al_save_it_evaluates_as_the_same_network(tmp_path):
    from torchvision.models import resnet50

    from fastfair.evaluation import foreign

    torch.manual_seed(0)
    theirs = resnet50(num_classes=3).eval()
    # main_fast.py's save_checkpoint: the DataParallel model's state dict beside the epoch, arch and optimiser
    weights = {f"module.{k}": v for k, v in theirs.state_dict().items()}
    torch.save({"epoch": 15, "arch": "resnet50", "state_dict": weights, "best_prec1": 0.0},
               tmp_path / "checkpoint_epoch15.pth.tar")
    folder = image_folder(tmp_path / "imagenet", train=11, val=1)  # above imagenet's 10 validation images a class
    *_, ours, _, _, source = foreign.load_foreign(
        tmp_path / "checkpoint_epoch15.pth.tar", model="resnet50", dataset="imagenet", normalize="dataset",
        num_classes=None, split="test", device="cpu", data_dir=str(folder), batch_size=None)
    x = torch.rand(2, 3, 64, 64)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    with torch.no_grad():  # Wong et al. normalise outside the network with ImageNet's mean and std
        assert torch.allclose(ours.eval()(x), theirs((x - mean) / std), atol=1e-5)
    assert source["key_names"].startswith("authors'")


@pytest.mark.parametrize("make, said", [
    (lambda root: None, "is not a folder"),
    (lambda root: (image_folder(root), shutil.rmtree(root / "val")), "val is not a folder"),
    (lambda root: (image_folder(root), (root / "train" / "n09999999").mkdir()), "n09999999 holds no images"),
    (lambda root: (image_folder(root), (root / "val" / "x.JPEG").write_bytes(b"")), "valprep.sh"),
    (lambda root: image_folder(root, classes=["a", "b"]) and (root / "val" / "b").rename(root / "val" / "c"),
     "same class folders"),
])
def test_a_missing_or_malformed_folder_is_one_error_naming_the_layout(tmp_path, make, said):
    root = tmp_path / "imagenet"
    make(root)
    with pytest.raises(UserError, match=said) as err:
        data.load("imagenet", root)
    assert "--data-dir" in str(err.value) or "train/<wnid>" in str(err.value)


def test_the_cli_says_what_to_pass_before_any_work(tmp_path):
    done = fastfair("train", "--dataset", "imagenet", "--data-dir", str(tmp_path / "nowhere"), "--out",
                    str(tmp_path / "run"))
    assert done.returncode != 0 and done.stderr.count("fastfair: error:") == 1
    assert "--data-dir DIR with the ImageNet folder layout" in done.stderr


def test_imagenet_is_not_converted_to_beton_files(folder, tmp_path):
    from fastfair.data import ffcv

    with pytest.raises(UserError, match="streamed from its image files"):
        ffcv.convert_dataset("imagenet", folder, tmp_path / "beton")


def test_imagenet_needs_the_folder_loader_and_other_data_sets_cannot_take_it(folder):
    cfg = config.resolve(None, {"data.dataset": "imagenet", "data.data_dir": str(folder)})
    assert cfg.data.loader == "folder" and cfg.data.val_per_class == 10 and cfg.data.crop_padding == 0
    with pytest.raises(UserError, match="needs --loader folder"):
        build.splits(config.resolve(None, {"data.dataset": "imagenet", "data.loader": "device"}))
    with pytest.raises(UserError, match="needs --loader device"):
        build.splits(config.resolve(None, {"data.dataset": "digits", "data.loader": "folder"}))


@pytest.mark.parametrize("sets, said", [
    (["train.lr_schedule=piecewise", "train.lr_epochs=[0, 1]"], "as many rates"),
    (["train.lr_schedule=piecewise", "train.lr_epochs=[0, 2, 1]", "train.lr_values=[0, 1, 0]"], "increasing order"),
    (["train.lr_epochs=[0, 1]", "train.lr_values=[0, 0.4]"], "set train.lr_schedule=piecewise"),
    (["data.phase_epochs=[0, 6]", "data.phase_image_sizes=[128, 224]", "data.phase_batch_sizes=[512, 224]"],
     "need the folder loader"),
    (["data.dataset=imagenet", "data.phase_epochs=[0, 6]", "data.phase_image_sizes=[128]",
      "data.phase_batch_sizes=[512, 224]"], "one value per phase"),
    (["data.dataset=imagenet", "data.phase_epochs=[1, 6]", "data.phase_image_sizes=[128, 224]",
      "data.phase_batch_sizes=[512, 224]"], "from epoch 0"),
    (["data.dataset=imagenet", "data.phase_epochs=[0, 6]", "data.phase_image_sizes=[128, 8]",
      "data.phase_batch_sizes=[512, 224]"], "at least 16"),
])
def test_a_schedule_or_phases_that_cannot_be_wongs_are_an_error(sets, said):
    from fastfair.checks import check_config

    with pytest.raises(UserError, match=said):
        check_config(config.resolve(None, {}, sets))


@pytest.mark.parametrize("row, method", [("fgsm-rs", "fgsm-rs"), ("standard", "standard")])
def test_the_table_5_presets_are_wongs_three_phases_and_schedule_with_the_papers_attacks(row, method):
    cfg = config.resolve(f"tian-kdd-t5-imagenet-{row}")
    d, t = cfg.data, cfg.train
    assert (cfg.method.name, cfg.model.name, d.dataset, d.loader) == (method, "resnet50", "imagenet", "folder")
    assert (d.phase_epochs, d.phase_image_sizes, d.phase_batch_sizes) == ([0, 6, 12], [128, 224, 288], [512, 224, 128])
    assert (t.epochs, t.lr_epochs, t.lr_values) == (15, [0, 1, 6, 12, 15], [0, 0.4, 0.04, 0.004, 0.0004])
    assert (t.momentum, t.weight_decay, cfg.eval.eps, cfg.eval.alpha) == (0.9, 2e-4, 0.007, 0.003)
    assert "Table 5" in cfg.preset and (cfg.attack.eps == 0.007 or method == "standard")


def test_a_phase_batch_larger_than_the_training_split_names_the_phases(folder):
    cfg = config.resolve(None, {"data.dataset": "imagenet", "data.data_dir": str(folder)},
                         ["data.val_per_class=2", "data.phase_epochs=[0, 1]", "data.phase_image_sizes=[24, 32]",
                          "data.phase_batch_sizes=[5, 100]"])
    with pytest.raises(UserError, match=r"data.phase_batch_sizes=\[5, 100\] \(a batch of 100\) is more than the 15"):
        build.training_splits(cfg)
