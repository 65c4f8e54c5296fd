"""Benz et al.'s CIFAR architectures (Sec. 3.1): each against its reference implementation, their interface,
and one trained end to end through the CLI on the real CIFAR-10 subset.

Golden values (``tests/golden/models_NAME.{npz,json}``, ``tests/golden/gen_models_*.py``): the reference model
(kuangliu/pytorch-cifar, weiaicunzai/pytorch-cifar100 for Inception-v3, at the pinned commits) instantiated in
this venv, its parameter count, its state-dict key names and shapes, and its eval-mode logits on the first four
fixed CIFAR-10 test images (``tests/golden/inputs.npz``) with every tensor filled by ``model_weights.fill``
from its reference name. Here the same named tensors are renamed by ``fastfair eval``'s authors' key names
(``AUTHORS_KEYS``, the documented mapping) and loaded strictly into fastfair's model, whose logits must match.
"""
import json
import re

import numpy as np
import pytest
import torch
from torch._dynamo.utils import counters

from conformance import gamma, golden, inputs
from fastfair import cli, config, models
from fastfair.checks import check_config
from fastfair.evaluation.foreign import AUTHORS_KEYS, rename
from fastfair.rundir import RunDir, load_checkpoint
from helpers import cifar_subset_npz, fastfair
from model_weights import filled_state

BENZ = ["lenet", "vgg16", "vgg19", "resnet50-cifar", "densenet121", "densenet169", "googlenet", "inception-v3"]
# a width per model small enough for CPU tests: the first convolution's channels (PAPER_WIDTH: the paper's)
SMALL = {"lenet": 3, "vgg16": 8, "vgg19": 8, "resnet50-cifar": 8, "densenet121": 8, "densenet169": 8,
         "googlenet": 24, "inception-v3": 8}
PAPER_WIDTH = {"lenet": 6, "vgg16": 64, "vgg19": 64, "resnet50-cifar": 64, "densenet121": 64, "densenet169": 64,
               "googlenet": 192, "inception-v3": 32}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Shared CI cores: two threads on a loaded machine spin (measured 60x slower than one); one thread also sums
    as tests/golden/make.py did."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def build(name, width=0, channels=3, norm="bn"):
    return models.build(name, num_classes=10, in_channels=channels, mean=[0.0] * channels, std=[1.0] * channels,
                        width=width, norm=norm)


@pytest.mark.parametrize("name", BENZ + ["resnet18"])  # resnet18: the one fastfair had, checked alike
def test_logits_and_parameters_equal_the_reference_implementation(name):
    g = golden(f"models_{name}")
    net = build(name).eval()
    assert sum(p.numel() for p in net.parameters()) == g.meta["parameters"]
    expected = {k for k in net.state_dict() if k not in ("mean", "std")}
    state, naming = rename(filled_state(g.arrays["keys"], g.arrays["shapes"]), name, expected)
    assert naming.startswith("authors'") and set(state) == expected
    net.load_state_dict({**state, "mean": net.mean, "std": net.std})  # strict: every shape as the reference's
    ref = g.t("logits")
    # float32 on both sides (2x), each within: every convolution's or linear layer's sum of n = fan-in (+ bias)
    # terms errs by gamma(n) of its sum of |terms| (Higham & Mary 2019, Thm 3.1), taken at the scale of the
    # logits it leads to (eval-mode BN, ReLU and pooling scale and select, adding one rounding each at most), and
    # the layers' relative errors add: 4.4e-5 (LeNet) to 3.7e-3 (DenseNet-169) of the largest logit. Absolute, not
    # per element: a logit that sums terms of either sign to near 0 keeps their error, not its own size's.
    err = 2 * sum(gamma(m.weight[0].numel() + (m.bias is not None)) for m in net.modules()
                  if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))) * float(ref.abs().max())
    # the check can fail: the images give different logits, far apart compared with the tolerance
    assert (ref - ref.mean(0)).abs().max() > 10 * err
    with torch.no_grad():
        torch.testing.assert_close(net(inputs().x[:len(ref)]), ref, rtol=0, atol=err)


@pytest.mark.parametrize("name", BENZ)
def test_width_is_the_first_convolution_so_eval_reads_it_back(name):
    """``fastfair eval FILE`` takes the width from body.0.weight; the paper's width is the default."""
    assert build(name).state_dict()["body.0.weight"].shape[0] == PAPER_WIDTH[name]
    small = build(name, SMALL[name])
    assert small.state_dict()["body.0.weight"].shape[0] == SMALL[name]
    assert name in AUTHORS_KEYS


@pytest.mark.parametrize("norm", ["bn", "none"])
@pytest.mark.parametrize("name", BENZ)
def test_features_logits_and_gradients_at_a_small_width(name, norm):
    torch.manual_seed(0)
    net = build(name, SMALL[name], norm=norm).train()
    x = torch.rand(4, 3, 32, 32)
    feats = net.forward_features(x)
    assert feats.shape == (4, net.feature_dim) and net.head.in_features == net.feature_dim
    loss = torch.nn.functional.cross_entropy(net(x), torch.arange(4))
    loss.backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(bool(g.abs().sum() > 0) for g in grads) >= 0.9 * len(grads)  # dead ReLUs may zero a few
    has_bn = any(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())
    assert has_bn == (norm == "bn" and name != "lenet")
    with torch.no_grad():  # eval is deterministic (Inception-v3's dropout is off)
        net.eval()
        assert torch.equal(net(x), net(x))


