"""Batch-instance norm, class subsets, and the CLI shorthands of the fairness options."""
import pytest
import torch
import torch.nn.functional as F

from fastfair import api, cli, data
from fastfair.data.subsets import select
from fastfair.errors import UserError
from fastfair.models import NORMS


def test_bin_blends_batch_and_instance_norm_by_rho():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 5, 5) * 3 + 1
    norm = NORMS.get("bin")(3)
    with torch.no_grad():
        norm.rho.fill_(1.0)
        assert torch.allclose(norm(x), F.batch_norm(x, None, None, training=True), atol=1e-5)
        norm.rho.fill_(0.0)
        assert torch.allclose(norm(x), F.instance_norm(x), atol=1e-5)
        norm.rho.fill_(7.0)  # rho is clipped into [0, 1] (Nam & Kim 2018)
        assert torch.allclose(norm(x), F.batch_norm(x, None, None, training=True), atol=1e-5)


def test_class_subset_keeps_and_relabels_in_the_given_order():
    b = data.DataBundle("t", torch.zeros(6, 1, 2, 2, dtype=torch.uint8), torch.tensor([0, 3, 5, 3, 1, 5]),
                        torch.zeros(3, 1, 2, 2, dtype=torch.uint8), torch.tensor([5, 2, 3]),
                        [str(i) for i in range(6)])
    s = select(b, [5, 3])
    assert s.y_train.tolist() == [1, 0, 1, 0] and s.y_test.tolist() == [0, 1] and s.classes == ["5", "3"]
    for bad in ([3], [3, 3], [3, 9]):
        with pytest.raises(UserError, match="data.classes"):
            select(b, bad)


def _trained_config(monkeypatch, *argv):
    """The config ``fastfair train ARGV`` would train, caught where training would start."""
    seen = []
    monkeypatch.setattr(api, "fit", lambda cfg, out, resume, quiet: seen.append(cfg))
    assert cli.main(["train", "--method", "trades", "--dataset", "digits", *argv]) == 0
    return seen[0]


def test_cli_shorthands_set_the_config_keys(monkeypatch, capsys):
    cfg = _trained_config(monkeypatch, "--ccm", "--ccr", "--fawa", "--classes", "3,5", "--adv-classes", "1",
                          "--init-from", "a.pt")
    assert (cfg.ccm.enabled, cfg.ccr.enabled, cfg.train.averaging) == (True, True, "fawa")
    assert (cfg.data.classes, cfg.adv_classes.classes, cfg.train.init_from) == ([3, 5], [1], "a.pt")
    plain = _trained_config(monkeypatch)
    assert (plain.ccm.enabled, plain.train.averaging, plain.data.classes) == (False, "none", [])
    capsys.readouterr()
    assert cli.main(["train", "--ema", "--fawa"]) == 2
    assert "--ema and --fawa" in capsys.readouterr().err
    assert cli.main(["train", "--classes", "3,cat"]) == 2
    assert "--classes takes comma-separated class indices" in capsys.readouterr().err


def test_methods_listing_names_every_method_option_and_paper(capsys):
    from fastfair import cli

    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    for name in ("fat", "mart", "frl", "frl-rw", "frl-rm", "ccm", "ccr", "cost_sensitive", "he", "adv_classes",
                 "fawa", "ema"):
        assert f"\n{name} " in out or out.startswith(f"{name} ")
    for paper in ("Wei et al. 2023", "Xu et al. 2021", "Zhang et al. 2020", "Wang et al. 2020", "Pang et al. 2020",
                  "Benz et al.", "Tian et al."):
        assert paper in out
