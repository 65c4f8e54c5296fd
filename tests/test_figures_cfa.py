"""CFA (Wei et al. 2023) and Benz et al. 2021 figures: each drawer against hand-made runs (synthetic metrics.jsonl
and evaluation records), the numbers it returns and the panels it draws; one figure end to end through the CLI."""
import json
import math

import numpy as np
import pytest

from fastfair import cli, config
from fastfair.reports import figures
from fastfair.reproduce import tables
from fastfair.reproduce.figures import benz, cfa, registry
from fastfair.reproduce.figures.registry import FIGURES, INVENTORY, FigureRuns

from helpers import CIFAR10, real_data
from reproduce_inline import runs_inline, tiny

EPOCHS = 5


def _run(root, name, val, vectors=None, averaged=None):
    """A run folder whose metrics.jsonl holds ``val``: attack -> (epochs, classes) validation accuracies; ``averaged``
    the same for the EMA/FAWA model (None rows: not yet averaged)."""
    run = root / name
    run.mkdir(parents=True)
    lines = []
    for e in range(len(next(iter(val.values())))):
        line = {"epoch": e + 1, "val": {a: {"per_class": list(map(float, v[e]))} for a, v in val.items()},
                "vectors": {k: list(map(float, v[e])) for k, v in (vectors or {}).items()}}
        if averaged is not None:
            got = {a: v[e] for a, v in averaged.items() if v[e] is not None}
            line["average"] = {"accepted": True, **({"val": {a: {"per_class": list(map(float, v))}
                                                              for a, v in got.items()}} if got else {})}
        lines.append(json.dumps(line))
    (run / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return run


def _record(run, results):
    return {"checkpoint": str(run / "checkpoints" / "best_fair.pt"),
            "results": {a: {"per_class": list(map(float, v))} for a, v in results.items()}}


def _flat(level, epochs=EPOCHS):
    return np.full((epochs, 10), float(level))


def _figure_runs(tmp_path, key, runs, records=None):
    return FigureRuns(key, tmp_path / "out", "subset", False, CIFAR10, runs, records or {})


@pytest.fixture
def drawn(monkeypatch):
    """What each plotting helper was asked to draw: (helper, its arguments and, last, its keyword arguments)."""
    calls = []
    for name in ("curves", "per_class_bars", "per_class_curves", "discrepancy_grid"):
        real = getattr(figures, name)

        def spy(*args, _real=real, _name=name, **kw):
            calls.append((_name, (*args, kw)))
            return _real(*args, **kw)
        monkeypatch.setattr(figures, name, spy)
    return calls


def _pngs_ok(runs, panels):
    assert [p.name for p in runs.pngs] == [f"{runs.key}{'-' + p if p else ''}.png" for p in panels]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in runs.pngs)


def test_inventories_list_every_table_and_figure_in_paper_order_and_each_item_is_registered():
    assert INVENTORY["cfa"] == ("Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 1", "Table 2", "Fig. 5", "Table 3",
                                "Table 4", "Fig. 6", "Fig. 7")
    assert INVENTORY["benz"] == ("Fig. 1", "Fig. 2")
    drawn = {k for k, s in FIGURES.items() if s.draw}
    assert {"cfa-f2", "cfa-f3", "cfa-f4", "cfa-f5", "cfa-f6", "cfa-f7", "benz-f1", "benz-f2"} <= drawn
    # the two that cannot run here say why and how to run them
    assert "Tiny-ImageNet is not available offline" in FIGURES["cfa-t4"].pending
    assert "fastfair eval" in FIGURES["cfa-t4"].pending and "App. A" in FIGURES["cfa-f1"].pending


def test_paper_window_keeps_its_share_of_a_shorter_run():
    v = np.arange(5, dtype=float)[None, :, None] * np.ones((1, 5, 10))  # epoch e (1-based) has e - 1 everywhere
    assert cfa._window(v, *cfa.BEST)[0, 0] == 2.0  # 101-120 of 200 -> epoch 3 of 5
    assert cfa._window(v, *cfa.LAST)[0, 0] == 4.0  # 181-200 -> epoch 5
    long = np.arange(200, dtype=float)[None, :, None] * np.ones((1, 200, 1))
    assert cfa._window(long, *cfa.BEST)[0, 0] == np.mean(np.arange(100, 120))  # epochs 101..120 exactly
    assert cfa._window_text(long, *cfa.BEST) == "epochs 101-120"


