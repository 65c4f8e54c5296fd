"""Every preset resolves to the same run as before methods and options declared their own keys (issue 11).

``tests/data/presets-resolved-before-issue-11.json`` holds each preset's resolved config as the
old code flattened it. Old keys map to new ones through ``config.RENAMED`` (the map saved runs
load through too); the only other differences allowed are spelled out here, each with its reason
(:data:`CHANGED`).
"""
import json
from pathlib import Path

import pytest

from fastfair import config
from fastfair.methods import METHODS
from fastfair.preset_files import preset_names

BEFORE = json.loads((Path(__file__).parent / "data" / "presets-resolved-before-issue-11.json").read_text())


def expected(old: dict) -> tuple[dict, dict]:
    """(new key -> value the new config must hold, old keys the new config rightly lacks -> why)."""
    method_keys = METHODS.get(old["method.name"]).keys_all()
    want, gone = {}, {}
    for key, value in old.items():
        for new in config.RENAMED.get(key, (key,)):
            section, _, name = new.partition(".")
            if section == "method" and name != "name" and name not in method_keys:
                # The old flat section held every method's keys; this method never read this one.
                gone[key] = f"not read by method {old['method.name']}"
            else:
                want[new] = value
    # The old TRADES divided by (1 + beta_y) under CCR whatever kl_normalize said (old trades.py:
    # `scale = ... if (m.ccr or m.kl_normalize)`); CCR now says so through its defaults.
    if "method.normalize" in want:
        want["method.normalize"] = old["method.kl_normalize"] or old["method.ccr"]
    # train.cudagraphs took true / false (off by default); it takes auto | on | off since issue 42, and no preset sets
    # it: auto, on for CUDA runs that compile (where it runs the same computation; build.cudagraphs)
    if want.get("train.cudagraphs") is False:
        want["train.cudagraphs"] = "auto"
    return want, gone


_FRL_CODE = ("FRL authors' code, frlrmrw.py / data_loader.py (issue 25: the preset said it followed it, "
             "but held other values)")
_FRL_25 = {
    "method.kl_weight": (1.5, f"beta 1.5: {_FRL_CODE}"),
    "method.bound": (0.07, f"bound0 = bound1 = 0.07: {_FRL_CODE}"),
    "method.rate_margin": (0.2, f"rate2 0.2: {_FRL_CODE}"),
    "train.epochs": (40, f"40 epochs: {_FRL_CODE}"),
    "data.val_per_class": (300, f"300 validation images per class: {_FRL_CODE}"),
}
# Keys issue 25 added (the old code had neither: its FAT stepped by FAT's own rule without noise).
_CFA_FAT = {
    "method.stop_rule": ("cfa", "CFA's code (attack.py fat_loss) moves a sample only while its budget is positive; "
                                "FAT's rule, the new key's default, steps once more"),
    "method.omega": (0.0, "CFA's code adds no step noise; FAT's code (earlystop.py), the new key's default, "
                          "adds 0.001 N(0, I)"),
}
# Keys issue 25 added to follow CFA's own code (tests/conformance_setup.py): the presets that follow it set them.
_CFA_SETUP = {
    "data.crop_mode": ("reflect", "CFA's code crops from a reflection-padded image (generate_validation.py, "
                                  "RandomCrop(padding_mode='reflect')); the new key's default pads with zeros"),
    "train.select_begin": (100, "CFA's code keeps no model before epoch epochs / 2 (train.py: `if epoch >= 0.5 * "
                                "args.epochs`); the new key's default considers every epoch"),
}
CFA_CODE_PRESETS = ("cfa-t1-at-cfa-code", "cfa-t1-at-ema-code", "cfa-t1-fat-cfa-code", "cfa-t1-fat-ema-code",
                    "cfa-t1-trades-cfa-code", "cfa-t1-trades-ema-code", "cfa-t1-trades-code", "cfa-t2-fat-ccm-code",
                    "cfa-t2-trades-ccm-ccr-code", "cfa-t2-trades-ccm-code", "cfa-t3-at-fawa-code",
                    "cfa-t3-fat-fawa-code", "cfa-t3-trades-fawa-code")