@pytest.mark.parametrize("name", [n for n in BENZ if n != "vgg16" and n != "vgg19"])
def test_mnist_sized_grey_images_fit(name):
    """28x28 grey images run through every model but VGG (five 2x2 max-pools need 32x32); LeNet pads them into
    its 32x32 field, which is the same as a padding-2 first convolution."""
    net = build(name, SMALL[name], channels=1).eval()
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        assert net(x).shape == (2, 10)
        if name == "lenet":
            conv = net.body[0]
            padded = torch.nn.functional.conv2d(x, conv.weight, conv.bias, padding=2)
            torch.testing.assert_close(net.body[1:](padded), net.forward_features(x))


def test_lenet_norm_is_not_used():
    assert [p.shape for p in build("lenet", norm="none").parameters()] == \
           [p.shape for p in build("lenet", norm="bn").parameters()]


def test_models_listing_names_them(capsys):
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    for name in BENZ:
        assert f"\n{name} " in out or out.startswith(f"{name} ")
    assert "Szegedy et al. 2016" in out and "Huang et al. 2017" in out and "LeCun et al. 1998" in out


@pytest.mark.parametrize("name, size", [("lenet", 28), ("lenet", 32), ("inception-v3", 32)])
def test_forward_and_backward_compile_without_graph_breaks(name, size):
    """Dynamo's graph (the eager backend: graph breaks do not depend on the compiler behind it)."""
    torch._dynamo.reset()
    counters.clear()
    channels = 1 if size == 28 else 3
    net = build(name, SMALL[name], channels=channels).train()
    step = torch.compile(lambda x: net(x).logsumexp(1).mean(), backend="eager", fullgraph=True)
    step(torch.rand(2, channels, size, size)).backward()
    assert counters["graph_break"] == {}, dict(counters["graph_break"])


def test_vgg16_trains_end_to_end_through_the_cli(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=600, n_test=100)
    out = tmp_path / "run"
    r = fastfair("train", "--method", "standard", "--dataset", "npz", "--data-dir", npz, "--model", "vgg16",
                 "--set", "model.width=8", "--epochs", "3", "--out", out, "--set", "data.val_per_class=5",
                 "--set", "data.batch_size=50", "--set", "train.lr_milestones=[]", "--set", "train.val_attack=pgd2",
                 "--set", "eval.attacks=['clean']", "--set", "train.progress=false")
    assert r.returncode == 0, r.stderr
    losses = [float(v) for v in re.findall(r"^epoch +\d+ +loss ([\d.]+)", (out / "train.log").read_text(), re.M)]
    assert len(losses) == 3 and losses[2] < losses[0] - 0.1, losses  # it learns: 2.77, 2.54, 2.36 when written
    result = json.loads((out / "eval" / "best_pgd-test.json").read_text())
    assert len(result["results"]["clean"]["per_class"]) == 10
    assert load_checkpoint(RunDir(out).checkpoint("best_pgd"))["spec"]["name"] == "vgg16"


def test_a_norm_asked_of_a_model_without_one_is_a_warning():
    warn = "model.norm=bin does nothing: lenet has no normalisation layer"
    assert warn in check_config(config.resolve(None, {"model.name": "lenet"}, ["model.norm=bin"]))
    assert not [w for w in check_config(config.resolve(None, {"model.name": "lenet"})) if "model.norm" in w]
    assert not [w for w in check_config(config.resolve(None, {"model.name": "vgg16"}, ["model.norm=none"]))
                if "model.norm" in w]


def test_eval_reads_a_reference_checkpoint_by_its_key_names(tmp_path, capsys):
    """``fastfair eval FILE --model lenet`` on a file saved as kuangliu's LeNet names its layers (the golden
    weights, under DataParallel's ``module.`` prefix as its training script saves them)."""
    g = golden("models_lenet")
    state = filled_state(g.arrays["keys"], g.arrays["shapes"])
    torch.save({"net": {f"module.{k}": v for k, v in state.items()}}, tmp_path / "ckpt.pth")
    npz = cifar_subset_npz(tmp_path, n_train=1200, n_test=40)  # 50 a class go to validation
    assert cli.main(["eval", str(tmp_path / "ckpt.pth"), "--model", "lenet", "--dataset", "npz", "--data-dir",
                     str(npz), "--normalize", "none", "--attacks", "clean", "--quiet"]) == 0
    result = json.loads((tmp_path / "eval" / "ckpt-test.json").read_text())
    assert result["source"]["key_names"].startswith("authors' (conv1-2, fc1-3") and result["source"]["width"] == 6
    net = build("lenet").eval()
    net.load_state_dict({**rename(state, "lenet", set())[0], "mean": net.mean, "std": net.std})
    with np.load(npz) as f:
        x, y = torch.from_numpy(f["x_test"]).float() / 255, torch.from_numpy(f["y_test"]).long()
    with torch.no_grad():
        pred = net(x).argmax(1)
    confusion = torch.zeros(10, 10, dtype=torch.long).index_put_((y, pred), torch.tensor(1), accumulate=True)
    assert result["results"]["clean"]["confusion"] == confusion.tolist()  # the same model as loaded here
