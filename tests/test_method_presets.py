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
