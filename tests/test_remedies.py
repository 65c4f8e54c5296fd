"""Long-tail remedies as options (Benz et al. 2021, Sec. 3.3): the critical-class weights, class-balanced weights
(Cui et al. 2019), LDAM (Cao et al. 2019, against the authors' LDAMLoss) and the inter-class cosine regulariser;
their errors and warnings as a user types them, and 1-step training runs on the real CIFAR-10 subset."""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import fastfair

from fastfair import cli, config, models
from fastfair.errors import UserError
from fastfair.evaluation.measures import critical_class_change
from fastfair.methods import METHODS
from fastfair.methods.class_balanced import class_balanced_weights
from fastfair.methods.cosine_reg import mean_inter_class_cosine
from fastfair.methods.ldam import ldam_margins
from fastfair.reports.report import compare
from fastfair.training.class_state import ClassState
from fastfair.training.trainer import Trainer

import conformance
from helpers import CIFAR10, make_method, real_data
from test_compiled_step import NoHostSync

IMBALANCED = [5000, 2000, 500, 50]


def method_with_counts(method, counts, *sets, dataset="digits"):
    cfg = config.resolve(None, {"method.name": method, "data.dataset": dataset}, list(sets))
    m = METHODS.get(method)(cfg)
    state = ClassState(len(counts), "cpu", train_counts=counts)
    m.setup(state)
    return m, state


# ---- formulas ------------------------------------------------------------------------------------

def test_class_balanced_weights_follow_the_effective_number():
    """w_k = (1 - beta) / (1 - beta^n_k), normalised to sum C (Cui et al. 2019, Eq. 3), in float64 by hand."""
    for beta in (0.9, 0.999, 0.9999):
        inverse = np.array([(1 - beta) / (1 - beta ** n) for n in IMBALANCED])
        want = inverse / inverse.sum() * len(IMBALANCED)
        # float64 arithmetic (error ~1e-16) rounded once to float32: within u of the float64 value (2u: margin)
        np.testing.assert_allclose(class_balanced_weights(IMBALANCED, beta).numpy(), want, rtol=2 * conformance.U32)
    w = class_balanced_weights(IMBALANCED, 0.999)
    assert w.sum().item() == pytest.approx(4.0) and w.argmax().item() == 3  # the rarest class weighs most
    assert torch.equal(class_balanced_weights([500] * 4, 0.999), torch.ones(4))  # balanced: all equal
    # a class without training images (data.drop_classes) weighs 0; the others sum to their number
    w = class_balanced_weights([100, 0, 10], 0.99)
    assert w[1] == 0 and w.sum().item() == pytest.approx(2.0)


def test_class_balanced_option_weights_the_loss_rows():
    m, state = method_with_counts("pgd-at", IMBALANCED, "class_balanced.beta=0.999")
    assert torch.allclose(state["loss_weight"], class_balanced_weights(IMBALANCED, 0.999))
    assert m.setup_warnings() == []
    # composes with cost-sensitive weights: the factors multiply
    m, state = method_with_counts("trades", IMBALANCED, "class_balanced.beta=0.999",
                                  "cost_sensitive.weights=[1, 2, 1, 1]")
    assert torch.allclose(state["loss_weight"], class_balanced_weights(IMBALANCED, 0.999) * torch.tensor([1, 2, 1, 1.]))


