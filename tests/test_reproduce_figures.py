"""Figures as ``fastfair reproduce`` targets: grouping, pending items, the listing, the coverage table the docs hold,
and one figure end to end at the subset scale with a drawer registered by the test (the papers' own drawers are
tested in tests/test_figures_*.py)."""
import dataclasses

import pytest

from fastfair.errors import UserError
from fastfair.reproduce import coverage, tables
from fastfair.reproduce.command import listing, reproduce
from fastfair.reproduce.figures import registry
from fastfair.reproduce.figures.registry import FigureSpec
from fastfair.reproduce.runs import SUBSET_VAL_PER_CLASS

from helpers import CIFAR_SUBSET, TINY_SUBSET, real_data
from reproduce_inline import runs_inline


def test_keys_of_items_and_panels():
    assert registry.item_key("tian-kdd", "Table 4") == "tian-kdd-t4"
    assert registry.item_key("me", "Fig. 3") == "me-f3"
    assert registry.figure_number("4(c)") == "4"
    for bad in ("Figure 3", "Table IV", "3"):
        with pytest.raises(ValueError, match="'Table N' or 'Fig. N'"):
            registry.item_key("me", bad)


def test_a_panels_preset_belongs_to_its_figure_and_keeps_its_own_numbers():
    fig = tables.get("me-f3")  # configs/me-fig3-single-at-{cat,car}: Fig. 3(b) and 3(a)
    assert fig.figure and fig.where == "Fig. 3" and fig.title.endswith(", Fig. 3")
    assert {r.preset for r in fig.rows} >= {"me-fig3-single-at-cat", "me-fig3-single-at-car"}
    assert all(fig.own(r) for r in fig.rows if r.figure)
    table = tables.get("me-t2")
    assert not table.figure and all(table.own(r) for r in table.rows)
    assert not any(fig.own(r) for r in table.rows)


def test_a_figure_reusing_a_tables_rows_compares_only_its_own(monkeypatch):
    spec = FigureSpec("me", "Fig. 42", "a test figure", draw=lambda runs: [], rows=("me-table3-pgd-at",))
    monkeypatch.setitem(registry.FIGURES, spec.key, spec)
    fig = tables.get("me-f42")
    assert [r.preset for r in fig.rows] == ["me-table3-pgd-at"] and not fig.own(fig.rows[0])
    assert fig.spec is spec
    said = []
    listing(1, said.append, only="me-f42")
    assert any("draws: a test figure" in s for s in said)
    assert any("me-table3-pgd-at" in s and "its runs (its numbers are Table 3's)" in s for s in said)


def test_a_drawer_without_rows_and_a_reused_preset_without_paper_are_refused(monkeypatch):
    monkeypatch.setitem(registry.FIGURES, "me-f43", FigureSpec("me", "Fig. 43", "nothing", draw=lambda runs: []))
    with pytest.raises(UserError, match="me-f43 is registered with a drawer but has no rows"):
        tables.tables()
    monkeypatch.setitem(registry.FIGURES, "me-f43", FigureSpec("me", "Fig. 43", "x", draw=lambda r: [], rows=("demo",)))
    with pytest.raises(UserError, match="reuses preset demo, which has no \\[paper\\] section"):
        tables.tables()


