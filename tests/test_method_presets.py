"""The fairness presets in this checkout's configs/ resolve, name their paper row, and pair paper/code variants."""
from pathlib import Path

import pytest

from fastfair import config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FAIRNESS = sorted(p for p in CONFIGS.glob("*.toml") if p.name.startswith(("cfa-", "tian-", "me-fig")))


@pytest.mark.parametrize("path", FAIRNESS, ids=lambda p: p.stem)
def test_fairness_presets_resolve_and_say_what_they_follow(path):
    cfg = config.resolve(str(path))
    assert "Table" in cfg.preset or "Fig." in cfg.preset
    assert "follows" in cfg.preset or "differs" in cfg.preset
    if path.stem.endswith(("-paper", "-code")):
        twin = f"{path.stem.rsplit('-', 1)[0]}-{'code' if path.stem.endswith('-paper') else 'paper'}.toml"
        assert (CONFIGS / twin).is_file()


def test_cfa_paper_and_code_variants_differ_where_the_reference_says():
    paper = config.resolve(str(CONFIGS / "cfa-t1-trades-cfa-paper.toml"))
    code = config.resolve(str(CONFIGS / "cfa-t1-trades-cfa-code.toml"))
    assert (paper.train.avg_decay, paper.train.avg_threshold, paper.train.avg_begin) == (0.85, 0.2, 50)
    assert (code.train.avg_decay, code.train.avg_threshold, code.train.avg_begin) == (0.88, 0.24, 0)
    assert (paper.ccm.lambda_1, code.ccm.lambda_1) == (0.3, 0.5)
    assert paper.ccm.enabled and paper.ccr.enabled and paper.train.averaging == "fawa" and paper.train.select == "fair"
    assert not config.resolve(str(CONFIGS / "cfa-t1-trades-paper.toml")).method.normalize
    assert config.resolve(str(CONFIGS / "cfa-t1-trades-code.toml")).method.normalize


# each method's code and the golden settings its conformance test ran it under (tests/golden/<file>.json)
CODE_ATTACKS = {"bat": "bat", "trix": "trix", "dafa-trades": "dafa_trades", "dafa-at": "dafa_at", "mart": "mart",
                "wat": "wat"}


@pytest.mark.parametrize("method", sorted(CODE_ATTACKS))
def test_a_method_alone_attacks_as_its_authors_code_not_at_the_global_8_255(method):
    """`fastfair train --method X` without a preset: the code's PGD-10 (eps 0.031, step 0.007, as the golden settings
    its conformance test ran the code under), not the global 8/255 and 2/255; a flag still sets its own."""
    import json
    golden = json.loads((Path(__file__).parent / "golden" / f"{CODE_ATTACKS[method]}.json").read_text())["settings"]
    steps = next(golden[k] for k in ("num_steps", "pgd_num_steps", "perturb_steps") if k in golden)
    step = next(golden[k] for k in ("step_size", "pgd_step_size") if k in golden)
    attack = config.resolve(None, flags={"method.name": method}).attack
    assert (attack.eps, attack.alpha, attack.steps) == (golden["epsilon"], step, steps)
    mine = config.resolve(None, flags={"method.name": method, "attack.eps": 8 / 255}).attack
    assert mine.eps == 8 / 255 and mine.alpha == step


def test_bat_s_preset_attacks_as_its_code():
    preset = config.resolve("trix-rebuttal-t1-bat").attack
    alone = config.resolve(None, flags={"method.name": "bat"}).attack
    assert (preset.eps, preset.alpha, preset.steps) == (alone.eps, alone.alpha, alone.steps)