def test_ldam_matches_the_authors_loss():
    """kaidic/LDAM-DRW losses.LDAMLoss (max_m 0.5, s 30) on a CIFAR-10-LT profile: margins, loss and gradient."""
    g = conformance.golden("ldam")
    counts = g.t("counts").tolist()
    # both sides: float64 arithmetic rounded once to float32, so equal or (a float64 difference of ~1e-16 across a
    # rounding boundary) one float32 ulp apart, at most 2u relative
    torch.testing.assert_close(ldam_margins(counts, 0.5), g.t("margins"), rtol=2 * conformance.U32, atol=0)
    m, state = method_with_counts("pgd-at", counts, "ldam.enabled=true", dataset="cifar10")
    z = g.t("logits").clone().requires_grad_()
    loss = F.cross_entropy(m.ce_logits(None, z, g.t("y")), g.t("y"))
    loss.backward()
    # float32 on both sides, each within: the margined logits s (z - Delta) (|z| <= 1, Delta <= 0.5, s 30: |.| <= 45;
    # a subtraction and a product, 2u of 45 each) move CE by at most 2 (|p - onehot|_1) times that; the log-sum-exp
    # of C = 10 terms of up to 45 errs by gamma(10) of 45; the batch mean of N = 32 rows by gamma(32) of the loss
    s, top, n, c = 30.0, 45.0, len(g.t("y")), len(counts)
    loss_err = 2 * 2 * conformance.U32 * top + conformance.gamma(c) * top + conformance.gamma(n) * float(g.t("loss"))
    torch.testing.assert_close(loss.detach(), g.t("loss"), rtol=0, atol=2 * loss_err)
    # d loss / dz = s (p - onehot) / N: p_j = exp(z_j - lse) moves by p_j times the error of z_j - lse (2 of the
    # logits' and lse's above), relative; p_y - 1 cancels, so its error is that of p_y, at most s / N of it absolute
    rel = 2 * (2 * conformance.U32 * top + conformance.gamma(c) * top)
    torch.testing.assert_close(z.grad, g.t("grad"), rtol=2 * rel, atol=2 * rel * s / n)


def test_ldam_reaches_the_ce_term_of_trades_only():
    """TRADES: the margin enters the natural CE term; the KL compares the model's own logits."""
    m, state = method_with_counts("trades", IMBALANCED, "ldam.enabled=true", "ldam.scale=1", dataset="cifar10")
    torch.manual_seed(0)
    net = models.build("tiny-cnn", num_classes=4, in_channels=1, mean=[0.5], std=[0.5], width=4)
    x, y = torch.rand(8, 1, 8, 8), torch.arange(8) % 4
    x_adv = x + 0.01
    rows, _ = m.loss(net, x, x_adv, y, state)
    plain, pstate = method_with_counts("trades", IMBALANCED, dataset="cifar10")
    rows0, _ = plain.loss(net, x, x_adv, y, pstate)
    z = net(x)
    margin = ldam_margins(IMBALANCED, 0.5)
    ce = F.cross_entropy(z - F.one_hot(y, 4) * margin, y, reduction="none")
    torch.testing.assert_close(rows - rows0, ce - F.cross_entropy(z, y, reduction="none"))


def test_critical_class_weights_and_the_report_measure():
    m, state = make_method("pgd-at", "cost_sensitive.critical=1", "cost_sensitive.critical_weight=3")
    assert state["loss_weight"].tolist() == [1.0, 3.0, 1.0]  # unnormalised: the others keep the baseline's scale
    c = critical_class_change([60, 40, 50, 30], [62, 30, 55, 31], 1)
    assert c == {"gain": 10.0, "others_mean_loss": pytest.approx(8 / 3), "others_worst_loss": 5.0, "worst_other": 2}


def test_cosine_regulariser_is_the_mean_over_present_class_pairs():
    torch.manual_seed(0)
    z, y = torch.randn(12, 5), torch.tensor([0, 0, 1, 1, 3, 3, 0, 1, 3, 0, 1, 3])  # classes 2 and 4 absent
    mu = F.normalize(torch.stack([z[y == k].mean(0) for k in (0, 1, 3)]), dim=1)
    s = mu @ mu.T
    # float32 on both sides, each within: the class means (12-term sums) and their 5-term norms, gamma(12) + gamma(5)
    # + u relative, move a cosine of unit vectors by at most twice that; the 5-term dots add gamma(5) and the mean of
    # the 25 Gram entries (each |.| <= 1) gamma(25) + u: an absolute bound, every cosine being at most 1
    g = conformance.gamma
    err = 2 * (g(12) + g(5) + conformance.U32) + g(5) + g(25) + conformance.U32
    assert mean_inter_class_cosine(z, y, 5).item() == pytest.approx(((s.sum() - s.trace()) / 6).item(), abs=2 * err)
    assert mean_inter_class_cosine(z, torch.zeros(12, dtype=torch.long), 5).item() == 0.0  # one class: no pair
    # the objective is the method's plus lambda R
    m, state = make_method("pgd-at", "cosine_reg.weight=0.5")
    plain, pstate = make_method("pgd-at")
    net = models.build("tiny-cnn", num_classes=3, in_channels=1, mean=[0.5], std=[0.5], width=4)
    x, y = torch.rand(6, 1, 8, 8), torch.arange(6) % 3
    (with_reg, logits), (without, _) = m.objective(net, x, x, y, state), plain.objective(net, x, x, y, pstate)
    torch.testing.assert_close(with_reg - without, 0.5 * mean_inter_class_cosine(logits, y, 3))


