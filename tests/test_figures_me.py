"""The ME paper's figures (fastfair/reproduce/figures/me.py): each drawer on hand-made measurements, the registry's
entries, the 2-D feature model its single-AT rows train, and one figure end to end on the real subset."""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from fastfair import build, cli, config, models
from fastfair.errors import UserError, WriteError
from fastfair.evaluation import diagnose, per_class
from fastfair.preset_files import preset_names
from fastfair.reports import figures
from fastfair.reproduce.figures import me, registry
from fastfair.reproduce.figures.registry import FigureRuns, figure_number
from fastfair.reproduce.paper import load
from fastfair.rundir import load_checkpoint, read_json, save_atomic, write_json_atomic

from helpers import CIFAR10, NPZ_TRAIN, demo_train, real_data, small_npz
from reproduce_inline import runs_inline, tiny
from shared_runs import figures_unrendered

C = len(CIFAR10)


def fake(seed: int = 0, classes=CIFAR10, dim: int = 2) -> me.Measured:
    """A measurement with known numbers: class k's similarity k / 10, its variance k."""
    rng = np.random.default_rng(seed)
    n = len(classes)
    cos = np.full((n, n), 0.1) + np.diag(np.full(n, 0.9))
    return me.Measured(list(classes), cos, np.arange(n) / 10, np.arange(n, dtype=float),
                       rng.normal(size=(20 * n, dim)), np.repeat(np.arange(n), 20))


def finished(runs: FigureRuns, preset: str, natural=None, pgd10=None, classes=CIFAR10) -> None:
    """``preset`` with a finished run whose evaluation record holds known per-class accuracies: natural 50 + k for
    class k unless given, PGD-10 40 points below it unless given."""
    nat = np.arange(len(classes)) + 50.0 if natural is None else np.asarray(natural, dtype=float)
    adv = nat - 40 if pgd10 is None else np.asarray(pgd10, dtype=float)
    runs.runs[preset] = [runs.out / f"{preset}-s0"]
    runs.records[preset] = [{"classes": list(classes), "results": {"clean": {"per_class": nat.tolist()},
                                                                   me.ATTACK: {"per_class": adv.tolist()}}}]


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """(FigureRuns over ``tmp_path`` whose presets are measured by ``measures[preset]``, the panels each
    class_lines call drew). The drawers' PNGs are written unrendered: these tests read the panels and that each
    file is there (the end-to-end test below renders its figure)."""
    figures_unrendered(monkeypatch)
    measures: dict[str, list[me.Measured]] = {}
    monkeypatch.setattr(me, "measured", lambda runs, preset: measures.get(preset, []))
    panels, draw = [], figures.class_lines

    def class_lines(p, title, path, ncols=0):
        panels.append(p)
        return draw(p, title, path, ncols)
    monkeypatch.setattr(me.figures, "class_lines", class_lines)
    runs = FigureRuns("me-fx", tmp_path, "subset", False, CIFAR10, {}, {})
    return runs, measures, panels


def test_inventory_lists_every_table_and_figure_with_results_in_the_papers_order():
    assert registry.INVENTORY["me"] == ("Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Fig. 5", "Fig. 6", "Table 1",
                                        "Fig. 7", "Table 2", "Table 3", "Table 4", "Fig. 8", "Fig. 9", "Table 5")
    tables = {"Table 1", "Table 2", "Table 3", "Table 4"}  # me-t1 ... me-t4 run them
    for item in set(registry.INVENTORY["me"]) - tables:
        assert registry.item_key("me", item) in registry.FIGURES, item
    t5 = registry.FIGURES["me-t5"]
    assert t5.draw is None and "500k" in t5.pending and "rb:NAME" in t5.pending
    assert "Gowal2020Uncovering_28_10_extra" in t5.pending


def test_every_row_a_figure_reuses_is_a_preset_and_every_figure_preset_has_its_target():
    names = set(preset_names())
    for key, spec in registry.FIGURES.items():
        if spec.source == "me":
            assert set(spec.rows) <= names, key
    own = {registry.item_key("me", f"Fig. {figure_number(r.figure)}") for n in names
           if (r := load(n)) and r.source == "me" and r.figure}
    assert own <= set(registry.FIGURES)