def test_fig2_draws_overall_robustness_by_eps_and_class_wise_windows(tmp_path, drawn):
    runs = {p: [_run(tmp_path, p, {"pgd10": _flat(k), "clean": _flat(80)})] for k, p in cfa.F2.items()}
    fr = _figure_runs(tmp_path, "cfa-f2", runs)
    assert cfa.fig2(fr) == []  # Sec. 3.1 states no number
    _pngs_ok(fr, ["a", "b", "c"])
    (helper, (epochs, lines, *_)), *bars = drawn
    assert helper == "curves" and epochs == [1, 2, 3, 4, 5]
    assert list(lines) == [f"eps {k}/255" for k in range(4, 12)] and lines["eps 7/255"][0] == [7.0] * 5
    assert [b[0] for b in bars] == ["per_class_bars"] * 2 and bars[0][1][1]["eps 11/255"][0] == [11.0] * 10
    assert [b[1][2].split("mean of ")[1] for b in bars] == ["epoch 3 of 5 (the paper's 101-120)",
                                                          "epoch 5 of 5 (the paper's 181-200)"]


def test_fig3_draws_robust_then_clean_class_wise_accuracy_by_beta(tmp_path, drawn):
    runs = {p: [_run(tmp_path, p, {"pgd10": _flat(10 * b), "clean": _flat(90 - b)})] for b, p in cfa.F3.items()}
    fr = _figure_runs(tmp_path, "cfa-f3", runs)
    assert cfa.fig3(fr) == []
    _pngs_ok(fr, ["a", "b"])
    robust, clean = (call[1][1] for call in drawn)
    assert list(robust) == [f"beta {b}" for b in range(1, 9)]
    assert robust["beta 3"][0] == [30.0] * 10 and clean["beta 3"][0] == [87.0] * 10


def _at_run(tmp_path, pgd):
    """The AT row's run, its preset's config saved: Fig. 4 reads its validation split's size from it."""
    run = _run(tmp_path, "at", {"pgd10": pgd})
    (run / "config.toml").write_text(config.resolve("cfa-t1-at").to_toml())
    return run


def test_fig4_compares_sec_3_3_numbers_at_the_best_and_the_fairer_epoch(tmp_path, drawn):
    # best overall at epoch 2 (avg 56, worst 20); highest avg + worst at epoch 3 (53.5 + 40)
    pgd = np.array([[30] * 10, [60] * 9 + [20], [55] * 9 + [40], [52] * 9 + [10], [40] * 10], dtype=float)
    fawa = [None, None, [45] * 10, [46] * 9 + [40], [47] * 10]  # averaged from epoch 3
    runs = {"cfa-t1-at": [_at_run(tmp_path, pgd)],
            "cfa-t3-at-fawa-paper": [_run(tmp_path, "fawa", {"pgd10": pgd}, averaged={"pgd10": fawa})]}
    fr = _figure_runs(tmp_path, "cfa-f4", runs)
    comparisons = cfa.fig4(fr)
    got = {(c.row.split(": ", 1)[1], c.paper): c.ours for c in comparisons}
    assert got == {("the epoch of the highest overall robustness (epoch 108)", 53.2): [56.0],
                   ("that epoch's worst class", 23.5): [20.0],
                   ("the fairer checkpoint (epoch 110; ours: highest avg + worst)", 52.6): [53.5],
                   ("the fairer checkpoint's worst class", 28.1): [40.0]}
    # ours are on the validation split, the paper's on its test set: with no test record to count the paper's
    # images, the binomial term the two splits add is unknown, and the verdict says so
    assert all(math.isnan(c.image_sd) and c.interval is None for c in comparisons)
    _pngs_ok(fr, ["a", "b"])
    (_, (epochs, lines, *_)), (_, (fawa_epochs, fawa_lines, *_)) = drawn
    assert epochs == [1, 2, 3, 4, 5] and lines["worst class: change from the epoch before"][0] == [0, 10, 20, 30, 30]
    assert fawa_epochs == [3, 4, 5] and fawa_lines["worst class"][0] == [45.0, 40.0, 47.0]


