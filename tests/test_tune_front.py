"""fastfair.tuning.front: Pareto fronts, the pick rules, the comparison's tables and figure, the papers' points."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastfair.errors import UserError
from fastfair.tuning.front import (comparison_markdown, comparison_text, draw_fronts, paper_points, pareto,
                                   parse_rule)


def rec(number, avg, worst, state="complete", test=None, params=None, contender="trades"):
    return {"contender": contender, "number": number, "params": params or {"method.kl_weight": 1.0 + number},
            "state": state, "val": {"avg": avg, "worst": worst, "clean": None}, "test": test,
            "run": f"S/trials/{contender}/{number:04d}"}


def dominates(a, b):
    (x1, y1), (x2, y2) = (a["val"]["avg"], a["val"]["worst"]), (b["val"]["avg"], b["val"]["worst"])
    return x1 >= x2 and y1 >= y2 and (x1, y1) != (x2, y2)


# accuracies on a coarse grid, so that ties and equal points are common
acc = st.integers(0, 12).map(lambda v: v * 2.5)
records = st.lists(st.tuples(acc, acc, st.sampled_from(["complete"] * 3 + ["pruned", "failed", "running"])),
                   max_size=25).map(lambda rows: [rec(i, a, w, s) for i, (a, w, s) in enumerate(rows)])


@settings(max_examples=200, deadline=None)
@given(records)
def test_front_is_the_non_dominated_complete_records_sorted(rs):
    front = pareto(rs)
    complete = [r for r in rs if r["state"] == "complete"]
    assert all(r["state"] == "complete" for r in front)
    assert not any(dominates(o, f) for f in front for o in complete)  # nothing beats a front point
    on = {r["number"] for r in front}
    for r in complete:
        if r["number"] not in on:  # off the front: beaten, or the same point as a front record of lower number
            assert any(dominates(f, r) or (f["val"] == r["val"] and f["number"] < r["number"]) for f in front)
    pts = [(r["val"]["avg"], r["val"]["worst"]) for r in front]
    assert all(a1 < a2 and w1 > w2 for (a1, w1), (a2, w2) in zip(pts, pts[1:]))


def test_front_skips_absent_and_nan_numbers_and_keeps_the_first_of_equal_points():
    rs = [rec(0, 50.0, 20.0), rec(1, 50.0, 20.0), rec(2, float("nan"), 90.0), rec(3, 90.0, None),
          rec(4, 99.0, 99.0, state="pruned"), rec(5, 40.0, 25.0)]
    rs.append({**rec(6, 0, 0), "val": None})
    assert [r["number"] for r in pareto(rs)] == [5, 0]
    assert [r["number"] for r in pareto(rs[::-1])] == [5, 0]  # the lowest number, not the first seen


# a front whose points 1 and 2 tie on avg + worst (73); 5 lies behind 1
FRONT = [rec(0, 40.0, 30.0), rec(1, 47.0, 26.0), rec(2, 49.0, 24.0), rec(3, 49.5, 20.0), rec(4, 50.0, 15.0),
         rec(5, 45.0, 20.0)]


@pytest.mark.parametrize("text,number", [
    ("worst@avg-1", 2),  # 2, 3 and 4 within 1 of 50: 2 has the best worst class
    ("worst@avg-0.5", 3),
    ("worst@avg-0", 4),
    ("worst@avg-3", 1),
    ("avg@worst-6", 2),  # 0, 1 and 2 within 6 of 30: 2 has the best average
    ("avg@worst-4", 1),
    ("avg@worst-0", 0),
    ("avg", 4),
    ("worst", 0),
    ("sum", 1),  # 1 and 2 tie on 73: the higher worst class
])
def test_each_rule_picks_its_point(text, number):
    front = pareto(FRONT)
    assert [r["number"] for r in front] == [0, 1, 2, 3, 4]
    assert parse_rule(text).pick(front)["number"] == number


def test_ties_go_to_the_other_objective_then_the_lower_trial():
    tied = [rec(7, 50.0, 20.0), rec(3, 48.0, 22.0), rec(9, 47.0, 23.0)]  # all sum to 70
    assert parse_rule("sum").pick(tied)["number"] == 9  # the higher worst class
    assert parse_rule("sum").pick([rec(7, 50.0, 20.0), rec(3, 50.0, 20.0)])["number"] == 3
    assert parse_rule("worst").pick([rec(1, 40.0, 20.0), rec(2, 45.0, 20.0)])["number"] == 2


def test_rule_on_an_empty_front_picks_nothing():
    assert parse_rule().pick([]) is None
    assert parse_rule().pick([rec(0, 50.0, 20.0, state="failed")]) is None


def test_within_holds_up_to_float_rounding():
    # 40.1 - 0.3 is 39.800000000000004 in floats: 39.8 is still within 0.3 points
    assert parse_rule("worst@avg-0.3").pick([rec(0, 40.1, 10.0), rec(1, 39.8, 12.0)])["number"] == 1


@pytest.mark.parametrize("text", ["best", "worst@avg", "worst@worst-1", "avg@avg-1", "worst@avg+1", "worst@avg--1",
                                  "sum@avg-1", ""])
def test_bad_rules_are_refused_naming_the_forms(text):
    with pytest.raises(UserError, match=r"worst@avg-D.*avg@worst-D.*sum"):
        parse_rule(text)


def study():
    trades = [rec(0, 48.0, 20.0, test={"avg": 47.1, "worst": 18.0, "clean": None}), rec(1, 45.0, 24.0),
              rec(2, 45.0, 24.0), rec(3, 40.0, 10.0), rec(4, 0, 0, state="pruned"), rec(5, 0, 0, state="failed")]
    cfa = [rec(0, 47.0, 25.0, contender="trades+ccm+ccr+fawa", params={"ccm.lambda_1": 0.3, "ccr.lambda_2": 0.5}),
           rec(1, 0, 0, state="running", contender="trades+ccm+ccr+fawa")]
    return {"trades": trades, "trades+ccm+ccr+fawa": cfa}


def test_markdown_marks_the_pick_budget_dashes_and_equal_points():
    papers = {"trades": [{"label": "CFA Table 1", "avg": 48.3, "worst": 21.7, "source": "x", "attack": "aa"}]}
    md = comparison_markdown(study(), parse_rule("worst@avg-1"), papers)
    assert "| 0 (pick) | method.kl_weight=1 | 48.0 | 20.0 | 47.1 | 18.0 |" in md  # 1 is 3 points below
    assert "| 1 | method.kl_weight=2 | 45.0 | 24.0 | - | - |" in md  # no test numbers yet
    assert "budget: 6 trials (4 complete, 1 stopped early, 1 failed)" in md
    assert "budget: 2 trials (1 complete, 0 stopped early, 0 failed, 1 running)" in md
    assert "trial 2 reached trial 1's validation point" in md
    assert "| trades+ccm+ccr+fawa | 0 | ccm.lambda_1=0.3, ccr.lambda_2=0.5 | 47.0 | 25.0 | - | - |" in md
    assert "CFA Table 1: avg 48.3, worst 21.7 (test, AutoAttack)" in md
    assert "measured once, on the final fronts' points only" in md
    assert "at most 1 point(s) below the front's best average" in md
    assert "| 3 |" not in md  # dominated


def test_text_is_aligned_and_says_the_same():
    text = comparison_text(study(), parse_rule("worst"))
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.strip().startswith("trial"))
    assert lines[header].index("val avg") == lines[header + 1].index("45.0")  # columns line up
    assert "1 (pick)" in text and "budget: 6 trials (4 complete, 1 stopped early, 1 failed)" in text
    assert "highest worst-class accuracy" in text


def test_no_complete_trial_says_so():
    md = comparison_markdown({"wat": [rec(0, 0, 0, state="failed")]}, parse_rule())
    assert "no complete trial yet, so no front" in md and "| wat | - | - |" in md


def test_draw_fronts_writes_a_png(tmp_path):
    papers = {"trades": [{"label": "CFA Table 1", "avg": 48.3, "worst": 21.7, "source": "x", "attack": "aa"}]}
    path = draw_fronts(study(), papers, tmp_path / "fronts.png", attack="pgd10")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(data) < 1_000_000
    assert draw_fronts({"wat": [rec(0, 0, 0, state="failed")]}, None, tmp_path / "empty.png").is_file()


def test_paper_points_are_cfa_table_1s_for_trades_and_cfa_trades():
    def aa(contender):
        return {(p["avg"], p["worst"]) for p in paper_points(contender, "cifar10")
                if p["label"] == "CFA Table 1" and p["attack"] == "aa"}
    assert aa("trades") == {(48.3, 21.7)}  # configs/cfa-t1-trades-paper.toml [paper] aa
    assert aa("trades+ccm+ccr+fawa") == {(50.1, 26.5)}  # configs/cfa-t1-trades-cfa-paper.toml
    assert aa("trades+fawa") == set() and aa("pgd-at+ccm+fawa") == {(50.1, 24.4)}
    assert paper_points("trades", "mnist") == []
    # released models (RST's extra data, the authors' TRADES file) are not the method as fastfair trains it
    assert not any("RST" in p["source"] or "released" in p["source"] for p in paper_points("trades", "cifar10"))
    # AutoAttack or PGD only: Tian et al.'s FGSM-RS numbers would sit far above every front
    assert {p["attack"][:3] for p in paper_points("trades", "cifar10")} == {"aa", "pgd"}
    points = paper_points("trades+ccm+ccr+fawa", "cifar10")
    assert all(set(p) >= {"label", "avg", "worst", "source"} and not math.isnan(p["avg"]) for p in points)
    assert len({(p["label"], p["avg"], p["worst"]) for p in points}) == len(points)  # paper and code presets: once