def test_fig1_draws_errors_and_each_classs_share_of_the_accuracy_drop(drawn):
    runs, measures, panels = drawn
    finished(runs, me.ST, natural=np.full(C, 95.0))
    drop = np.array([2, 2, 8, 10, 2, 4, 2, 2, 4, 4], dtype=float)  # 40 points in all: cat 25 %, bird 20 %
    finished(runs, me.PGD_AT, natural=95 - drop)
    assert me.draw_fig1(runs) == []
    assert [p.name for p in runs.pngs] == ["me-fx-ab.png", "me-fx-c.png"] and all(p.is_file() for p in runs.pngs)
    (ab,) = panels
    assert list(ab) == ["(a) standard training", "(b) PGD-AT"]
    np.testing.assert_allclose(ab["(b) PGD-AT"]["series"]["natural error"], 5 + drop)
    np.testing.assert_allclose(ab["(b) PGD-AT"]["series"]["PGD-10 error"], 45 + drop)
    np.testing.assert_allclose(me.drop_share(np.full(C, 95.0), 95 - drop), 100 * drop / 40)


def test_a_figure_without_its_runs_draws_nothing(drawn):
    runs, _, _ = drawn
    for draw in (me.draw_fig1, me.draw_fig2, me.draw_fig3, me.draw_fig4, me.draw_fig5, me.draw_fig6, me.draw_fig7,
                 me.draw_fig8, me.draw_fig9):
        assert draw(runs) == []
    assert runs.pngs == []


def test_fig2_6_9_draw_similarity_and_variance_a_line_per_model_the_seeds_averaged(drawn):
    runs, measures, panels = drawn
    for p in (me.ST, me.PGD_AT, me.TRADES, me.PGD_AT_LS, me.ME_AT, me.TRADES_LS, me.ME_TRADES, me.TRADES_L1,
              me.TRADES_L12):
        measures[p] = [fake(0), fake(1)]
    measures[me.TRADES] = [fake(0), replace(fake(1), similarity=np.arange(C) / 10 + 0.2)]
    me.draw_fig2(runs)
    me.draw_fig6(runs)
    me.draw_fig9(runs)
    fig2, fig6, fig9 = panels
    assert list(fig2) == ["(a) inter-class similarity", "(b) intra-class variance"]
    assert list(fig2["(a) inter-class similarity"]["series"]) == ["standard training (ST)", "PGD-AT",
                                                                  "TRADES (lambda = 6)"]
    np.testing.assert_allclose(fig2["(a) inter-class similarity"]["series"]["TRADES (lambda = 6)"],
                               np.arange(C) / 10 + 0.1)  # the mean of the two seeds
    np.testing.assert_allclose(fig2["(b) intra-class variance"]["series"]["PGD-AT"], np.arange(C))
    assert list(fig6) == ["(a) similarity in PGD-AT", "(b) variance in PGD-AT", "(c) similarity in TRADES",
                          "(d) variance in TRADES"]
    assert len(fig6["(c) similarity in TRADES"]["series"]) == 3
    assert list(fig9["(a) inter-class similarity"]["series"]) == ["PGD-AT", "TRADES (lambda = 12)",
                                                                  "TRADES (lambda = 6)", "TRADES (lambda = 1)"]
    assert [p.name for p in runs.pngs] == ["me-fx.png"] * 3 and all(p.is_file() for p in runs.pngs)


def test_fig3_and_fig8_draw_each_single_at_models_errors_and_2d_features(drawn):
    runs, measures, panels = drawn
    for k, preset in me.SINGLE_AT.items():
        measures[preset] = [fake(k)]
        finished(runs, preset, natural=np.full(C, 90.0 - k))
    me.draw_fig3(runs)
    me.draw_fig8(runs)
    fig3, fig8 = panels
    assert list(fig3) == ["(a) single AT of class 1 (automobile)", "(b) single AT of class 3 (cat)"]
    assert list(fig8)[1] == "(b) single AT of class 2 (bird)" and len(fig8) == 8
    cat = fig3["(b) single AT of class 3 (cat)"]["series"]  # the errors are the cat model's record's
    np.testing.assert_array_equal(cat["natural error"], np.full(C, 13.0))
    np.testing.assert_array_equal(cat["PGD-10 error"], np.full(C, 53.0))
    assert [p.name for p in runs.pngs] == ["me-fx-errors.png", "me-fx-features.png"] * 2
    assert all(p.is_file() for p in runs.pngs)


def test_fig4_puts_each_class_in_its_own_single_at_model_beside_standard_training(drawn):
    runs, measures, panels = drawn
    for k, preset in me.SINGLE_AT.items():  # class k's similarity in the model single-AT-trained on k: 0.5 + k/100
        sim = np.zeros(C)
        sim[k] = 0.5 + k / 100
        measures[preset] = [replace(fake(k), similarity=sim)]
    measures[me.ST_2D] = [fake()]
    me.draw_fig4(runs)
    (series,) = [p["series"] for p in panels[0].values()]
    np.testing.assert_allclose(series["single AT (each class in its own model)"], 0.5 + np.arange(C) / 100)
    np.testing.assert_allclose(series["standard training"], np.arange(C) / 10)