def test_fig4_says_when_no_epoch_passed_fawas_threshold(tmp_path, drawn):
    pgd = np.array([[30] * 9 + [0]] * EPOCHS, dtype=float)  # the worst class never above 0.2: nothing averaged
    runs = {"cfa-t1-at": [_at_run(tmp_path, pgd)],
            "cfa-t3-at-fawa-paper": [_run(tmp_path, "fawa", {"pgd10": pgd + 1}, averaged={"pgd10": [None] * 5})]}
    cfa.fig4(_figure_runs(tmp_path, "cfa-f4", runs))
    (_, (epochs, lines, title, *_)) = drawn[1]
    assert "no epoch passed FAWA's threshold" in title and lines["overall"][0] == [28.0] * EPOCHS


def _sweep_runs(tmp_path, sweep, base, attack, vector):
    """Each budget's run with robustness rising with lambda (its preset's config saved), and the plain method's below
    them."""
    runs, records = {}, {}
    for lam, preset in sweep.items():
        run = _run(tmp_path, preset, {"pgd10": _flat(40)}, vectors={vector: np.linspace(0.5, 1.5, EPOCHS)[:, None]
                                                                    * np.ones((1, 10))})
        (run / "config.toml").write_text(config.resolve(preset).to_toml())
        runs[preset], records[preset] = [run], [_record(run, {attack: [100 * lam] * 9 + [10 * lam]})]
    run = _run(tmp_path, base, {"pgd10": _flat(40)})
    runs[base], records[base] = [run], [_record(run, {attack: [30.0] * 9 + [2.0]})]
    return runs, records


def test_fig5_sweeps_lambda_1_against_at_and_draws_eps_k_in_255ths(tmp_path, drawn):
    runs, records = _sweep_runs(tmp_path, cfa.F5, "cfa-t1-at", "aa", "eps")
    fr = _figure_runs(tmp_path, "cfa-f5", runs, records)
    assert cfa.fig5(fr) == []
    _pngs_ok(fr, ["a", "b"])
    (_, (xs, lines, *_, kw)), (helper, (epochs, values, classes, *_, vector_kw)) = drawn
    assert xs == [0.3, 0.4, 0.5, 0.6, 0.7] and lines["AT + CCM, worst class"][0] == pytest.approx([3, 4, 5, 6, 7])
    assert (kw["xlabel"], kw["ylabel"]) == ("base perturbation budget lambda_1", "AutoAttack accuracy (%), test set")
    assert lines["AT + CCM, average"][0] == pytest.approx([27.3, 36.4, 45.5, 54.6, 63.7])
    assert helper == "per_class_curves" and values[-1][0] == pytest.approx(1.5 * 255) and classes == CIFAR10
    # the text reads eps_k against the uncalibrated eps (hard classes train below 8/255): a line at it
    assert vector_kw["baselines"] == {"eps = 8, uncalibrated": pytest.approx(8.0)}