def test_cosine_regulariser_pushes_the_class_means_apart():
    """Four steps of CE + R leave a tiny model's per-class mean logits less alike than four steps of CE alone."""
    torch.manual_seed(0)
    start = models.build("tiny-cnn", num_classes=3, in_channels=1, mean=[0.5], std=[0.5], width=4).state_dict()
    g = torch.Generator().manual_seed(1)
    y = torch.arange(30) % 3
    x = torch.rand(3, 1, 8, 8, generator=g)[y] + 0.3 * torch.rand(30, 1, 8, 8, generator=g)  # a pattern per class
    similarity = {}
    for sets in ((), ("cosine_reg.weight=1",)):
        m, state = make_method("standard", *sets)
        net = models.build("tiny-cnn", num_classes=3, in_channels=1, mean=[0.5], std=[0.5], width=4)
        net.load_state_dict(start)
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        for _ in range(4):
            loss, _ = m.objective(net, x, x, y, state)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            similarity[sets] = mean_inter_class_cosine(net(x), y, 3).item()
    assert similarity[("cosine_reg.weight=1",)] < similarity[()] - 0.2, similarity


# ---- what a user is told -------------------------------------------------------------------------

@pytest.mark.parametrize("sets,match", [
    (["class_balanced.beta=1"], "in \\(0, 1\\)"),
    (["class_balanced.beta=-0.5"], "in \\(0, 1\\)"),
    (["ldam.enabled=true", "ldam.max_m=0"], "above 0"),
    (["ldam.max_m=0.3"], "ldam.enabled=true"),
    (["ldam.enabled=true", "method.name=mart"], "does not route its CE terms"),
    (["ldam.enabled=true", "method.name=standard"], "does not route its CE terms"),
    (["cosine_reg.weight=-1"], "above 0"),
    (["cost_sensitive.critical_weight=4"], "cost_sensitive.critical=K"),
    (["cost_sensitive.critical=3", "cost_sensitive.critical_weight=1"], "other than 1"),
    (["cost_sensitive.critical=3", "cost_sensitive.auto=true"], "one-critical-class scenario"),
])
def test_bad_values_are_refused_at_config_time(sets, match):
    with pytest.raises(UserError, match=match):
        config.resolve(None, {"method.name": "pgd-at", "data.dataset": "digits"}, sets)


def test_a_critical_class_outside_the_run_and_a_state_without_counts_are_refused():
    with pytest.raises(UserError, match="not a class of this run"):
        make_method("pgd-at", "cost_sensitive.critical=3")  # 3 classes: 0..2
    with pytest.raises(UserError, match="train_counts"):
        make_method("pgd-at", "class_balanced.beta=0.99")
    _, state = fastfair.method("pgd-at", num_classes=4, dataset="digits", sets={"class_balanced.beta": 0.99},
                               train_counts=IMBALANCED)
    assert torch.allclose(state["loss_weight"], class_balanced_weights(IMBALANCED, 0.99))


def test_balanced_split_and_raw_logits_warn():
    m, _ = method_with_counts("pgd-at", [50] * 4, "class_balanced.beta=0.999", "ldam.enabled=true")
    said = " | ".join(m.setup_warnings())
    assert "as good as unweighted" in said and "constant margin" in said and "raw logits" in said
    m, _ = method_with_counts("pgd-at", IMBALANCED, "ldam.enabled=true", "model.head=cosine", "model.head_scale=1")
    assert m.setup_warnings() == []


# ---- the CLI on the real CIFAR-10 subset ---------------------------------------------------------

TRAIN_COUNTS = [24, 18, 12, 9, 7, 6, 5, 4, 3, 2]  # an imbalanced split: 90 images, one step of 90
VAL = 2