def _fig5_runs(runs: FigureRuns, measures: dict) -> None:
    """Fig. 5's rows: the car least similar to the cat in standard training, the dog most (measured); the binary
    model of the cat and class k has natural error k and PGD-10 error 15 + k (its record)."""
    cos = np.eye(C)
    cos[me.CAT] = [0.9, 0.1, 0.5, 1.0, 0.3, 0.8, 0.4, 0.6, 0.7, 0.2]
    measures[me.ST] = [replace(fake(), cosine=cos)]
    for method in ("pgd-at", "trades"):
        for preset in me.BINARY[method]:
            k = config.resolve(preset).data.classes[1]
            finished(runs, preset, natural=[100 - k, 100 - k], pgd10=[90 - k, 80 - k], classes=["cat", CIFAR10[k]])


def test_fig5_sorts_the_pairs_by_their_similarity_to_the_cat_in_standard_training(drawn):
    runs, measures, panels = drawn
    _fig5_runs(runs, measures)
    me.draw_fig5(runs)
    (fig5,) = panels
    a = fig5["(a) PGD-AT"]
    assert a["classes"] == ["automobile", "truck", "deer", "frog", "bird", "horse", "ship", "dog", "airplane"]
    np.testing.assert_allclose(a["series"]["natural error"], [1, 9, 4, 6, 2, 7, 8, 5, 0])
    np.testing.assert_allclose(a["series"]["PGD-10 error"], [16, 24, 19, 21, 17, 22, 23, 20, 15])
    np.testing.assert_allclose(a["right"][1], [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
    assert fig5["(b) TRADES"]["classes"] == a["classes"]
    assert runs.pngs[0].is_file()


def test_fig5_says_how_its_classes_are_sorted_and_its_legend_covers_no_line(drawn, monkeypatch):
    """The x axis is in the order of the green line (the paper's text says so; the plot named no order), and the
    legend sits above each panel: placed "best" inside, it weighed the error lines only and could cover the green."""
    runs, measures, _ = drawn
    _fig5_runs(runs, measures)
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: saved.append(fig) or path)
    me.draw_fig5(runs)
    (fig,) = saved
    assert fig._suptitle.get_text().endswith("the classes sorted by their similarity to the cat in standard training")
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_legend()]
    assert len(panels) == 2
    for ax in panels:
        assert ax.get_legend().get_window_extent().y0 >= ax.get_window_extent().y1 - 1


def test_the_text_numbers_of_fig5_are_its_rows_own():
    """Sec. 2.2: cat vs dog 49.7 (PGD-AT) and 23.4 / 44.0 (TRADES) error, cat vs car 4.6 / 11.0."""
    assert load("me-fig5-binary-cat-dog-pgd-at").numbers["clean"].avg == 50.3
    assert load("me-fig5-binary-cat-car-pgd-at").numbers["clean"].avg == 95.4
    assert load("me-fig5-binary-cat-car-pgd-at").numbers["pgd10"].avg == 89.0
    assert not load("me-fig5-binary-cat-car-trades").numbers


def test_a_2d_feature_model_has_two_features_and_a_bias_free_head():
    """ME paper App. A.1: a 512x2 linear layer before a 2x10 fc layer without bias."""
    cfg = config.resolve("me-fig3-single-at-cat")
    assert (cfg.model.feature_dim, cfg.model.head) == (2, "linear-nobias")
    m = models.build("tiny-cnn", num_classes=10, in_channels=3, mean=[0.5] * 3, std=[0.25] * 3, width=4,
                     head="linear-nobias", feature_dim=2)
    x = torch.rand(3, 3, 32, 32)
    assert m.forward_features(x).shape == (3, 2) and m(x).shape == (3, 10)
    assert m.head.bias is None and m.head.weight.shape == (10, 2)
    plain = models.build("tiny-cnn", num_classes=10, in_channels=3, mean=[0.5] * 3, std=[0.25] * 3, width=4)
    assert plain.forward_features(x).shape[1] > 2 and plain.head.bias is not None
    spec = build.model_spec(cfg, type("B", (), {"num_classes": 10, "shape": (3, 32, 32), "classes": CIFAR10,
                                               "mean_std": lambda self: ([0.5] * 3, [0.25] * 3)})())
    assert spec["feature_dim"] == 2  # a checkpoint rebuilds the 2-D model


