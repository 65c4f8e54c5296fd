"""The attacks of Tian et al.'s Table 2 (ICLR sub.) / Table 1 (KDD): C&W's L-inf attack, NATTACK, the transfer
attack, and their "N images per class" sampling: known answers on a linear model, the ball, seeding, the CLI."""
import json
import shutil

import numpy as np
import pytest
import torch
from evalreport_helpers import digits_run

from fastfair.attacks.cwinf import CWInf, margin
from fastfair.attacks.nattack import NAttack, log_prob_margin
from fastfair.attacks.names import parse_attack
from fastfair.errors import UserError
from fastfair.evaluation.per_class import check_attack_names, evaluate


class Boundary(torch.nn.Module):
    """Two classes on 4 pixels: z_0 - z_1 = w.x + b with w = (1, -1, 1, -1), b = 0.2. At x = 0.5 everywhere
    w.x = 0, so class 0 wins by 0.2, and the smallest L-inf change that flips it is 0.2 / ||w||_1 = 0.05 (move
    every pixel by 0.05 against sign(w)); no change within 0.05 flips it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        w = torch.tensor([1.0, -1.0, 1.0, -1.0])
        self.lin.weight.data = torch.stack([w, torch.zeros(4)])
        self.lin.bias.data = torch.tensor([0.2, 0.0])

    def forward(self, x):
        return self.lin(x.flatten(1))


FLIP = 0.05
X = torch.full((3, 1, 2, 2), 0.5)
Y = torch.zeros(3, dtype=torch.long)


def _attack(name):
    return {"cwinf": CWInf(iterations=200), "nattack": NAttack(iterations=100, population=50)}[name]


@pytest.mark.parametrize("name", ["cwinf", "nattack"])
@pytest.mark.parametrize("eps", [0.04, 0.049, 0.06, 0.1])
def test_flips_the_linear_model_exactly_when_eps_exceeds_the_closed_form_distance(name, eps):
    torch.manual_seed(0)
    model = Boundary()
    x_adv = _attack(name)(model, X, Y, torch.full((2,), eps))
    assert (x_adv - X).abs().max() <= eps + 1e-6 and 0 <= x_adv.min() and x_adv.max() <= 1
    fooled = model(x_adv).argmax(1) != Y
    assert bool(fooled.all()) == (eps > FLIP) and bool(fooled.any()) == (eps > FLIP)


def test_cwinf_uses_each_classs_own_radius():
    model, y = Boundary(), torch.tensor([0, 1])  # class 1 is wrong at x already: clean-misclassified stays so
    x_adv = CWInf(iterations=200)(model, X[:2], y, torch.tensor([0.06, 0.0]))
    assert (model(x_adv).argmax(1) != y).all() and (x_adv[1] == X[1]).all()


def test_nattack_reads_only_outputs_and_is_seeded():
    model = Boundary()

    class NoGrad(torch.nn.Module):
        def forward(self, x):
            assert not torch.is_grad_enabled() and not x.requires_grad  # a black box: no gradient is asked for
            return model(x)

    runs = []
    for _ in range(2):
        torch.manual_seed(7)
        runs.append(NAttack(iterations=20, population=30)(NoGrad(), X, Y, torch.full((2,), 0.1)))
    assert torch.equal(runs[0], runs[1])


def test_losses_are_the_papers_margins():
    z = torch.tensor([[2.0, 0.5, 1.0], [0.0, 3.0, 1.0]])
    y = torch.tensor([0, 0])
    assert torch.allclose(margin(z, y), torch.tensor([1.0, 0.0]))  # C&W f_6, kappa 0: max(Z_y - max_j Z_j, 0)
    assert torch.allclose(margin(z, y, kappa=10.0), torch.tensor([1.0, -3.0]))
    logp = z.log_softmax(1)
    assert torch.allclose(log_prob_margin(z, y), (logp[:, 0] - logp[:, 1:].amax(1)).clamp_min(0))


def _loader(x, y, batch=4):
    from fastfair.data import DeviceLoader

    return DeviceLoader(x, y, batch, device="cpu", train=False)


def test_per_class_sampling_takes_the_first_n_images_of_each_class_across_batches():
    y = torch.tensor([0, 1, 0, 2, 0, 1, 1, 0, 2, 1, 2])
    x = torch.full((len(y), 1, 2, 2), 128, dtype=torch.uint8)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 3))
    res = evaluate(model, _loader(x, y, batch=3), ["clean/2", "clean"], eps=0.1, alpha=0.01, classes=["a", "b", "c"])
    assert np.array(res["clean/2"]["confusion"]).sum(1).tolist() == [2, 2, 2] and res["clean/2"]["images"] == 6
    assert np.array(res["clean"]["confusion"]).sum(1).tolist() == [4, 4, 3] and "images" not in res["clean"]


def test_transfer_with_the_target_as_substitute_is_the_white_box_attack():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    other = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    x = torch.randint(0, 256, (24, 3, 2, 2), dtype=torch.uint8)
    y = torch.arange(24) % 3
    kw = dict(eps=0.3, alpha=0.05, classes=["a", "b", "c"])
    white = evaluate(model, _loader(x, y), ["pgd10"], **kw)["pgd10"]
    same = evaluate(model, _loader(x, y), ["transfer:pgd10"], substitute=model, **kw)["transfer:pgd10"]
    assert same["confusion"] == white["confusion"]
    moved = evaluate(model, _loader(x, y), ["transfer:pgd10"], substitute=other, **kw)["transfer:pgd10"]
    assert moved["confusion"] != white["confusion"]
    assert np.trace(moved["confusion"]) > np.trace(white["confusion"])  # a stranger's examples transfer worse


def test_names_and_their_errors():
    assert isinstance(parse_attack("cwinf").search, CWInf) and parse_attack("cwinf").search.iterations == 1000
    assert parse_attack("nattack").search == NAttack()  # the papers' population 300, sigma 0.1, lr 0.02
    assert (NAttack().population, NAttack().sigma, NAttack().lr) == (300, 0.1, 0.02)
    c = CWInf()
    assert (c.searches, c.iterations, c.lr, c.c0, c.tau_decrease) == (5, 1000, 0.005, 0.01, 0.9)  # App. E
    assert parse_attack("nattack50/200").search.iterations == 50 and parse_attack("nattack50/200").per_class == 200
    assert parse_attack("transfer:pgd20").transfer and parse_attack("transfer:pgd20").seed_name == "pgd20"
    check_attack_names(["cwinf/200", "nattack/200", "transfer:pgd20", "transfer:fgsm", "aa"])
    for bad, said in [("transfer:nattack", "white-box"), ("transfer:clean", "white-box"), ("cwinfx3", "restarts"),
                      ("pgd20@t0.1", "temperature"), ("pgd20/0", "1 or more"), ("aa/200", "--per-class"),
                      ("nattak", "unknown attack")]:
        with pytest.raises(UserError, match=said):
            check_attack_names([bad])
    with pytest.raises(UserError, match="Did you mean cwinf"):
        check_attack_names(["cw-inf"])


def test_python_api_checks_the_substitute_before_any_attack():
    import fastfair

    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    data = (torch.rand(6, 3, 2, 2), torch.arange(6) % 3)
    with pytest.raises(UserError, match="substitute"):
        fastfair.evaluate(model, data, attacks=["transfer:pgd5"])
    with pytest.raises(UserError, match="only by transfer"):
        fastfair.evaluate(model, data, attacks=["pgd5"], substitute=model)
    with pytest.raises(UserError, match="2 outputs"):
        fastfair.evaluate(model, data, attacks=["transfer:pgd5"],
                          substitute=torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2)))
    result = fastfair.evaluate(model, data, attacks=["transfer:pgd5"], substitute=model)
    assert "substitute_weights" in result.record and result.avg("transfer:pgd5") >= 0


def test_cli_transfer_and_its_errors(tmp_path, capsys):
    """The CLI as a user types it, in this process (the process boundary is not what is tested): a transfer, C&W
    L-inf and NATTACK evaluation of a run with itself as the substitute, and the three mistakes refused."""
    from fastfair import cli

    run = tmp_path / "run"
    shutil.copytree(digits_run()[0], run)  # its own copy: this result's settings differ from the shared run's
    assert cli.main(["eval", str(run), "--attacks", "clean,transfer:pgd5,cwinf5/1,nattack2/1", "--substitute",
                     str(run), "--quiet"]) == 0, capsys.readouterr().err
    record = json.loads(next((run / "eval").glob("*-test.json")).read_text())
    results = record["results"]
    assert record["substitute"].endswith(".pt") and len(record["substitute_weights"]) == 64
    assert results["cwinf5/1"]["images"] == results["nattack2/1"]["images"] == 10  # 1 of each of 10 digits
    assert results["transfer:pgd5"]["per_class"] and "images" not in results["transfer:pgd5"]
    capsys.readouterr()
    for args, said in [(["--attacks", "transfer:pgd5"], "substitute"),
                       (["--attacks", "pgd5", "--substitute", str(run)], "only by transfer"),
                       (["--attacks", "transfer:pgd5", "--substitute", str(tmp_path / "nope.pt")], "no checkpoint")]:
        assert cli.main(["eval", str(run), *args, "--quiet"]) != 0
        err = capsys.readouterr().err
        assert err.strip().splitlines()[-1].startswith("fastfair: error:") and said in err, err
    assert cli.main(["eval", "--help"]) == 0
    shown = capsys.readouterr().out
    assert "nattack" in shown and "--substitute" in shown


def test_train_evaluates_transfer_on_the_configs_substitute_and_refuses_a_missing_one(tmp_path, capsys):
    from fastfair import cli

    sub, _ = digits_run()
    quick = ["train", "--config", "demo", "--epochs", "1", "--quiet", "--set", "model.width=4", "--set",
             "attack.steps=1", "--set", "eval.attacks=['clean','transfer:pgd3']"]
    assert cli.main([*quick, "--out", str(tmp_path / "no-sub")]) != 0
    assert "eval.substitute" in capsys.readouterr().err and not (tmp_path / "no-sub").exists()
    assert cli.main([*quick, "--out", str(tmp_path / "run"), "--set", f"eval.substitute='{sub}'"]) == 0, \
        capsys.readouterr().err
    record = json.loads(next((tmp_path / "run" / "eval").glob("*-test.json")).read_text())
    assert record["substitute"].startswith(str(sub)) and record["results"]["transfer:pgd3"]["per_class"]


def test_on_real_cifar10_each_attack_fools_a_standard_model_on_its_own_images():
    """A standard-trained CNN (a few hundred steps on the real subset) is not robust at 8/255: C&W L-inf and
    NATTACK, each on 3 images a class, take most of what it gets right, and never more than it gets right."""
    import fastfair
    from helpers import real_data

    with np.load(real_data()) as f:
        x = torch.tensor(f["x_train"][:2000]).float() / 255
        y = torch.tensor(f["y_train"][:2000]).long()
        xt, yt = torch.tensor(f["x_test"][:300]).float() / 255, torch.tensor(f["y_test"][:300]).long()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, 2, 1), torch.nn.ReLU(), torch.nn.Conv2d(16, 32, 3, 2, 1),
                                torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters(), 3e-3)
    for step in range(300):
        i = torch.randint(0, len(x), (64,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[i]), y[i]).backward()
        opt.step()
    result = fastfair.evaluate(model, (xt, yt), attacks=["clean/3", "cwinf30/3", "nattack20/3"], eps=8 / 255)
    clean = result.avg("clean/3")
    assert clean >= 20  # the model learnt something (chance: 10 %)
    for name in ("cwinf30/3", "nattack20/3"):
        assert result.record["results"][name]["images"] == 30
        assert result.avg(name) < clean / 2


def test_fgsmrs_is_one_eps_step_from_a_uniform_start_inside_the_ball():
    model, y = Boundary(), torch.zeros(64, dtype=torch.long)
    x = torch.full((64, 1, 2, 2), 0.5)
    torch.manual_seed(0)
    x_adv = parse_attack("fgsmrs")(model, x, y, torch.full((2,), 0.04), torch.full((2,), 0.01))
    step = x_adv - x
    assert step.abs().max() <= 0.04 + 1e-6
    # the step moves every pixel against sign(w) from a point drawn in the ball: the ends are spread, not +-eps
    w = torch.tensor([1.0, -1.0, 1.0, -1.0]).view(1, 1, 2, 2)
    assert bool(((step * w) <= 1e-6).all()) and step.abs().min() < 0.03
    plain = parse_attack("fgsm")(model, x, y, torch.full((2,), 0.04), torch.full((2,), 0.01))
    assert torch.allclose((plain - x).abs(), torch.full_like(x, 0.04))


def test_wrn_32_10_is_madry_et_als_network_that_trades_calls_wrn_34_10():
    from fastfair import models

    kw = dict(num_classes=10, in_channels=3, mean=[0.5] * 3, std=[0.25] * 3)
    a, b = models.build("wrn-32-10", **kw), models.build("wrn-34-10", **kw)
    assert [p.shape for p in a.parameters()] == [p.shape for p in b.parameters()]
    convs = [m for m in a.modules() if isinstance(m, torch.nn.Conv2d) and m.kernel_size == (3, 3)]
    assert len(convs) + 1 == 32  # 3x3 convolutions on the main path and the linear head