@pytest.fixture(scope="module")
def imbalanced(tmp_path_factory):
    """The real subset cut to TRAIN_COUNTS (+ VAL validation images) per class, and 50 test images."""
    with np.load(real_data()) as f:
        x, y = f["x_train"], f["y_train"]
        keep = np.concatenate([np.flatnonzero(y == k)[:n + VAL] for k, n in enumerate(TRAIN_COUNTS)])
        path = tmp_path_factory.mktemp("lt") / "cifar10-lt.npz"
        np.savez(path, x_train=x[keep], y_train=y[keep], x_test=f["x_test"][:50], y_test=f["y_test"][:50],
                 class_names=np.array(CIFAR10))
    return path


def train(npz, out, method, *sets):
    args = ["train", "--method", method, "--dataset", "npz", "--data-dir", str(npz), "--model", "tiny-cnn",
            "--epochs", "1", "--device", "cpu", "--no-compile", "--out", str(out), "--quiet"]
    fast = ["model.width=4", "attack.steps=1", "train.val_attack=fgsm", "eval.attacks=['clean', 'fgsm']",
            f"data.val_per_class={VAL}", "data.batch_size=90", "train.lr_milestones=[]", *sets]
    return cli.main(args + [a for s in fast for a in ("--set", s)])


ALL = ["class_balanced.beta=0.999", "ldam.enabled=true", "ldam.scale=1", "cosine_reg.weight=0.1",
       "cost_sensitive.critical=3", "cost_sensitive.critical_weight=2"]


@pytest.mark.parametrize("method", ["pgd-at", "trades"])
def test_every_remedy_trains_with_at_and_trades(imbalanced, tmp_path, capsys, method):
    assert train(imbalanced, tmp_path / "run", method, *ALL) == 0
    record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert np.isfinite(record["loss"])
    want = class_balanced_weights(TRAIN_COUNTS, 0.999) * torch.tensor([1, 1, 1, 2, 1, 1, 1, 1, 1, 1.])
    # the same float32 weights times 1 or 2 (exact) through JSON (a float32 is exact as a Python float): at most one
    # rounding apart should the factors multiply in another order
    np.testing.assert_allclose(record["vectors"]["loss_weight"], want.numpy(), rtol=2 * conformance.U32)
    assert "warning" not in capsys.readouterr().err  # an imbalanced split: nothing to warn of


def test_a_balanced_split_warns_once_and_a_bad_value_is_one_error(imbalanced, tmp_path, capsys):
    assert train(imbalanced, tmp_path / "run", "trades", "class_balanced.beta=0.999", "data.train_per_class=2",
                 "data.batch_size=20") == 0
    err = capsys.readouterr().err
    assert err.count("fastfair: warning: class_balanced.beta=0.999") == 1 and "as good as unweighted" in err
    assert train(imbalanced, tmp_path / "bad", "mart", "ldam.enabled=true") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: method mart") and not (tmp_path / "bad").exists()


def test_the_report_says_what_the_critical_class_gained(imbalanced, tmp_path, capsys):
    assert train(imbalanced, tmp_path / "base", "pgd-at") == 0
    assert train(imbalanced, tmp_path / "cat", "pgd-at", "cost_sensitive.critical=3",
                 "cost_sensitive.critical_weight=5") == 0
    table = compare([tmp_path / "base", tmp_path / "cat"], baseline=tmp_path / "base")
    line = next(t for t in table.splitlines() if "critical class cat" in t)
    assert line.startswith("cat: critical class cat against base: clean ") and "fgsm " in line
    assert "critical class" not in compare([tmp_path / "base", tmp_path / "cat"])  # no baseline: no line


def test_no_step_waits_for_the_host(imbalanced, tmp_path):
    cfg = config.resolve(None, {"method.name": "trades", "data.dataset": "npz", "data.data_dir": str(imbalanced)},
                         ["model.name=tiny-cnn", "model.width=4", "attack.steps=1", "train.device=cpu",
                          "train.compile=off", "train.kernels=torch", "train.progress=false",
                          f"data.val_per_class={VAL}", "data.batch_size=90", "train.val_attack=fgsm", *ALL])
    t = Trainer(cfg, tmp_path / "run", quiet=True)
    x, y = next(iter(t.train_loader))
    t.model.train()
    t.train_step(x, y)
    with NoHostSync():
        t.train_step(x, y)