def test_evaluation_records_the_mean_prediction_entropy_fig7_draws():
    """Uniform predictions over C classes have entropy ln C; certain ones 0 (ME paper Fig. 7's quantity)."""
    x, y = torch.rand(6, 3, 4, 4), torch.tensor([0, 1, 2, 0, 1, 2])
    for bias, want in (([0.0, 0.0, 0.0], np.log(3)), ([60.0, 0.0, 0.0], 0.0)):
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 3))
        torch.nn.init.zeros_(model[1].weight)
        model[1].bias.data = torch.tensor(bias)
        out = per_class.evaluate(model, [(x[:4], y[:4]), (x[4:], y[4:])], ["clean", "pgd2"], eps=8 / 255,
                                 alpha=2 / 255, classes=["a", "b", "c"])
        for attack in ("clean", "pgd2"):
            assert out[attack]["entropy"] == pytest.approx(want, abs=1e-6)


def test_fig7_draws_each_epochs_entropy_clean_and_adversarial_from_the_runs_metrics(drawn, tmp_path):
    runs, _, _ = drawn
    curves, draw = [], figures.curves
    for preset, clean in ((me.PGD_AT, 0.3), (me.TRADES, 0.6)):
        run = tmp_path / "runs" / preset
        run.mkdir(parents=True)
        (run / "config.toml").write_text(config.resolve(preset).to_toml())
        (run / "metrics.jsonl").write_text("".join(json.dumps(
            {"epoch": e, "val": {"clean": {"entropy": clean * e}, "pgd10": {"entropy": clean * e + 0.1}}}) + "\n"
            for e in (1, 2, 3)))
        runs.runs[preset] = [run]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(me.figures, "curves", lambda *a, **k: curves.append(a) or draw(*a, **k))
        assert me.draw_fig7(runs) == []
    epochs, lines, title = curves[0][:3]
    assert epochs == [1, 2, 3] and "validation split" in title
    np.testing.assert_allclose(lines["TRADES (lambda = 6), adversarial (pgd10)"][0], [0.7, 1.3, 1.9])
    np.testing.assert_allclose(lines["PGD-AT, clean"][0], [0.3, 0.6, 0.9])
    np.testing.assert_allclose(lines["ln 10, the largest entropy of 10 classes"][0], np.log(10))
    assert runs.pngs[0].is_file()


