"""Issue 58, item 8: values every path accepted silently, now refused in one line naming the fix.

Each key declares its valid range once (a core key's row of fastfair.checks.RANGES, a method's or option's
``Key(valid=...)``), and every path checks it: ``--set`` and config files (fastfair train, in-process here), the Python
API (fastfair.train), and ``fastfair tune``'s space. Labels with a gap ({0..8, 12}) are refused where the .npz is read.
"""
from __future__ import annotations

import numpy as np
import pytest

import fastfair
from fastfair import checks, config
from fastfair.errors import UserError
from fastfair.methods import METHODS, OPTIONS
from fastfair.tuning import space
from helpers import NPZ_TRAIN, small_npz
from helpers import fastfair as run_cli


def _error_line(result) -> str:
    """The one ``fastfair: error:`` line a refused command prints (and nothing else on stderr)."""
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fastfair: error:"), result.stderr
    return lines[0]


def test_labels_with_a_gap_are_refused(tmp_path):
    """{0..8, 12}: a 13-class model with classes 9-11 taught by no image; refused (not warned: the meant use of an
    untaught class is data.drop_classes, which labels every table), naming both fixes."""
    y = np.arange(200) % 10
    y[y == 9] = 12
    npz = small_npz(tmp_path, y_train=y, y_test=np.arange(40) % 9)
    args = [a.format(tmp=tmp_path) for a in NPZ_TRAIN]
    line = _error_line(run_cli("train", *args, "--epochs", "1", "--out", tmp_path / "run"))
    assert f"{npz}: y_train has no image of class 9, 10, 11 of 13" in line
    assert "0..9 without gaps" in line and "data.drop_classes" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("value", ["inf", "-inf", "nan"])
def test_lr_must_be_finite(tmp_path, value):
    """train.lr=inf passed ``above 0``, then diverged, and the divergence message suggested --set train.lr=inf."""
    line = _error_line(run_cli("train", "--config", "demo", "--set", f"train.lr={value}", "--out", tmp_path / "r"))
    assert line.endswith(f"train.lr={float(value)!r} is out of range: it must be above 0 and finite")


def test_cw_kappa_may_be_infinite():
    """inf is a meaning of its own for CW's kappa (the margin unclamped), so that key alone keeps it."""
    cfg = config.resolve("demo", {}, ["eval.cw_kappa=inf"])
    checks.check_config(cfg)


def test_negative_trades_weight_is_refused_by_every_path(tmp_path):
    """method.kl_weight=-3 trained a negative TRADES weight: --set, a config file and the Python API refuse it."""
    want = "method.kl_weight=-3.0 is out of range: it must be at least 0 and finite"
    assert _error_line(run_cli("train", "--method", "trades", "--dataset", "digits", "--set", "method.kl_weight=-3",
                               "--out", tmp_path / "a")).endswith(want)
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[method]\nname = "trades"\nkl_weight = -3\n[data]\ndataset = "digits"\n')
    assert _error_line(run_cli("train", "--config", cfg_file, "--out", tmp_path / "b")).endswith(want)
    with pytest.raises(UserError, match=want.replace("(", r"\(")):
        fastfair.train(method="trades", dataset="digits", sets={"method.kl_weight": -3}, out=tmp_path / "c")
    # a list key is checked value by value; an option's key too
    with pytest.raises(UserError, match=r"method.kl_weight_per_class=\[1.0, -1.0\] is out of range"):
        checks.check_config(config.resolve(None, {"method.name": "trades", "data.dataset": "digits"},
                                           ["method.kl_weight_per_class=[1.0, -1.0]"]))
    with pytest.raises(UserError, match="he.pmax_start=1.5 is out of range: it must be within"):
        checks.check_config(config.resolve("demo", {}, ["he.pmax_start=1.5"]))


def _space(tmp_path, text):
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_tune_space_out_of_range_is_refused(tmp_path):
    """A --space range [-5, 5] for method.kl_weight would draw negative TRADES weights: refused, as a choice is."""
    path = _space(tmp_path, '[space."method.kl_weight"]\nlow = -5\nhigh = 5\nscale = "linear"\n')
    with pytest.raises(UserError, match=r"method.kl_weight: low -5 is out of the key's range: it must be at "
                                        r"least 0 and finite"):
        space.load_space(path, "trades")
    with pytest.raises(UserError, match="a choice -1.0 is out of the key's range"):
        space.load_space(_space(tmp_path, '[space."method.kl_weight"]\nchoices = [1, -1]\n'), "trades")
    assert space.load_space(_space(tmp_path, '[space."method.kl_weight"]\nlow = 0\nhigh = 5\nscale = "linear"\n'),
                            "trades")["method.kl_weight"].low == 0.0


def test_tune_space_choices_with_a_range_is_refused(tmp_path):
    """Both choices and low/high: the range was dropped without a word; now one line says to give one of them."""
    path = _space(tmp_path, '[space."method.kl_weight"]\nchoices = [1, 6]\nlow = 1\nhigh = 20\n')
    with pytest.raises(UserError, match=r"method.kl_weight: give choices = \[...\] or low and high, not both"):
        space.load_space(path, "trades")


def test_every_declared_default_and_tune_range_is_within_its_key_range():
    """Every default, every preset-free method default and every declared ``fastfair tune`` range obeys its key's
    rule, so the rule refuses only what a user set (checked over every method and option)."""
    for name in METHODS:
        cls = METHODS.get(name)
        for k, key in cls.keys_all().items():
            rule = checks.valid_range(f"method.{k}", name)
            if rule is None:
                continue
            assert rule.ok(cls.defaults.get(f"method.{k}", key.default)), (name, k)
            if key.tune is not None and key.tune.scale != "choice":
                assert rule.ok(key.tune.low) and rule.ok(key.tune.high), (name, k, key.tune)
    for name in OPTIONS:
        for k, key in OPTIONS.get(name).keys.items():
            if key.valid is not None:
                assert key.valid.ok(key.default), (name, k)
                if key.tune is not None and key.tune.scale != "choice":
                    assert key.valid.ok(key.tune.low) and key.valid.ok(key.tune.high), (name, k, key.tune)
