"""Search spaces of `fastfair tune` (issue 51 item 2): declared beside the keys, overridden by a TOML file, checked."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fastfair import config
from fastfair.cli import app
from fastfair.errors import UserError
from fastfair.methods import METHODS, OPTIONS
from fastfair.preset_files import preset_names
from fastfair.schema import Tune
from fastfair.tuning.space import checked, default_space, describe, load_space, suggest
from helpers import needs_extra

optuna = needs_extra("tune", "optuna")

optuna.logging.set_verbosity(optuna.logging.WARNING)


def inside(value, tune: Tune) -> bool:
    return value in tune.choices if tune.scale == "choice" else tune.low <= value <= tune.high


def test_every_method_has_a_default_space_or_says_why():
    for name in METHODS:
        why = METHODS.get(name).why_untuned()
        if why:
            with pytest.raises(UserError, match="no default search space") as err:
                default_space(name)
            assert why in str(err.value)
        else:
            assert default_space(name), name
    assert METHODS.get("pgd-at").why_untuned() and not METHODS.get("me-at").why_untuned()  # not inherited


def test_declared_ranges_are_valid_and_hold_the_defaults():
    from fastfair import schema
    for name in METHODS:
        cls = METHODS.get(name)
        types = schema.field_types(cls.section())
        for key, tune in cls.tunes().items():
            assert tune.source, (name, key)
            assert checked(f"{name} method.{key}", tune, types[key]) == tune  # bounds in the key's type
            assert inside(cls.defaults.get(f"method.{key}", cls.keys_all()[key].default), tune), (name, key)
    for name in OPTIONS:
        option = OPTIONS.get(name)
        types = schema.field_types(option.section())
        for key, declared in option.keys.items():
            if declared.tune is None:
                continue
            checked(f"{name}.{key}", declared.tune, types[key])
            # the option's default and each method's value for it (CFA's lambda_1: 0.3 TRADES, 0.7 FAT)
            values = {declared.default} | {METHODS.get(m).defaults[f"{name}.{key}"] for m in METHODS
                                           if f"{name}.{key}" in METHODS.get(m).defaults}
            assert all(inside(v, declared.tune) for v in values), (name, key, values)


def test_the_presets_values_lie_inside_the_default_ranges():
    seen = 0
    for preset in preset_names():
        flat = config.read_preset(preset)
        if "method.name" not in flat or METHODS.get(flat["method.name"]).why_untuned():
            continue
        options = [o for o in OPTIONS if flat.get(f"{o}.enabled") is True]
        for key, tune in default_space(flat["method.name"], options).items():
            if key in flat:
                seen += 1
                assert inside(flat[key], tune), (preset, key, flat[key], tune.span)
    assert seen >= 10  # the presets do set knobs (ME-TRADES' lambda, CFA's lambdas, ...)


def test_default_spaces_join_the_enabled_options():
    assert set(default_space("trades")) == {"method.kl_weight"}
    assert default_space("trades")["method.kl_weight"].scale == "log"
    assert set(default_space("trades", ["ccm", "ccr"])) == {"method.kl_weight", "ccm.lambda_1", "ccr.lambda_2"}
    assert set(default_space("trades", ["ccm", "ccr", "fawa"])) == {"method.kl_weight", "ccm.lambda_1", "ccr.lambda_2"}
    assert set(default_space("dafa-trades")) == {"method.kl_weight", "method.dafa_lambda"}
    assert set(default_space("pgd-at", ["ccm", "fawa"])) == {"ccm.lambda_1"}  # CFA-AT: the method lends no knob
    assert "ccm.lambda_1" in default_space("fair-tat")  # its defaults switch CCM on
    with pytest.raises(UserError, match="unknown option 'cmm'.*Did you mean ccm"):
        default_space("trades", ["cmm"])


def write(tmp_path, text: str):
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_a_space_file_overrides_and_adds(tmp_path):
    path = write(tmp_path, '[space."method.kl_weight"]\nhigh = 30\n\n'
                           '[space."method.smoothing"]\nlow = 0\nhigh = 0.2\nsource = "ME paper Table 1"\n\n'
                           '[space."method.normalize"]\nchoices = [true, false]\n\n'
                           '[space."ccm.begin"]\nlow = 2\nhigh = 20\nscale = "int"\n')
    space = load_space(path, "trades", ["ccm"])
    assert space["method.kl_weight"] == Tune(1.0, 30.0, "log", (), f"space file {path}")  # low and scale kept
    assert space["method.smoothing"] == Tune(0.0, 0.2, "linear", (), "ME paper Table 1")
    assert space["method.normalize"].choices == (True, False) and space["method.normalize"].scale == "choice"
    assert space["ccm.begin"] == Tune(2, 20, "int", (), f"space file {path}")
    assert space["ccm.lambda_1"] == default_space("trades", ["ccm"])["ccm.lambda_1"]  # the default stays
    assert load_space(write(tmp_path, '[space."method.smoothing"]\nlow = 0\nhigh = 0.2\n'), "pgd-at")  # adds to none


@pytest.mark.parametrize("text, method, options, says", [
    ('[space."method.kl_weight"]\nlow = 10\nhigh = 2\n', "trades", [], ["method.kl_weight", "must be below high"]),
    ('[space."method.kl_weight"]\nlow = 0\nhigh = 2\nscale = "log"\n', "trades", [],
     ["method.kl_weight", "needs low > 0", 'scale = "linear"']),
    ('[space."method.kl_weight"]\nlow = 1\nhigh = 2\nscale = "cubic"\n', "trades", [],
     ["method.kl_weight", "unknown scale 'cubic'", "linear, log, int, choice"]),
    ('[space."method.kl_weight"]\nchoices = [6]\n', "trades", [], ["method.kl_weight", "at least 2", "--set"]),
    ('[space."method.kl_weight"]\nchoices = [1, "six"]\n', "trades", [], ["method.kl_weight", "takes a float"]),
    ('[space."method.kl_weight"]\nlow = 1\nhigh = 9\nscale = "int"\n', "trades", [],
     ["method.kl_weight", "takes a float", '"linear" or "log"']),
    ('[space."method.tau"]\nlow = 0.5\nhigh = 3.0\nscale = "int"\n', "fat", [],
     ["method.tau", "integer bounds"]),
    ('[space."method.tau"]\nlow = 0\nhigh = 3\nscale = "linear"\n', "fat", [], ["method.tau", 'scale = "int"']),
    ('[space."method.normalize"]\nlow = 0\nhigh = 1\n', "trades", [], ["method.normalize", "choices = ["]),
    ('[space."method.kl_weight_per_class"]\nlow = 0\nhigh = 1\n', "trades", [],
     ["method.kl_weight_per_class", "takes a list"]),
    ('[space."method.kl_weight"]\nlow = 1\nhigh = 2\nstep = 1\n', "trades", [],
     ["method.kl_weight", "unknown field 'step'"]),
    ('[space."method.kl_wieght"]\nlow = 1\nhigh = 2\n', "trades", [],
     ["method.kl_wieght", "unknown key", "Did you mean method.kl_weight"]),
    ('[space."method.rho"]\nlow = 0.1\nhigh = 1\n', "trades", [],
     ["method.rho", "a key of faal-at, faal-trades", "trades does not read"]),
    ('[space."ccr.lambda_2"]\nlow = 0.1\nhigh = 1\n', "trades", ["ccm"],
     ["ccr.lambda_2", "does not read it", "trades+ccm+ccr"]),
    ('[space."train.avg_threshold"]\nlow = 0.1\nhigh = 0.3\n', "trades", [],
     ["train.avg_threshold", "trades+fawa"]),
    ('[space."train.lr"]\nlow = 0.01\nhigh = 0.2\n', "trades", [], ["train.lr", "not a knob", "--set"]),
    ('[spaces."method.kl_weight"]\nlow = 1\nhigh = 2\n', "trades", [], ["unknown table 'spaces'"]),
    ('[space]\n"method.kl_weight" = 3\n', "trades", [], ["method.kl_weight", "must be a table"]),
    ('[space."method.kl_weight"\nlow = 1\n', "trades", [], ["is not TOML", '[space."method.kl_weight"]']),
    ("[space]\n", "pgd-at", [], ["pgd-at has no default search space", "me-at"]),
])
def test_a_bad_space_file_is_one_line_naming_the_key_and_the_fix(tmp_path, text, method, options, says):
    with pytest.raises(UserError) as err:
        load_space(write(tmp_path, text), method, options)
    message = str(err.value)
    assert "\n" not in message
    for part in says:
        assert part in message, (part, message)


def test_suggest_draws_each_key_inside_its_range_and_type():
    space = {**default_space("fat", ["ccm"]), "method.omega": Tune(1e-4, 1e-2, "log"),
             "method.stop_rule": Tune(scale="choice", choices=("fat", "cfa")),
             "method.entropy_weight": Tune(0.0, 1.0)}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        values = suggest(trial, space)
        assert set(values) == set(space) and values == trial.params  # named by the full key
        study.tell(trial, 0.0)
        for key, value in values.items():
            assert inside(value, space[key]), (key, value)
        assert type(values["method.tau"]) is int and type(values["ccm.lambda_1"]) is float
    taus = {t.params["method.tau"] for t in study.trials}
    assert taus <= {0, 1, 2, 3} and len(taus) > 1
    omegas = [t.params["method.omega"] for t in study.trials]
    assert sum(o < 1e-3 for o in omegas) >= 5  # log scale: the lower decade is drawn as often as the upper
    fixed = {"method.tau": 2, "ccm.lambda_1": 0.4, "method.omega": 0.002, "method.stop_rule": "cfa",
             "method.entropy_weight": 0.5}
    assert suggest(optuna.trial.FixedTrial(fixed), space) == fixed


def test_describe_gives_one_line_per_key():
    lines = describe(default_space("trades", ["ccm"]))
    assert len(lines) == 2
    assert lines[0].startswith("method.kl_weight  log [1, 15]") and "ME paper Sec. 3.2.2" in lines[0]
    assert lines[1].startswith("ccm.lambda_1      linear [0.3, 0.7]") and "CFA Fig. 5(a)" in lines[1]
    assert describe({"he.schedule": Tune(scale="choice", choices=("lis", "cmp"))}) == ["he.schedule  choice [lis, cmp]"]


def test_fastfair_methods_shows_each_knobs_range_after_its_default():
    out = CliRunner().invoke(app, ["methods"]).output
    kl = next(line for line in out.splitlines() if line.strip().startswith("method.kl_weight") and "ME paper Sec. 3.2.2"
              in line)
    assert "(default 6.0) (tune: log [1, 15], ME paper Sec. 3.2.2" in kl
    assert "(no tune space)" in out and METHODS.get("pgd-at").why_untuned() in out
    markdown = CliRunner().invoke(app, ["methods", "--markdown"]).output
    row = "| trades | `method.kl_weight` | `6.0` | at least 0 and finite | log [1, 15]: ME paper Sec. 3.2.2"
    assert row in markdown  # its valid range, then its tune space
    assert f"- pgd-at: {METHODS.get('pgd-at').why_untuned()}" in markdown