def test_fig3_end_to_end_at_subset_scale_through_the_cli(tmp_path, monkeypatch):
    """The CI smoke of the ME figures: me-f3's two single-AT rows trained (helpers.TINY_SUBSET: one epoch of a
    4-channel tiny-cnn on a few images a class), their numbers compared, then the drawer measures both checkpoints'
    features and draws the errors (the runs' evaluation records', exactly: a measurement of its own differed by an
    image or two a class) and the 2-D features."""
    runs_inline(monkeypatch)
    data = real_data()
    out = tmp_path / "f3"
    argv = ["reproduce", "me-f3", "--scale", "subset", "--data-dir", str(data), "--out", str(out), "--gpus", "cpu",
            "--per-gpu", "2", *tiny()]
    assert cli.main(argv) == 0
    md = (out / "me-f3.md").read_text()
    for panel in ("errors", "features"):
        assert f"(me-f3-{panel}.png)" in md and (out / f"me-f3-{panel}.png").stat().st_size > 10_000
    assert "| single AT of class 3 (cat) | `me-fig3-single-at-cat` | clean | cat | 7.03 (1) |" in md
    run = out / "runs" / "me-fig3-single-at-cat-s0"
    (got,) = me.measured(FigureRuns("me-f3", out, "subset", False, CIFAR10, {"x": [run]}, {}, gpus="cpu"), "x")
    assert got.features.shape == (50, 2) and got.classes == CIFAR10  # 5 test images a class, 2-D features
    # the record is what the drawer reads: numbers no measurement would give show up as they are
    path = run / "eval" / "best_pgd-test.json"
    record = read_json(path)
    record["results"]["clean"]["per_class"] = [90.0 - k for k in range(C)]
    record["results"]["pgd10"]["per_class"] = [30.0 + k / 2 for k in range(C)]
    write_json_atomic(record, path)  # through fastfair's writer: a hand edit would fail the record's checksum
    panels = []
    monkeypatch.setattr(me.figures, "class_lines", lambda p, *a, **k: panels.append(p))
    assert cli.main(argv) == 0
    cat = panels[0]["(b) single AT of class 3 (cat)"]["series"]
    np.testing.assert_array_equal(cat["natural error"], [10.0 + k for k in range(C)])
    np.testing.assert_array_equal(cat["PGD-10 error"], [70.0 - k / 2 for k in range(C)])


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A one-epoch cut-down demo run on 40 test images of 8x8 pixels: a measurement of it takes a moment."""
    tmp = tmp_path_factory.mktemp("trained")
    small_npz(tmp)
    assert cli.main(demo_train(tmp / "run", *[a.format(tmp=tmp) for a in NPZ_TRAIN])) == 0
    return tmp / "run"


def _counted(monkeypatch, tmp_path, demo_run):
    """(FigureRuns over a copy of the demo run as preset "x", the diagnose.collect calls, the lines echoed)."""
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    calls, echoed, collect = [], [], diagnose.collect
    monkeypatch.setattr(me.diagnose, "collect", lambda *a, **k: calls.append(a) or collect(*a, **k))
    return FigureRuns("me-fx", tmp_path, "subset", False, [], {"x": [run]}, {}, gpus="cpu", echo=echoed.append), \
        calls, echoed


def test_a_measurement_is_kept_beside_its_run_and_reused_until_its_checkpoint_or_settings_change(
        monkeypatch, tmp_path, demo_run):
    runs, calls, echoed = _counted(monkeypatch, tmp_path, demo_run)
    (first,) = me.measured(runs, "x")
    ck = build.checkpoint_path(runs.runs["x"][0])
    store = ck.parents[1] / "diagnostics" / f"{ck.stem}-test-clean.npz"
    assert len(calls) == 1 and store.is_file() and len(echoed) == 1 and ck.name in echoed[0]
    assert first.labels.size == 40
    (again,) = me.measured(runs, "x")  # as a second reproduce would: nothing measured, the same numbers
    assert len(calls) == 1 and len(echoed) == 1
    for f in fields(me.Measured):
        np.testing.assert_array_equal(getattr(again, f.name), getattr(first, f.name))
    assert again.classes == first.classes and isinstance(again.classes[0], str)
    monkeypatch.chdir(tmp_path)  # the run folder as a relative --out names it: the same checkpoint, reused
    me.measured(replace(runs, runs={"x": [Path("run")]}), "x")
    assert len(calls) == 1
    stamp = ck.stat().st_mtime_ns
    os.utime(ck, ns=(stamp, stamp + 10**9))  # the checkpoint rewritten: a longer run's new best
    me.measured(runs, "x")
    assert len(calls) == 2
    ckpt = load_checkpoint(ck)  # other settings in the same file, its mtime kept: another run's, refused unmeasured
    cfg = config.load_saved_text(ckpt["config"])
    ckpt["config"] = config.apply(cfg, {"data.test_per_class": 2}, "the test").to_toml()
    save_atomic(ckpt, ck)
    os.utime(ck, ns=(stamp, stamp + 10**9))
    with pytest.raises(UserError, match="another run's checkpoint"):  # issue 58: a checkpoint belongs to its run
        me.measured(runs, "x")
    assert len(calls) == 2


def test_a_damaged_stored_measurement_is_measured_again_not_a_crash(monkeypatch, tmp_path, demo_run, capsys):
    runs, calls, _ = _counted(monkeypatch, tmp_path, demo_run)
    (first,) = me.measured(runs, "x")
    ck = build.checkpoint_path(runs.runs["x"][0])
    store = ck.parents[1] / "diagnostics" / f"{ck.stem}-test-clean.npz"
    whole = store.read_bytes()
    other = tmp_path / "other.npz"  # an npz, but not of a measurement
    np.savez(other, x=np.zeros(3))
    for n, damaged in enumerate([whole[: len(whole) // 2], b"not an npz", other.read_bytes()], start=2):
        store.write_bytes(damaged)  # cut short by a copy or a full disk, or another file
        (again,) = me.measured(runs, "x")
        assert len(calls) == n
        np.testing.assert_array_equal(again.similarity, first.similarity)
    me.measured(runs, "x")  # the new one was written whole
    assert len(calls) == 4

    def full(arrays, path):
        raise WriteError(f"cannot write {path}: no space left on the device")
    monkeypatch.setattr(me, "write_npz_atomic", full)  # a full disk, runs copied read-only: drawn all the same
    store.unlink()
    (again,) = me.measured(runs, "x")
    np.testing.assert_array_equal(again.variance, first.variance)
    assert "fastfair: warning: cannot write" in capsys.readouterr().err and len(calls) == 5