def test_fig7_sweeps_lambda_2_against_trades_and_evaluates_a_row_lacking_pgd10(tmp_path, drawn, monkeypatch):
    runs, records = _sweep_runs(tmp_path, cfa.F7, "cfa-t1-trades-paper", "pgd10", "kl_weight")
    # Table 1's TRADES row, evaluated under AutoAttack only, its record naming the checkpoint as its run was started
    records["cfa-t1-trades-paper"] = [{"checkpoint": "elsewhere/best_fair.pt", "split": "test",
                                       "results": {"aa": {"per_class": [0] * 10}}}]
    ckpt = runs["cfa-t1-trades-paper"][0] / "checkpoints" / "best_fair.pt"
    ckpt.parent.mkdir()
    ckpt.touch()
    asked = []

    def evaluate(path, attacks, **kw):  # PGD-10 is added to the run's record
        asked.append((path, attacks))
        return {"results": {"aa": {"per_class": [0] * 10}, "pgd10": {"per_class": [50.0] * 10}}}
    monkeypatch.setattr(registry, "evaluate_checkpoint", evaluate)
    fr = _figure_runs(tmp_path, "cfa-f7", runs, records)
    assert cfa.fig7(fr) == []
    assert asked == [(ckpt, ["pgd10"])] and "pgd10" in fr.records["cfa-t1-trades-paper"][0]["results"]
    (_, (xs, lines, title, path, *_, kw)), (_, (epochs, values, *_, vector_kw)) = drawn
    assert xs == [0.3, 0.4, 0.5, 0.6, 0.7] and values[0][0] == pytest.approx(0.5)  # beta_k as the run logged it
    assert kw["xlabel"] == "base regularization budget lambda_2"  # not Fig. 5's perturbation budget
    assert kw["ylabel"] == "PGD-10 accuracy (%), test set"  # the paper's name of the attack, not fastfair's
    assert vector_kw["baselines"] == {"beta = 6, uncalibrated": 6.0}  # TRADES' beta, beside its beta_k
    _pngs_ok(fr, ["a", "b"])


def _fig6_runs(tmp_path, ema, cfa_acc, cfa_checkpoint="best_fair_avg.pt"):
    """Fig. 6's two rows with their presets' configs; each record of its averaged model unless ``cfa_checkpoint``."""
    runs, records = {}, {}
    for preset, acc in (("cfa-t1-at-ema-paper", ema), ("cfa-t1-at-cfa-paper", cfa_acc)):
        run = _run(tmp_path, preset, {"pgd10": _flat(40)})
        (run / "config.toml").write_text(config.resolve(preset).to_toml())
        rec = _record(run, {"aa": acc, "clean": [80.0] * 10})
        rec["checkpoint"] = str(run / "checkpoints" / ("best_fair_avg.pt" if preset.endswith("ema-paper")
                                                       else cfa_checkpoint))
        runs[preset], records[preset] = [run], [rec]
    return _figure_runs(tmp_path, "cfa-f6", runs, records)


def test_fig6_compares_the_spread_of_class_wise_robustness(tmp_path, drawn):
    ema = [70.0] * 5 + [30.0] * 5  # std of [0.7 x5, 0.3 x5] = 0.2
    cfa_acc = [60.0] * 5 + [40.0] * 5  # 0.1
    fr = _fig6_runs(tmp_path, ema, cfa_acc)
    got = {c.row.rsplit(", ", 1)[1]: (c.paper, c.ours, c.margin, c.image_sd) for c in cfa.fig6(fr)}
    # a std of accuracies is no accuracy over images: no binomial term
    assert got == {"AT + CFA": (0.15, [pytest.approx(0.1)], 0.02, 0.0),
                   "AT + EMA": (0.17, [pytest.approx(0.2)], 0.02, 0.0)}
    _pngs_ok(fr, [""])
    (_, (classes, series, *_, kw)), = drawn
    assert classes == CIFAR10 and list(series) == ["AT + EMA", "AT + CFA"] and series["AT + EMA"][0] == ema
    assert kw["ylabel"] == "AutoAttack accuracy (%), test set"


def test_fig6_says_when_cfas_row_is_not_averaged(tmp_path, drawn):
    """A short run whose worst class never passed FAWA's threshold is evaluated on its own weights (reproduce's
    runs table says so); the legend must too, or the bars read as CFA's averaged model."""
    cfa.fig6(_fig6_runs(tmp_path, [50.0] * 10, [50.0] * 10, cfa_checkpoint="best_fair.pt"))
    (_, (_, series, *_)), = drawn
    assert list(series) == ["AT + EMA", "AT + CFA, not averaged (no epoch passed FAWA's threshold)"]