def test_a_pending_item_is_listed_with_its_route_and_refused_by_name(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the whole line: narrower terminals get it cut (tests/test_new_user.py)
    monkeypatch.setattr(registry, "FIGURES", dict(registry.FIGURES))  # what the test registers goes with it
    registry.pending("me", "Table 41", "a test table", "needs what is not here; run: fastfair x")
    with pytest.raises(ValueError, match="registered twice"):
        registry.pending("me", "Table 41", "again", "why")
    with pytest.raises(ValueError, match="says why"):
        registry.pending("me", "Table 44", "x", "")
    line = ("me-t41: ME-AT/ME-TRADES (ICLR 2022 submission), Table 41: a test table; pending: needs what is not "
            "here; run: fastfair x")
    said = []
    listing(1, said.append)
    assert line in said and "me-t41" not in tables.tables()
    said.clear()
    listing(1, said.append, only="me-t41")
    assert said[-1] == line and not any(s.startswith("me-t2") for s in said)
    with pytest.raises(UserError, match=r"me-t41 \(.*Table 41: a test table\) is pending: needs what is not here"):
        reproduce("me-t41", scale="subset", data_dir=str(CIFAR_SUBSET))


def test_coverage_statuses(monkeypatch):
    monkeypatch.setattr(registry, "INVENTORY", {"me": ("Table 1", "Table 2", "Fig. 3", "Fig. 42", "Fig. 5", "Fig. 9")})
    figures = {k: v for k, v in registry.FIGURES.items() if not k.startswith("me-")}
    figures["me-f42"] = FigureSpec("me", "Fig. 42", "x", draw=lambda r: [], rows=("me-table3-pgd-at",),
                                   partial="panel (b) needs ImageNet")
    figures["me-f9"] = FigureSpec("me", "Fig. 9", "x", pending="no data here; run: y")
    monkeypatch.setattr(registry, "FIGURES", figures)
    got = {e.item: e for e in coverage.coverage()["me"]}
    # ST+LS has a preset of its own; the two standard models' AA (0) is not run, and the row says why
    assert (got["Table 1"].key, got["Table 1"].status) == ("me-t1", "partial")
    assert got["Table 1"].note.startswith("AA of the ST and ST+LS columns (both 0, undefended models): not run")
    assert got["Table 2"].status == "covered"
    assert got["Fig. 3"].status == "partial" and "no drawer" in got["Fig. 3"].note  # presets, no drawer here
    assert (got["Fig. 42"].status, got["Fig. 42"].note) == ("partial", "panel (b) needs ImageNet")
    assert (got["Fig. 9"].status, got["Fig. 9"].note) == ("pending", "no data here; run: y")
    monkeypatch.setitem(figures, "me-f5", FigureSpec("me", "Fig. 5", "x"))  # neither drawn nor pending: no target
    monkeypatch.setattr(registry, "FIGURES", {k: v for k, v in figures.items() if k != "me-f5"})
    assert {e.item: e.status for e in coverage.coverage()["me"]}["Fig. 5"] == "partial"
    monkeypatch.setattr(registry, "INVENTORY", {"me": ("Table 2",)})
    assert "me-t3" in coverage.unlisted()  # an inventory that leaves out a target of its paper


def test_the_docs_coverage_table_is_the_generated_one():
    text = coverage.DOC.read_text()
    assert coverage.rewrite(text) == text, "run: python -m fastfair.reproduce.coverage --write"
    assert coverage.unlisted() == [], "each paper's inventory lists every table and figure fastfair runs of it"


def test_a_figure_end_to_end_at_subset_scale_with_its_drawer(tmp_path, monkeypatch):
    runs_inline(monkeypatch)
    real_data()
    seen, evaluated, asked = {}, [], ["fgsm"]  # attacks the row was not evaluated under
    spy = registry.evaluate_checkpoint
    monkeypatch.setattr(registry, "evaluate_checkpoint", lambda ck, **kw: evaluated.append(ck) or spy(ck, **kw))

    def draw(runs):
        seen.update(presets=sorted(runs.runs), seeds=[len(v) for v in runs.runs.values()], classes=runs.classes,
                    history=len(runs.history("me-fig3-single-at-cat")[0]),
                    robust=[runs.per_class("me-fig3-single-at-cat", a) for a in asked])
        runs.png("a").write_bytes(b"\x89PNG")
        cat = runs.records["me-fig3-single-at-cat"][0]["results"]["clean"]["per_class"][3]
        return [runs.number("Sec. 2.2, cat", "cat", 7.03, [cat])]

    monkeypatch.setitem(registry.FIGURES, "me-f3", FigureSpec("me", "Fig. 3", "features of single-class AT", draw))
    monkeypatch.chdir(tmp_path)
    out, said = tmp_path / "f3", []
    args = dict(scale="subset", data_dir=str(CIFAR_SUBSET), out="f3", gpus="cpu", per_gpu=2,
                sets=TINY_SUBSET, echo=said.append)
    assert reproduce("me-f3", **args) == 0
    assert seen["presets"] == ["me-fig3-single-at-car", "me-fig3-single-at-cat"] and seen["seeds"] == [1, 1]
    assert seen["classes"][3] == "cat" and seen["history"] == 1
    assert seen["robust"][0].shape == (1, 10) and len(evaluated) == 1 and evaluated[0].name.endswith(".pt")
    assert (f"me-f3: evaluate me-fig3-single-at-cat-s0's {evaluated[0].name} under fgsm (the figure plots it; its "
            "row's record lacks it)") in said
    # drawn again from another directory (the run folders' records name their checkpoints as the runs were started,
    # relative to tmp_path): FGSM joined the record, nothing evaluates it again; PGD-3 finds its checkpoint
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    args["out"] = str(out)
    asked.append("pgd3")
    said.clear()
    assert reproduce("me-f3", **args) == 0
    assert not any("warning" in line for line in said)
    assert len(evaluated) == 2 and [r.shape for r in seen["robust"]] == [(1, 10), (1, 10)]
    md = (out / "me-f3.md").read_text()
    assert md.startswith("# Reproduce: ME-AT/ME-TRADES (ICLR 2022 submission), Fig. 3\n")
    assert "*, Fig. 3: features of single-class AT. Scale: **subset**" in md
    assert "![Fig. 3, me-f3-a](me-f3-a.png)" in md and not (out / "me-f3.png").exists()
    assert "| Sec. 2.2, cat | `me-f3` |  | cat | 7.03 (1) |" in md  # the drawer's number
    # the protocol says what the runs held out at this scale, not the preset's full-scale validation split
    assert md.count(f"validation split of {SUBSET_VAL_PER_CLASS} training images a class") == 2
    assert "| single AT of class 3 (cat) | `me-fig3-single-at-cat` | clean | cat | 7.03 (1) |" in md  # the row's own
    assert said[-1] == f"written: {out / 'me-f3.md'}, {out / 'me-f3-a.png'}"
    # a drawer is called once every row has a finished run; none registered: the numbers alone, and a note
    monkeypatch.setitem(registry.FIGURES, "me-f3", dataclasses.replace(registry.FIGURES["me-f3"], draw=None))
    monkeypatch.delitem(registry.FIGURES, "me-f3")
    said.clear()
    assert reproduce("me-f3", **args) == 0
    assert not any("warning" in line for line in said)  # its own earlier report: replaced without a word
    md = (out / "me-f3.md").read_text()
    assert "No drawer is registered for me-f3" in md and "## The figure" not in md
    # another target sharing this --out (its row is one of me-f3's: trained nothing) writes its own report beside
    # me-f3's, and me-f3 drawn again leaves that one as it was
    monkeypatch.setitem(registry.FIGURES, "me-f99", FigureSpec("me", "Fig. 99", "the cat row again", lambda r: [],
                                                               rows=("me-fig3-single-at-cat",)))
    said.clear()
    assert reproduce("me-f99", **args) == 0
    assert said[0].endswith(": 1 runs in " + str(out) + ", 1 done") and not any("warning" in line for line in said)
    other = (out / "me-f99.md").read_text()
    assert other.startswith("# Reproduce: ME-AT/ME-TRADES (ICLR 2022 submission), Fig. 99\n")
    assert (out / "me-f3.md").read_text() == md
    assert reproduce("me-f3", **args) == 0
    assert (out / "me-f99.md").read_text() == other and (out / "me-f3.md").read_text() == md
    assert sorted(p.name for p in out.glob("*.md")) == ["me-f3.md", "me-f99.md"]