# Values changed or keys added on purpose after the snapshot: preset -> {key: (new value, why)}. Each
# must differ from the snapshot (a stale entry fails), and nothing else may.
CHANGED: dict[str, dict[str, tuple[object, str]]] = {
    "cfa-t1-frl": _FRL_25,
    "cfa-t1-frl-ema": {**_FRL_25, "train.avg_begin": (0, "EMA from epoch 0: CFA's epoch 50 is never reached in FRL's "
                                                         "40-epoch fine-tune (issue 25)")},
    **{p: _CFA_FAT for p in ("cfa-t1-fat", "cfa-t1-fat-cfa-code", "cfa-t1-fat-cfa-paper", "cfa-t1-fat-ema-code",
                             "cfa-t1-fat-ema-paper", "cfa-t2-fat-ccm-code", "cfa-t2-fat-ccm-paper",
                             "cfa-t3-fat-fawa-code", "cfa-t3-fat-fawa-paper")},
    "tian-iclr-t5-he": {"he.weight_norm": ("data", "the preset follows Pang et al.'s PGD-HE code, whose forward "
                                                   "overwrites fc.weight.data with its normalised rows (issue 25)")},
}
# Table 6's Temperature-PGD-20 columns joined the Table 5 rows' evaluation (issue 29)
_T6 = ["tpgd20@t0.2", "tpgd20@t0.02", "tpgd20@t0.013333", "tpgd20@t0.01", "tpgd20@t0.008", "tpgd20@t0.006667",
       "tpgd20@t0.005", "tpgd20@t0.003333"]
_T6_DESCRIPTION = {  # the description names Table 6 too
    "tian-iclr-t5-he": "Tian et al. ICLR sub. Table 5 row 'HE' (target: nat 83.1, PGD-20 60.7); PGD-AT + HE s 10, "
                       "m 0.2, with its Table 6 row: follows Pang et al.'s PGD-HE (the paper gives no s, m)",
    "tian-iclr-t5-he-lis": "Tian et al. ICLR sub. Table 5 row 'HE-LIS' (target: nat 84.6, PGD-20 63.9), with its "
                           "Table 6 row; follows the paper",
    "tian-iclr-t5-he-cmp": "Tian et al. ICLR sub. Table 5 row 'HE-CMP' (target: nat 84.4, PGD-20 69.9), with its "
                           "Table 6 row; follows the paper"}
for _p, _text in _T6_DESCRIPTION.items():
    CHANGED[_p] = {**CHANGED.get(_p, {}),
                   "eval.attacks": (["clean", "pgd20", "cw20", "tpgd20@t0.1", *_T6],
                                    "ICLR Table 6's 1/T columns evaluated too (issue 29)"),
                   "preset": (_text, "the description names Table 6 too (issue 29)")}
# Tian et al. ICLR Sec. 3 keeps the 75th epoch's model and evaluates PGD-20 with step 0.007; App. G keeps Sec. 3 for
# Table 5 (App. E's 0.003 is Table 2's) (issue 41 items 2 and 3)
for _p in ("tian-iclr-t5-he", "tian-iclr-t5-he-lis", "tian-iclr-t5-he-cmp"):
    CHANGED[_p] = {**CHANGED[_p], "train.select": ("epoch", "the 75th epoch's model (ICLR Sec. 3; issue 41)"),
                   "train.select_epoch": (75, "the 75th epoch's model (ICLR Sec. 3; issue 41)"),
                   "eval.alpha": (0.007, "PGD-20 step 0.007 (ICLR Sec. 3 and App. G; issue 41)")}
_KDD_SEC6 = ("Sec. 6's baseline numbers are KDD Table 3's TRADES WideResNet's (tian-kdd-t1-trades: the TRADES "
             "code's schedule, its last epoch); Sec. 6 re-trains that model (issue 50)")
CHANGED["tian-kdd-fig4c-trades-beta5-0.5"] = {"model.name": ("wrn-32-10", _KDD_SEC6), "train.epochs": (76, _KDD_SEC6),
                                             "train.lr_milestones": ([74], _KDD_SEC6),
                                             "train.select": ("last", _KDD_SEC6)}
