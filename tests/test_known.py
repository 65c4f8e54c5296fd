"""fastfair.known: the copy of the method and data-set names, config keys, their types and names that the CLI checks
a training command against before it imports torch. The copy is the registries' (regenerated here), and what it
refuses it refuses with the full check's own line (config.resolve, then checks.check_config), in-process."""
import pytest

from fastfair import config, known
from fastfair.checks import check_config, check_value
from fastfair.errors import UserError
from fastfair.preset_files import preset_names

BAD = "nosuch"


def test_known_json_is_the_registries_and_schemas_copy():
    assert known.load() == known.table(), "regenerate: python -m fastfair.known"


def said(check) -> str | None:
    try:
        check()
    except UserError as err:
        return str(err)
    return None


def full_check(preset, flags, sets, names):
    check_config(config.resolve(preset, flags, sets, flag_names=names))


MISTAKES = [
    (None, {"method.name": "NOSUCH"}, [], {"method.name": "--method"}),  # no close name: no hint
    (None, {"method.name": "me-trade"}, [], {"method.name": "--method"}),
    (None, {"method.name": "cfa"}, [], {"method.name": "--method"}),  # an alias: the flags that make it
    (None, {"data.dataset": "cifar"}, [], {"data.dataset": "--dataset"}),
    (None, {"model.name": "resnet"}, [], {"model.name": "--model"}),
    (None, {}, ["nosuch.key=1"], {}),
    ("demo", {}, ["train.lrr=0.1"], {}),
    ("demo", {}, ["train.amp=fp16"], {}),
    (None, {}, ["train.batch_size=64"], {}),  # the right name in another section
    (None, {}, ["method.kl_weight=6"], {}),  # a key of other methods
    (None, {"method.name": "trades"}, ["method.klweight=6"], {"method.name": "--method"}),
    (None, {}, ["method.ccm=true"], {}),  # renamed
    (None, {}, ["learning_rate=0.1"], {}),  # another code base's name
    (None, {}, ["beta=6"], {}),  # ambiguous
    (None, {}, ["train.epochs=two"], {}),
    (None, {}, ["train.lr_milestones=50"], {}),  # a list key given one number
    (None, {}, ["data.classes=[1,x]"], {}),
    (None, {}, ["train.cudagraphs=maybe"], {}),
    (None, {}, ["--set"], {}),  # not key=value
    ("trix-rebuttal-t1-fair-tat", {"train.epochs": 2}, ["method.fp_scale=x"], {"train.epochs": "--epochs"}),
]


@pytest.mark.parametrize("preset, flags, sets, names", MISTAKES, ids=lambda v: str(v)[:40])
def test_the_copy_refuses_a_mistake_with_the_full_checks_line(preset, flags, sets, names):
    line = said(lambda: known.check_train(preset, flags, sets, names))
    assert line is not None and line == said(lambda: full_check(preset, flags, sets, names))


def test_every_named_value_and_registry_is_refused_as_the_full_check_refuses_it():
    for key in [*known.load()["choices"], *known.REGISTRIES]:
        sets = [f"{key}={BAD}"]
        line = said(lambda: known.check_train(None, {}, sets))
        assert line is not None and line == said(lambda: full_check(None, {}, sets, {})), key
    for key in ("train.amp", "data.batch_size", "eval.seed", "train.epochs"):  # a flag's value click refused
        assert said(lambda: known.check_value(key, BAD)) == said(lambda: check_value(key, BAD)), key


def test_what_the_full_check_accepts_the_copy_accepts():
    """Every shipped preset, and flags of every kind over one: nothing refused that would run."""
    for preset in preset_names():
        assert said(lambda: known.check_train(preset, {}, [])) is None, preset
    flags = {"method.name": "trades", "data.dataset": "cifar100", "model.name": "resnet18", "train.epochs": 60,
             "train.compile": "off", "train.averaging": "fawa", "data.classes": [1, 3], "ccm.enabled": True}
    sets = ["lr=0.05", "method.kl_weight=3", "train.cudagraphs=false", "eval.attacks=[\"clean\",\"pgd20\"]",
            "preset=mine"]
    assert said(lambda: known.check_train("demo", flags, sets)) is None
    full_check("demo", flags, sets, {})
