"""AutoAttack: the standard configuration, AA <= PGD-20 on every class, and resuming from saved flags."""
import numpy as np
import pytest
import torch
from evalreport_helpers import digits_run

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
    # one batch: Square's 5000 queries run once (CPU time is dominated by them)
    model, loader, cfg, classes = _model_and_loader(n_per_class=2, batch=20)
    # twice the training radius, so that attacks have points to break
    res = evaluate(model, loader, ["clean", "pgd20", "aa"], eps=0.2, alpha=0.02, classes=classes,
                   state_prefix=tmp_path / "full")
    aa, pgd = np.array(res["aa"]["per_class"]), np.array(res["pgd20"]["per_class"])
    assert (aa <= pgd).all(), (aa, pgd)
    rec = res["aa"]["autoattack"]
    assert rec["backend"] == "torchattacks" and rec["version"] == "standard" and rec["precision"] == "fp32"
    assert rec["settings"] == autoattack.standard_settings(10) and not rec["resumed"]
    after = [rec["robust_after"][k] for k in ("clean", *autoattack.SUBATTACKS)]
    assert after == sorted(after, reverse=True) and after[0] == pytest.approx(res["clean"]["summary"]["avg"])
    assert after[-1] == pytest.approx(res["aa"]["summary"]["avg"])
    assert 0 < after[-1] < after[0]  # the model keeps some robustness and AA removes some of it
    assert (tmp_path / "full.aa.npz").is_file()


def _cheap_backend(model, eps, num_classes):
    """Stand-in sub-attacks (seeded PGD) claiming the standard settings, to test the resume logic quickly."""
    from fastfair.attacks import PGD

    def make(steps, objective):
        def run(x, y):
            torch.manual_seed(steps)
            e = torch.full((num_classes,), eps)
            return PGD(steps=steps, objective=objective)(model, x, y, e, e / 4)
        return run

    attacks = {"apgd-ce": make(1, "ce"), "apgd-t": make(2, "cw"), "fab-t": make(3, "ce"), "square": make(4, "cw")}
    return autoattack.Backend("cheap", attacks, autoattack.standard_settings(num_classes))


def test_resumes_from_saved_flags_and_ignores_stale_ones(tmp_path, monkeypatch):
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (_cheap_backend, "test stand-in"))
    model, loader, cfg, classes = _model_and_loader(n_per_class=6, batch=15)
    kw = dict(eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=classes, aa_backend="cheap")
    full = evaluate(model, loader, ["aa"], state_prefix=tmp_path / "full", **kw)["aa"]
    ticks = {"n": 0}

    def stop_after_one_apgd_batch():
        ticks["n"] += 1
        if ticks["n"] == len(loader) + 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        evaluate(model, loader, ["aa"], state_prefix=tmp_path / "cut", progress=stop_after_one_apgd_batch, **kw)
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