CHANGED["me-fig5-binary-cat-dog-trades"] = {"preset": (
    "ME paper Fig. 5(b) binary TRADES cat vs dog, the most similar pair (target: 23.4 nat and 44.0 PGD-10 error); "
    "follows the paper", "the description names the errors the text gives (issue 41)")}
for _p in CFA_CODE_PRESETS:
    CHANGED[_p] = {**CHANGED.get(_p, {}), **_CFA_SETUP}
# ME paper App. A.1: the single-AT models have 2-D penultimate features and a bias-free fc layer (issue 41, Fig. 3)
for _p, _what in (("me-fig3-single-at-car",
                   "3(a) single AT of class 1 (automobile) (target: car nat 98.4, PGD-10 72.2)"),
                  ("me-fig3-single-at-cat", "3(b) single AT of class 3 (cat) (target: cat nat 7.03, PGD-10 0)")):
    CHANGED[_p] = {"model.feature_dim": (2, "2-D features (ME paper App. A.1; issue 41)"),
                   "model.head": ("linear-nobias", "the fc layer without bias (ME paper App. A.1; issue 41)"),
                   "preset": (f"ME paper Fig. {_what}; follows the paper: 2-D features",
                              "the description says the features are 2-D as the paper's (issue 41)")}


@pytest.mark.parametrize("preset", sorted(BEFORE))
def test_preset_resolves_to_the_same_run(preset):
    old = BEFORE[preset]
    new = config.flatten(config.resolve(preset).to_dict())
    want, gone = expected(old)
    for key, (value, _why) in CHANGED.get(preset, {}).items():
        assert want.get(key, "<new key>") != value, f"{preset}: CHANGED[{key!r}] changes nothing"
        want[key] = value
    assert {k: new.get(k, "<missing>") for k in want} == want
    # Nothing new appears but the sections of options that stay off at their declared defaults.
    extra = {k: v for k, v in new.items() if k not in want}
    fresh = config.flatten(config.Config(old["method.name"]).to_dict())
    assert extra == {k: fresh[k] for k in extra}
    assert not config.resolve(preset).enabled_options() or any(
        old.get(k) for k in ("method.ccm", "method.ccr", "method.class_weights", "method.class_weights_auto",
                             "method.adv_classes", "method.he_margin")) or old["model.head"] == "cosine"


# Presets added after issue 11 have no pre-issue-11 form to compare with.
ADDED_AFTER = {"trix-rebuttal-t1-absld", "trix-rebuttal-t1-fair-tat", "trix-rebuttal-t1-bat",
               "trix-rebuttal-t1-trades-cfa",
               "trix-rebuttal-t1-trades-frl", "dafa-t1-trades", "dafa-t1-trades-dafa", "dafa-t1-trades-wat",
               "trix-rebuttal-t1-trades",
               "trix-rebuttal-t1-trades-dafa", "trix-rebuttal-t1-trades-trix", "trix-rebuttal-t1-trades-wat",
               *(f"tian-iclr-t2-{r}" for r in ("madry", "trades", "mart", "standard", "rst", "trades-released",
                                               "mart-released")),
               *(f"tian-kdd-t1-{r}" for r in ("madry", "trades", "mart", "he", "standard")), "tian-iclr-t5-madry",
               *(f"tian-kdd-t5-{d}-{r}" for d in ("mnist", "svhn", "cifar10", "stl10", "cifar100", "imagenet")
                 for r in ("standard", "madry" if d != "imagenet" else "fgsm-rs")),
               "tian-kdd-fig5-madry-mnist-background", "me-table4-trades-ls",
               "tian-kdd-fig4c-trades-beta5-6",
               *(n for n in preset_names() if n.startswith(("me-fig1-", "me-fig4-", "me-fig8-", "me-fig9-"))),
               "me-table1-standard-ls",
               *(n for n in preset_names() if n.startswith("me-fig5-") and "cat-dog" not in n),
               *(n for n in preset_names() if n.startswith(("benz-", "cfa-f", "tian-iclr-fig")))}


def test_every_shipped_preset_is_covered():
    assert sorted(BEFORE) == sorted(set(preset_names()) - ADDED_AFTER)
    assert set(CHANGED) <= set(BEFORE)
