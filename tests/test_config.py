import pytest

from fastfair import config
from fastfair.errors import UserError
from fastfair.preset_files import preset_names


def test_method_defaults_then_preset_then_flags_then_set(tmp_path):
    preset = tmp_path / "p.toml"
    preset.write_text('preset = "test"\n[method]\nname = "trades"\nkl_weight = 9.0\n[train]\nepochs = 7\n')
    cfg = config.resolve(str(preset), {"train.epochs": 3}, ["method.kl_weight=12", "train.lr_milestones=[1, 2]"])
    assert cfg.method.name == "trades"
    assert cfg.attack.objective == "kl" and cfg.attack.init == "normal" and cfg.attack.bn_mode == "eval"
    assert cfg.method.kl_weight == 12.0 and cfg.train.epochs == 3 and cfg.train.lr_milestones == [1, 2]


def test_me_trades_defaults_follow_the_paper():
    cfg = config.resolve(None, {"method.name": "me-trades"})
    assert (cfg.method.kl_weight, cfg.method.entropy_weight) == (27.0, 1.0)
    at = config.resolve(None, {"method.name": "me-at"})
    assert at.method.entropy_weight == 0.5 and at.attack.bn_mode == "train"


def test_dataset_defaults():
    cfg = config.resolve(None, {"data.dataset": "digits"})
    assert cfg.data.val_per_class == 10 and cfg.data.crop_padding == 0 and cfg.data.flip is False


def test_bare_key_is_qualified_when_unique():
    assert config.resolve(None, {"method.name": "trades"}, ["kl_weight=3"]).method.kl_weight == 3.0
    assert config.resolve(None, None, ["lambda_1=0.2"]).ccm.lambda_1 == 0.2
    with pytest.raises(UserError, match="ambiguous"):
        config.resolve(None, None, ["eps=0.1"])


def test_unknown_key_lists_close_matches():
    with pytest.raises(UserError, match="method.kl_weight"):
        config.resolve(None, {"method.name": "trades"}, ["method.kl_weigth=3"])


def test_a_key_the_method_does_not_read_is_an_error_naming_the_methods_that_do():
    with pytest.raises(UserError, match=r"pgd-at has no key 'kl_weight'.*methods with it: .*trades"):
        config.resolve(None, {"method.name": "pgd-at"}, ["method.kl_weight=6"])


def test_a_renamed_key_names_its_new_name():
    with pytest.raises(UserError, match="renamed to ccm.lambda_1"):
        config.resolve(None, None, ["method.ccm_lambda=0.3"])


def test_a_saved_config_with_old_keys_loads_under_the_new_names():
    old = '[method]\nname = "trades"\nkl_weight = 6.0\nccr = true\ncalibrate_begin = 3\nkl_normalize = true\n'
    cfg = config.load_saved_text(old)
    assert cfg.ccr.enabled and (cfg.ccm.begin, cfg.ccr.begin) == (3, 3) and cfg.method.normalize


def test_an_option_sets_its_defaults_below_the_users_layers():
    assert config.resolve(None, {"method.name": "trades", "ccr.enabled": True}).method.normalize
    off = config.resolve(None, {"method.name": "trades", "ccr.enabled": True}, ["method.normalize=false"])
    assert off.ccr.enabled and not off.method.normalize  # an ablation the user asked for
    assert not config.resolve(None, {"method.name": "trades"}).method.normalize


@pytest.mark.parametrize("item,msg", [("train.epochs=abc", "integer"), ("train.nesterov=1", "true or false"),
                                      ("train.lr_milestones=5", "list"), ("novalue", "key=value")])
def test_bad_values_are_clear(item, msg):
    with pytest.raises(UserError, match=msg):
        config.resolve(None, None, [item])


def test_unknown_method_lists_known():
    with pytest.raises(UserError, match="me-trades"):
        config.resolve(None, {"method.name": "me-tardes"})


def test_roundtrip_through_toml():
    cfg = config.resolve(None, {"method.name": "me-trades"}, ["train.epochs=2"])
    again = config.load_saved_text(cfg.to_toml())
    assert again == cfg


def test_every_shipped_preset_resolves():
    for name in preset_names():
        cfg = config.resolve(name)
        assert cfg.preset, f"preset {name} must say which paper table it reproduces"
