"""AutoAttack: the standard configuration, AA <= PGD-20 on every class, and resuming from saved flags."""

import numpy as np
import pyautoattack  # a declared dependency: the official backend runs for real in CI
import pytest
import torch
from evalreport_helpers import cheap_aa_backend, digits_run
from helpers import needs_extra
from shared_runs import TINY_AA, tiny_linear_aa, tiny_linear_case

from fastfair import build, data
from fastfair.attacks import autoattack
from fastfair.evaluation.per_class import evaluate
from fastfair.rundir import load_checkpoint



def test_standard_settings_are_the_standard_version():
    s = autoattack.standard_settings(10)
    assert autoattack.SUBATTACKS == ("apgd-ce", "apgd-t", "fab-t", "square")
    assert s["apgd-ce"] == {"n_iter": 100, "n_restarts": 1, "loss": "ce", "eot_iter": 1, "rho": 0.75}
    assert s["apgd-t"]["n_iter"] == 100 and s["apgd-t"]["n_target_classes"] == 9 and s["apgd-t"]["n_restarts"] == 1
    assert s["fab-t"]["n_iter"] == 100 and s["fab-t"]["n_target_classes"] == 9 and s["fab-t"]["n_restarts"] == 1
    assert s["square"] == {"n_queries": 5000, "n_restarts": 1, "p_init": 0.8, "loss": "margin",
                           "resc_schedule": False}
    assert autoattack.standard_settings(5)["apgd-t"]["n_target_classes"] == 4  # at most C - 1 targets


def test_torchattacks_backend_objects_carry_the_standard_numbers():
    needs_extra("torchattacks")
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    bk = autoattack.build_backend(model, 8 / 255, 10, "torchattacks")
    assert bk.name == "torchattacks" and bk.settings == autoattack.standard_settings(10)
    a = bk.attacks
    assert (a["apgd-ce"].steps, a["apgd-ce"].loss, a["apgd-ce"].n_restarts) == (100, "ce", 1)
    assert (a["apgd-t"].steps, a["apgd-t"].n_target_classes) == (100, 9)
    assert (a["fab-t"].steps, a["fab-t"].multi_targeted, a["fab-t"].n_target_classes) == (100, True, 9)
    assert (a["square"].n_queries, a["square"].p_init, a["square"].rescale_schedule) == (5000, 0.8, False)
    assert all(x.eps == pytest.approx(8 / 255) for x in a.values())


def test_per_class_eps_is_refused():
    from fastfair.errors import UserError

    with pytest.raises(UserError, match="one eps"):
        autoattack.uniform_eps(torch.tensor([0.1, 0.2]))


def _model_and_loader(n_per_class, batch):
    out, cfg = digits_run()
    ck = load_checkpoint(out / "checkpoints" / "best_pgd.pt")
    model = build.model_from_spec(ck["spec"], torch.device("cpu"), False)
    model.load_state_dict(ck["model"])
    bundle = data.load("digits")
    idx = torch.cat([(bundle.y_test == c).nonzero().flatten()[:n_per_class] for c in range(10)])
    loader = data.DeviceLoader(bundle.x_test[idx], bundle.y_test[idx], batch, device="cpu", train=False)
    return model, loader, cfg, bundle.classes


@pytest.mark.slow
def test_aa_is_at_most_pgd20_on_every_class(tmp_path):
    needs_extra("torchattacks")
    # one batch: Square's 5000 queries run once (CPU time is dominated by them)
    model, loader, cfg, classes = _model_and_loader(n_per_class=2, batch=20)
    # twice the training radius, so that attacks have points to break
    # torchattacks: the official backend's CPU run of this model takes minutes (it is compared exactly below)
    res = evaluate(model, loader, ["clean", "pgd20", "aa"], eps=0.2, alpha=0.02, classes=classes,
                   state_prefix=tmp_path / "full", aa_backend="torchattacks")
    aa, pgd = np.array(res["aa"]["per_class"]), np.array(res["pgd20"]["per_class"])
    assert (aa <= pgd).all(), (aa, pgd)
    rec = res["aa"]["autoattack"]
    assert rec["backend"] == "torchattacks" and rec["version"] == "standard" and rec["precision"] == "fp32"
    assert rec["seed"] == 0 and rec["recheck"]["prediction_mismatches"] == 0 and rec["recheck"]["images"] == 20
    assert rec["settings"] == autoattack.standard_settings(10) and not rec["resumed"]
    after = [rec["robust_after"][k] for k in ("clean", *autoattack.SUBATTACKS)]
    assert after == sorted(after, reverse=True) and after[0] == pytest.approx(res["clean"]["summary"]["avg"])
    assert after[-1] == pytest.approx(res["aa"]["summary"]["avg"])
    assert 0 < after[-1] < after[0]  # the model keeps some robustness and AA removes some of it
    assert (tmp_path / "full.aa.npz").is_file()