@pytest.mark.parametrize("draw, preset", [(benz.fig1, "benz-s31-datasets-cifar10-standard"),
                                          (benz.fig2, "benz-s31-datasets-cifar10-at")])
def test_benz_figures_draw_the_2x2_discrepancy_grid_of_their_protocol_run(tmp_path, drawn, draw, preset):
    runs, records = {}, {}
    for seed, shift in enumerate((0.0, 10.0)):  # two seeds: the grid shows their mean
        run = _run(tmp_path, f"{preset}-s{seed}", {"pgd10": _flat(40)})
        runs.setdefault(preset, []).append(run)
        records.setdefault(preset, []).append(_record(run, {"clean": np.arange(10) * 10 + shift,
                                                             "pgd20": np.arange(10) * 5 + shift}))
    fr = _figure_runs(tmp_path, "benz-f1", runs, records)
    assert draw(fr) == []  # the study prints no numbers
    _pngs_ok(fr, [""])
    (helper, (classes, series, robust, *_)), = drawn
    (clean, pgd), = series.values()
    assert helper == "discrepancy_grid" and classes == CIFAR10 and robust == "pgd20"
    assert clean[1] == 15.0 and pgd[9] == 50.0


def test_benz_fig1_end_to_end_at_subset_scale_through_the_cli(tmp_path, capsys):
    """The CI smoke of these modules: one protocol run (standard training, one epoch) and its drawer, via the CLI;
    the one end-to-end reproduce test whose run trains in a child process, as a user's does (the others train in
    the test's, tests/reproduce_inline.py)."""
    data = real_data()
    out = tmp_path / "benz-f1"
    assert cli.main(["reproduce", "benz-f1", "--scale", "subset", "--data-dir", str(data), "--out", str(out),
                     "--gpus", "cpu", *tiny()]) == 0
    md = (out / "benz-f1.md").read_text()
    assert "![Fig. 1, benz-f1](benz-f1.png)" in md and "| done | last.pt |" in md
    assert (out / "benz-f1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert capsys.readouterr().out.rstrip().endswith(f"written: {out / 'benz-f1.md'}, {out / 'benz-f1.png'}")


def test_a_figure_lacks_only_what_its_own_rows_lack_and_lists_its_plotted_rows(capsys):
    known = tables.tables()
    assert known["benz-s31-datasets"].pending and known["benz-f1"].pending == []  # ImageNet is Sec. 3.1's gap
    assert cli.main(["reproduce", "cfa-f2", "--list"]) == 0
    assert capsys.readouterr().out.count("[no numbers of its own: the figure plots its runs; follows paper]") == 8



def test_cfa_fig4_end_to_end_at_subset_scale_through_the_cli(tmp_path, capsys, monkeypatch):
    """CFA's CI smoke: Fig. 4's two rows (AT and AT + FAWA; two epochs, a narrow CNN, a few images, evaluated clean
    only, since AutoAttack on CPU would take minutes and the figure reads the per-epoch curves), drawn via the CLI."""
    runs_inline(monkeypatch)
    data = real_data()
    out = tmp_path / "cfa-f4"
    assert cli.main(["reproduce", "cfa-f4", "--scale", "subset", "--data-dir", str(data), "--out", str(out),
                     "--gpus", "cpu", *tiny("train.epochs=2", 'eval.attacks=["clean"]')]) == 0
    md = (out / "cfa-f4.md").read_text()
    assert md.count("| done |") == 2
    for panel in "ab":
        assert f"![Fig. 4, cfa-f4-{panel}](cfa-f4-{panel}.png)" in md
        assert (out / f"cfa-f4-{panel}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the text's four numbers beside ours (Sec. 3.3), and the rows' AutoAttack ones with no result (not evaluated)
    assert md.count("| `cfa-f4` |") == 4 and "| 53.20 (1) |" in md and "| 28.10 (1) |" in md
    assert "| AT | `cfa-t1-at` |" not in md  # a reused row's numbers stay in its own table
    assert capsys.readouterr().out.rstrip().endswith(f"{out / 'cfa-f4-b.png'}")