def test_resumes_from_saved_flags_and_ignores_stale_ones(tmp_path, monkeypatch):
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (cheap_aa_backend, "test stand-in"))
    model, loader, cfg, classes = _model_and_loader(n_per_class=6, batch=15)
    kw = dict(eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=classes, aa_backend="cheap")
    said = []
    full = evaluate(model, loader, ["aa"], state_prefix=tmp_path / "full", log=said.append, **kw)["aa"]
    after = full["autoattack"]["robust_after"]
    # one line as each sub-attack ends, with the robust accuracy it left and the least robust class
    done = [line for line in said if line.startswith("AutoAttack ")]
    assert [line.split()[1] for line in done] == list(autoattack.SUBATTACKS)
    for line, name in zip(done, autoattack.SUBATTACKS):
        worst = line.split("worst class")[1].rsplit(" ", 2)[0].strip(" :")  # "worst class: cat 21.3 %" or "3: 0.0 %"
        assert f"robust accuracy {after[name]:.2f}%, worst class" in line and worst in classes  # named
    calls = {"apgd-ce": 0}

    def cut_after_one_apgd_batch(model, eps, num_classes, seed):  # the same backend, stopped in apgd-ce's 2nd batch
        bk = cheap_aa_backend(model, eps, num_classes, seed)
        attack = bk.attacks["apgd-ce"]

        def once(x, y):
            calls["apgd-ce"] += 1
            if calls["apgd-ce"] == 2:
                raise KeyboardInterrupt
            return attack(x, y)
        bk.attacks["apgd-ce"] = once
        return bk

    monkeypatch.setitem(autoattack.BACKENDS._items, "cut", (cut_after_one_apgd_batch, "test stand-in"))
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, loader, ["aa"], state_prefix=tmp_path / "cut", **{**kw, "aa_backend": "cut"})
    with np.load(tmp_path / "cut.aa.npz") as f:
        assert f["tried"][0].any() and not f["tried"][0].all() and not f["tried"][1:].any()
    resumed = evaluate(model, loader, ["aa"], state_prefix=tmp_path / "cut", **kw)["aa"]
    assert resumed["autoattack"]["resumed"]
    assert resumed["confusion"] == full["confusion"]
    assert resumed["autoattack"]["robust_after"] == full["autoattack"]["robust_after"]
    # other weights: the saved flags do not belong to them and are not reused
    with torch.no_grad():
        model.head.bias.add_(0.01)
    assert not evaluate(model, loader, ["aa"], state_prefix=tmp_path / "cut", **kw)["aa"]["autoattack"]["resumed"]


def test_worst_class_after_counts_points_no_sub_attack_so_far_broke():
    y = np.array([0, 0, 1, 1, 2])
    broken_by = np.array([autoattack.ROBUST, 2, autoattack.ROBUST, autoattack.ROBUST, 1], dtype=np.int8)
    assert autoattack._worst_class_after(broken_by, y, 0, 4) == (2, 0.0)  # class 2 broken by the first; 3 absent
    assert autoattack._worst_class_after(broken_by[:4], y[:4], 1, 4) == (0, 50.0)  # the second broke one of 0's


@pytest.mark.slow
def test_matches_the_official_package_exactly_per_class_and_per_image():
    model, x, y, _ = tiny_linear_case()
    eps = TINY_AA["eps"]
    res, prefix = tiny_linear_aa()  # fastfair eval's, shared with test_api
    official = pyautoattack.AutoAttack(model, norm="Linf", eps=eps, version="standard", seed=0, device="cpu")
    x_adv, y_adv = official.run_standard_evaluation(x.float() / 255, y, batch_size=len(y))
    want = np.bincount(y.numpy() * 10 + y_adv.numpy(), minlength=100).reshape(10, 10)
    assert np.array_equal(np.array(res["confusion"]), want)
    assert 0 < res["summary"]["avg"] < res["autoattack"]["robust_after"]["clean"]  # AA broke some, not all
    with np.load(f"{prefix}.aa.npz") as f:  # the same images, bit for bit
        assert np.array_equal(f["pred"], y_adv.numpy())
        assert torch.equal(torch.from_numpy(f["adv"]), x_adv[f["adv_index"]])
    rec = res["autoattack"]
    assert (rec["backend"], rec["backend_version"], rec["seed"]) == ("pyautoattack", pyautoattack.__version__, 0)
    assert rec["settings"] == autoattack.standard_settings(10)
    assert rec["recheck"] == {"images": 10, "prediction_mismatches": 0, "outside_eps_ball": 0, "outside_0_1": 0,
                              "max_linf": pytest.approx(rec["recheck"]["max_linf"])}
    assert 0 < rec["recheck"]["max_linf"] <= eps + autoattack.BALL_TOLERANCE


def test_official_backend_is_the_default_and_its_objects_are_read_back():
    assert autoattack.default_backend() == "pyautoattack"
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 10))
    bk = autoattack.build_backend(model, 8 / 255, 10, seed=7)
    assert (bk.name, bk.version, bk.seed) == ("pyautoattack", "0.2.0", 7)
    assert bk.settings == autoattack.standard_settings(10)


def test_without_the_official_package_auto_names_the_install(monkeypatch):
    from fastfair.errors import UserError

    monkeypatch.setattr(autoattack.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match="pip install pyautoattack"):
        autoattack.default_backend()


def _flags_after(model, x, eps):
    """Flags as a run that broke image 0 with a small step would leave them."""
    xf = x.float() / 255
    adv = xf.clone()
    adv[0] = (adv[0] + eps).clamp(0, 1)
    with torch.no_grad():
        pred = model(adv).argmax(1).numpy()
    broken = np.full(len(x), autoattack.ROBUST, np.int8)
    broken[0] = 1
    return xf, autoattack.Flags(broken, pred, np.ones((4, len(x)), bool), adv.numpy(), "fp")


def test_recheck_passes_a_consistent_result_and_refuses_a_disagreement():
    from fastfair.errors import UserError

    model, x, y, _ = tiny_linear_case()
    xf, flags = _flags_after(model, x, 0.02)
    assert autoattack.recheck(model, xf, flags, 0.02, 4)["prediction_mismatches"] == 0
    flags.pred[3] = (flags.pred[3] + 1) % 10  # a flag that a clean pass does not reproduce
    with pytest.raises(UserError, match="1 predict differently"):
        autoattack.recheck(model, xf, flags, 0.02, 4)
    xf, flags = _flags_after(model, x, 0.05)  # image 0 moved by 0.05 > eps
    with pytest.raises(UserError, match="1 lie outside the eps-ball"):
        autoattack.recheck(model, xf, flags, 0.02, 4)


class _Timed(torch.nn.Module):
    """A 4-class linear model whose passes take simulated time: a forward 1 s, one with a backward to its input 2 s
    more (a cost the progress units do not assume exactly: they count a backward as two forwards)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin, self.t = torch.nn.Linear(3 * 4 * 4, 4), 0.0

    def forward(self, x):
        self.t += 3.0 if x.requires_grad else 1.0
        return self.lin(x.flatten(1))


def test_the_eta_follows_the_work_of_every_sub_attack(monkeypatch, capsys):
    """The official sub-attacks on a model whose passes take simulated time: each ETA said, from the first plain line
    on (and each 'left' line as a sub-attack ends), is within a factor 1.5 of the time the run then still took."""
    import io

    from fastfair.data import DeviceLoader
    from fastfair.evaluation.per_class import progress_units
    from fastfair.progress import Progress

    model = _Timed().eval()
    x = torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8)
    with torch.no_grad():
        y = model.lin(x.float().flatten(1) / 255).argmax(1)
    y[::4] = (y[::4] + 1) % 4  # two clean mistakes: dropped from the plan as the clean pass finds them
    loader = DeviceLoader(x, y, 8, device="cpu", train=False)
    monkeypatch.setattr(autoattack.time, "perf_counter", lambda: model.t)

    p = Progress(enabled=True, every_s=500.0, clock=lambda: model.t)
    p.console.file = io.StringIO()  # not a terminal: plain lines, each said at a simulated time
    said = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 4-class linear model: a second thread only waits (and spins on a shared machine)
    try:
        with p.task("eval aa", progress_units(["aa"], 4), unit="pass") as ticks:
            evaluate(model, loader, ["aa"], eps=0.02, alpha=0.01, classes=list("abcd"), progress=ticks,
                     log=lambda line: said.append((model.t, line)))
    finally:
        torch.set_num_threads(threads)
    end = model.t
    assert ticks.done == ticks.total  # what was planned and not needed was dropped, the rest counted
    lines = [line for line in capsys.readouterr().out.splitlines() if "ETA" in line]
    etas = [float(sum(int(v) * 60 ** i for i, v in enumerate(reversed(line.split("ETA ")[1].split(":")))))
            for line in lines]
    times = [500.0 * (i + 1) for i in range(len(lines))]  # a line every 500 simulated seconds
    left = [(t, line) for t, line in said if line.startswith("AutoAttack: ") and " left, " in line]
    assert len(lines) > 5 and [line.split(" left, ")[0] for _, line in left] == [
        "AutoAttack: apgd-t, fab-t, square", "AutoAttack: fab-t, square", "AutoAttack: square"]
    for t, line in left:
        etas.append(float(sum(int(v) * 60 ** i for i, v in enumerate(reversed(line.split("about ")[1].split()[0]
                                                                               .split(":"))))))
        times.append(t)
    for eta, t in zip(etas, times):
        assert (end - t) / 1.5 <= eta <= 1.5 * (end - t), (eta, end - t, t)
