"""Tian et al. ICLR 2021 submission's figures (fastfair/reproduce/figures/tian_iclr.py): each drawer on hand-made
runs (synthetic metrics and evaluation records; the diagnose and homing calls replaced by their records), checked
for the numbers it returns and the panels it draws; one figure end to end through ``fastfair reproduce``."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fastfair import config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.reports import figures
from fastfair.reproduce import tables
from fastfair.reproduce.command import _notes, reproduce
from fastfair.reproduce.figures import registry, tian_iclr
from fastfair.reproduce.figures.registry import FigureRuns
from fastfair.reproduce.runs import plan

from helpers import CIFAR_SUBSET, TINY_SUBSET, real_data
from reproduce_inline import runs_inline
from shared_runs import figures_unrendered

C10 = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
DIGITS = [str(k) for k in range(10)]


def record(classes: list[str], per_class: dict[str, list[float]], n: int = 100) -> dict:
    """An evaluation record: per attack, the per-class accuracies and a confusion matrix of ``n`` images a class
    whose misclassified images all go to the next class."""
    results = {}
    for attack, acc in per_class.items():
        c = len(classes)
        conf = np.zeros((c, c), dtype=int)
        for k, a in enumerate(acc):
            conf[k, k] = round(a * n / 100)
            conf[k, (k + 1) % c] = n - conf[k, k]
        results[attack] = {"per_class": list(acc), "confusion": conf.tolist()}
    return {"classes": classes, "results": results}


def epoch(attack: str, per_class: list[float]) -> dict:
    return {"val": {attack: {"per_class": per_class, "avg": float(np.mean(per_class))}}}


def figure_runs(tmp_path: Path, key: str, records: dict[str, list[dict]],
                histories: dict[str, list[list[dict]]] | None = None, echo: list | None = None) -> FigureRuns:
    """A FigureRuns over run folders holding only metrics.jsonl (``histories``: per preset, per seed)."""
    folders = {}
    for preset, recs in records.items():
        folders[preset] = []
        for seed in range(len(recs)):
            run = tmp_path / "runs" / f"{preset}-s{seed}"
            run.mkdir(parents=True)
            lines = (histories or {}).get(preset, [[]] * len(recs))[seed]
            (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
            folders[preset].append(run)
    return FigureRuns(key, tmp_path, "subset", False, C10, folders, records,
                      echo=(echo if echo is not None else []).append)


@pytest.fixture
def drawn(monkeypatch):
    """PNG name -> the titles of its figure and axes, for every PNG the drawers save. Each is laid out as the
    drawer lays it out, and written unrendered but the one whose pixels a test reads (tian-iclr-f1-b.png)."""
    laid_out = figures._save  # tight_layout, then save_figure: the spy below
    figures_unrendered(monkeypatch, render=["tian-iclr-f1-b.png"])
    monkeypatch.setattr(figures, "_save", laid_out)
    got, save = {}, figures.save_figure

    def spy(fig, path):
        got[Path(path).name] = [fig._suptitle.get_text() if fig._suptitle else "", *(a.get_title() for a in fig.axes)]
        return save(fig, path)
    monkeypatch.setattr(figures, "save_figure", spy)
    return got


def by_stat(comparisons) -> dict[str, list[float]]:
    """stat -> every seed's value of the comparisons with that stat, in order."""
    out: dict[str, list[float]] = {}
    for c in comparisons:
        out.setdefault(c.stat, []).extend(c.ours)
    return out


def test_inventory_lists_every_table_and_figure_with_results_and_each_figure_has_a_target():
    items = registry.INVENTORY["tian-iclr"]
    assert items == ("Fig. 1", "Fig. 2", "Fig. 3", "Fig. 4", "Table 2", "Fig. 5", "Table 3", "Fig. 6", "Fig. 7",
                     "Fig. 8", "Table 4", "Table 5", "Table 6")
    for item in items:
        if item.startswith("Fig."):
            spec = registry.FIGURES[registry.item_key("tian-iclr", item)]
            assert spec.draw is not None and not spec.pending


def test_fig1_draws_a_panel_per_data_set_run_and_compares_the_texts_gaps(tmp_path, drawn):
    mnist = [epoch("pgd40", [90.0] * 9 + [70.0]), epoch("pgd40", [97.0] * 9 + [91.0])]  # gaps 20, then 6
    cifar = [[epoch("pgd20", [60.0, 80.0, 40.0, 20.0, 40.0, 40.0, 60.0, 60.0, 70.0, 60.0])] * 3]  # gap 60
    said = []
    runs = figure_runs(tmp_path, "tian-iclr-f1",
                       {"tian-iclr-fig1-mnist-madry": [record(DIGITS, {"pgd40": [97.0] * 9 + [91.0]})],
                        "tian-iclr-fig1-cifar10-madry": [record(C10, {"pgd20": [50.0] * 10})]},
                       {"tian-iclr-fig1-mnist-madry": [mnist], "tian-iclr-fig1-cifar10-madry": cifar}, said)
    got = by_stat(registry.FIGURES["tian-iclr-f1"].draw(runs))
    assert got["avg"] == [pytest.approx(96.4)]
    assert got["gap"] == [20.0, 60.0]  # the band's widest point over the epochs, per panel
    ranged = [c for c in registry.FIGURES["tian-iclr-f1"].draw(runs) if "40 %-50 %" in c.row]
    assert ranged[0].paper == 45.0 and ranged[0].margin == 5.0 + 5.0  # half the range plus MCD's default
    assert sorted(drawn) == ["tian-iclr-f1-a.png", "tian-iclr-f1-b.png"]
    assert "Fig. 1(b) CIFAR-10" in drawn["tian-iclr-f1-b.png"][1]
    assert Image.open(tmp_path / "tian-iclr-f1-b.png").size[0] > 400
    assert sum("not drawn" in s for s in said) == 2 * 4  # c-f, once per call


def test_fig2_sums_cifar100_into_its_super_classes():
    from fastfair.data.superclasses import CIFAR100_SUPERCLASSES
    classes = sorted(f for fine in CIFAR100_SUPERCLASSES.values() for f in fine)
    conf = np.eye(100) * 100
    conf[0, 1] = conf[0, 2] = 7  # apple -> aquarium_fish, baby: another super-class each
    m, names = tian_iclr._by_superclass(conf, classes)
    assert m.shape == (20, 20) and names[0] == "0" and m.sum() == conf.sum()
    assert np.trace(m) == 100 * 100  # every correct image stays on the diagonal
    assert tian_iclr._by_superclass(np.eye(10), C10) is None


def test_fig2_draws_each_finished_row_in_percent(tmp_path, drawn, monkeypatch):
    shown = {}
    monkeypatch.setattr(figures, "heatmap", lambda m, names, title, path, **kw: shown.setdefault(path.name, (m, title)))
    runs = figure_runs(tmp_path, "tian-iclr-f2", {"tian-iclr-fig1-cifar10-madry": [
        record(C10, {"pgd20": [60.0] * 10}), record(C10, {"pgd20": [40.0] * 10})]})
    assert registry.FIGURES["tian-iclr-f2"].draw(runs) == []
    m, title = shown["tian-iclr-f2-b.png"]
    assert title == "Fig. 2(b) CIFAR-10: confusion matrix of robustness, pgd20 on the test set"  # says what it draws
    assert m[3, 3] == pytest.approx(50.0) and m[3, 4] == pytest.approx(50.0)  # two seeds' confusions summed


def test_a_row_evaluated_clean_alone_gets_the_figures_attack_from_its_checkpoint(tmp_path, monkeypatch):
    asked = []
    monkeypatch.setattr(registry, "evaluate_checkpoint", lambda ck, attacks, **kw: asked.append(
        (ck.parent.parent.name, attacks)) or record(C10, {"clean": [90.0] * 10, "pgd20": [40.0] * 10}))
    row = "tian-iclr-fig1-cifar10-madry"
    recs = [{**record(C10, {"clean": [90.0] * 10}), "checkpoint": "epoch.pt", "split": "test"},
            record(C10, {"clean": [90.0] * 10, "pgd20": [30.0] * 10})]
    runs = figure_runs(tmp_path, "tian-iclr-f7", {row: recs})
    (runs.runs[row][0] / "checkpoints").mkdir()
    (runs.runs[row][0] / "checkpoints" / "epoch.pt").touch()
    assert runs.per_class(row, "pgd20")[:, 0].tolist() == [40.0, 30.0]
    assert asked == [("tian-iclr-fig1-cifar10-madry-s0", ["pgd20"])]  # the seed that had it is not attacked again


def test_the_subset_scale_holds_out_nothing_for_a_row_scoring_every_epoch_on_the_test_set(tmp_path):
    real_data()
    planned = plan(tables.get("tian-iclr-f8"), 1, "subset", str(CIFAR_SUBSET), tmp_path / "out", {})
    assert planned and not any("data.val_per_class" in p.sets for p in planned)
    assert not [w for p in planned for w in check_config(config.resolve(p.row.preset, None, p.sets))
                if "val_per_class" in w]


def test_fig5_with_the_evaluation_cut_to_clean_plans_no_idle_transfer_substitute(tmp_path):
    """Fig. 5 reads no attack of Table 2's rows: ``--set eval.attacks=["clean"]`` shortens their runs, and their
    transfer substitute, with no transfer attack left, is not set (the run's checks refuse an idle one)."""
    real_data()
    table = tables.get("tian-iclr-f5")
    kept = {p.name: p for p in plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path / "a", {})}
    assert kept["tian-iclr-t2-madry-s0"].sets["eval.substitute"].endswith("tian-iclr-t2-standard-s0")
    cut = {p.name: p for p in plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path / "b",
                                   {"eval.attacks": ["clean"]})}
    madry = cut["tian-iclr-t2-madry-s0"]
    assert "eval.substitute" not in madry.sets
    check_config(config.resolve(madry.row.preset, None, madry.sets))  # raised "eval.substitute is used only by ..."
    # and the report's protocol notes say transfer attacks were made on a substitute only where they were
    said = {ran: " ".join(_notes(table, "subset", {}, ran={p.row.preset: p.sets for p in planned.values()}))
            for ran, planned in (("kept", kept), ("cut", cut))}
    assert "transfer attacks made on tian-iclr-t2-standard" in said["kept"]
    assert "transfer attacks made on" not in said["cut"]


def homing_record(mis91: int, home91: int) -> dict:
    mis, home = np.zeros((10, 10), dtype=int), np.full((10, 10), None, dtype=object)
    mis[9, :9] = [49, mis91, 15, 30, 7, 15, 23, 21, 73]
    home[:, 1] = 0
    home[1, 1] = None
    home[9, 1] = home91
    return {"classes": C10, "images": 10000, "misclassified": mis.tolist(), "homing": home.tolist()}


def test_fig3_compares_the_truck_row_and_its_homing_share(tmp_path, drawn, monkeypatch):
    made = iter([homing_record(147, 116), homing_record(100, 50)])

    def fake_homing(targets, *, attack, out, device, quiet):
        assert attack == "pgd20" and len(targets) == 1 + 2  # the base run and the re-trained ones of its seed
        assert device == "cpu"  # --gpus cpu: the attacks run where the trainings ran
        Path(out).mkdir(parents=True)
        (Path(out) / "homing.json").write_text(json.dumps(next(made)))
        return Path(out) / "homing.md"
    monkeypatch.setattr(tian_iclr, "homing", fake_homing)
    base = [record(C10, {"clean": [50.0] * 10}, n=1000)] * 2
    runs = figure_runs(tmp_path, "tian-iclr-f3", {tian_iclr.HOMING_BASE: base,
                                                   tian_iclr.HOMING_WITHOUT[1]: [{}, {}],
                                                   tian_iclr.HOMING_WITHOUT[3]: [{}, {}]})
    runs.gpus = "cpu"
    got = {c.stat + "|" + c.row.split(":")[1].split("(")[0].strip(): c for c in
           registry.FIGURES["tian-iclr-f3"].draw(runs)}
    assert got["% of trucks|trucks sent to automobile"].paper == pytest.approx(14.7)
    assert got["% of trucks|trucks sent to automobile"].ours == [pytest.approx(14.7), pytest.approx(10.0)]
    assert got["% of trucks|trucks sent to ship"].ours == [pytest.approx(7.3)] * 2
    assert got["% homing|trucks sent to automobile that home without it"].ours == [pytest.approx(100 * 116 / 147),
                                                                                   50.0]
    assert "Fig. 3" in drawn["tian-iclr-f3.png"][0]


def test_fig3_says_why_the_homing_share_has_no_value_when_no_truck_went_to_automobile(tmp_path, drawn, monkeypatch):
    def fake_homing(targets, *, attack, out, device, quiet):
        Path(out).mkdir(parents=True)
        (Path(out) / "homing.json").write_text(json.dumps(homing_record(0, 0)))
        return Path(out) / "homing.md"
    monkeypatch.setattr(tian_iclr, "homing", fake_homing)
    said = []
    runs = figure_runs(tmp_path, "tian-iclr-f3", {tian_iclr.HOMING_BASE: [record(C10, {"clean": [50.0] * 10})],
                                                   tian_iclr.HOMING_WITHOUT[1]: [{}]}, echo=said)
    homed = registry.FIGURES["tian-iclr-f3"].draw(runs)[-1]
    assert homed.stat == "% homing" and homed.ours == []  # the table's "no result"
    assert any("no seed's attack sent a truck to automobile" in s for s in said)


def test_fig4_normalises_robustness_and_weight_norms_by_their_largest_class(tmp_path, drawn, monkeypatch):
    bars = {}
    monkeypatch.setattr(tian_iclr, "_diagnosis", lambda run, attack, runs, tsne_points=0: {
        "accuracy": {"adv": [10.0 * (k + 1) for k in range(10)]}, "weight_norms": [2.0] * 9 + [4.0]})
    monkeypatch.setattr(figures, "per_class_bars", lambda names, series, title, path, **kw: bars.setdefault(
        path.name, (names, series)))
    runs = figure_runs(tmp_path, "tian-iclr-f4", {"tian-iclr-fig1-cifar10-madry": [record(C10, {"pgd20": [1] * 10})]})
    registry.FIGURES["tian-iclr-f4"].draw(runs)
    names, series = bars["tian-iclr-f4-b.png"]
    assert names == C10
    assert list(series["robustness (pgd20)"][0]) == [10.0 * (k + 1) for k in range(10)]
    assert list(series["classifier weight norm"][0]) == [50.0] * 9 + [100.0]


def test_fig4_and_fig7_plot_the_papers_12_cifar100_classes():
    values = np.arange(100.0)
    shown, names = tian_iclr._plotted("c", values, [f"c{k}" for k in range(100)])
    assert list(shown) == [69, 9, 1, 28, 89, 79, 81, 93, 96, 27, 4, 80] and names[0] == "c69"


def test_fig5_scales_cvc_and_draws_each_iteration_panel(tmp_path, drawn, monkeypatch):
    monkeypatch.setattr(tian_iclr, "_diagnosis", lambda run, attack, runs, tsne_points=0: {
        "cvc": {"clean": [0.09] * 5 + [0.045] * 5}})
    probs = np.full((3, 10), 0.1)
    monkeypatch.setattr(tian_iclr, "_trajectory", lambda run, index, inv_t, device, full: (probs, 7, False))
    rows = {r: [record(C10, {})] for r in ("tian-iclr-t2-madry", "tian-iclr-t2-mart", "tian-iclr-t5-he")}
    bars = {}
    real = figures.per_class_bars
    monkeypatch.setattr(figures, "per_class_bars", lambda names, series, title, path, **kw: bars.setdefault(
        path.name, (series, title, kw)) and real(names, series, title, path, **kw))
    assert registry.FIGURES["tian-iclr-f5"].draw(figure_runs(tmp_path, "tian-iclr-f5", rows)) == []
    # variances are a few % of their bound on real runs: their axis follows them, not 0-100
    assert bars["tian-iclr-f5-a.png"][2]["percent"] is False and bars["tian-iclr-f5-e.png"][2]["percent"] is False
    assert list(bars["tian-iclr-f5-a.png"][0]) == ["Madry", "MART"]  # TRADES did not run
    assert list(bars["tian-iclr-f5-a.png"][0]["Madry"][0]) == [100.0] * 5 + [50.0] * 5  # of (C-1)/C^2 = 0.09
    assert list(bars["tian-iclr-f5-e.png"][0]) == ["HE"]
    assert sorted(p for p in bars if p[-5] in "bcdfgh") == [f"tian-iclr-f5-{p}.png" for p in "bcdfgh"]
    assert list(bars["tian-iclr-f5-h.png"][0]) == ["HE: 1/T=1", "HE: 1/T=10"]
    assert "test image 7 of this test set (not the paper's 46)" in bars["tian-iclr-f5-h.png"][1]


def test_fig5_follows_the_papers_cat_only_in_the_papers_test_set():
    """A subset renumbers the test images: its image 127 is another image, even where it is a cat."""
    y = torch.tensor([0, 3, 5, 3, 1])
    assert tian_iclr._cat(y, 3, full=True) == (3, True)
    assert tian_iclr._cat(y, 3, full=False) == (1, False)  # the subset's first cat, not called the paper's
    assert tian_iclr._cat(y, 2, full=True) == (1, False)  # not a cat here
    assert tian_iclr._cat(y, 127, full=True) == (1, False)


def test_fig6_counts_classes_per_robustness_interval(tmp_path, drawn, monkeypatch):
    counted = {}
    monkeypatch.setattr(figures, "interval_counts", lambda counts, labels, title, path, xlabel: counted.update(
        counts=counts, labels=labels))
    acc = [0.0, 10.0, 10.5, 55.0, 100.0] * 20
    runs = figure_runs(tmp_path, "tian-iclr-f6", {"tian-iclr-fig1-cifar100-madry": [
        record([f"c{k}" for k in range(100)], {"pgd20": acc})]})
    registry.FIGURES["tian-iclr-f6"].draw(runs)
    assert counted["labels"][0] == "[0,10]" and counted["labels"][-1] == "(90,100]"
    assert counted["counts"] == {"(a) CIFAR-100 (pgd20)": [40, 20, 0, 0, 0, 20, 0, 0, 0, 20]}


def test_fig6_at_subset_scale_without_its_files_names_the_folder_it_takes(tmp_path):
    """Fig. 6 is CIFAR-100 and ImageNet alone: without their subset files nothing runs, and the fix named is a
    folder holding them (one .npz is refused for a target over two data sets), never FILE.npz."""
    (tmp_path / "data").mkdir()
    with pytest.raises(UserError) as err:
        reproduce("tian-iclr-f6", scale="subset", data_dir=str(tmp_path / "data"), out=str(tmp_path / "out"),
                  gpus="cpu")
    said = str(err.value)
    assert "no cifar100-subset.npz" in said and "no imagenet-subset.npz" in said
    assert "FILE.npz" not in said and "a folder holding the files named" in said and "--scale full" in said
    assert not (tmp_path / "out").exists()  # refused before any work


def test_fig7_compares_standard_and_adversarial_gaps(tmp_path, drawn, monkeypatch):
    legends, real = {}, figures.per_class_bars
    monkeypatch.setattr(figures, "per_class_bars", lambda names, series, title, path, **kw: legends.setdefault(
        path.name, list(series)) and real(names, series, title, path, **kw))
    robust = [80.0, 90.0, 50.0, 30.0, 40.0, 40.0, 60.0, 70.0, 80.0, 70.0]
    runs = figure_runs(tmp_path, "tian-iclr-f7", {
        "tian-iclr-fig1-cifar10-madry": [record(C10, {"pgd20": robust})],
        "tian-kdd-t5-cifar10-standard": [record(C10, {"clean": [95.0] * 9 + [85.0]})],
        "tian-iclr-fig1-mnist-madry": [record(DIGITS, {"pgd40": [95.0] * 10})]})
    got = {c.stat: c for c in registry.FIGURES["tian-iclr-f7"].draw(runs)}
    assert got["gap clean"].paper == 10.7 and got["gap clean"].ours == [10.0]
    assert got["gap pgd20"].paper == 52.8 and got["gap pgd20"].ours == [60.0]
    assert len(got) == 2  # MNIST's gaps are illegible in the paper: drawn, not compared
    assert sorted(drawn) == ["tian-iclr-f7-a.png", "tian-iclr-f7-b.png"]
    # the paper's legend names each panel's largest gap and its two classes ("52.8%(Class 1-Class 3)")
    assert legends["tian-iclr-f7-b.png"] == [
        "standard training: clean, largest gap 10.0 between airplane and truck",
        "adversarial training: pgd20, largest gap 60.0 between automobile and cat"]
    assert legends["tian-iclr-f7-a.png"] == ["adversarial training: pgd40, no gap between classes"]


def test_fig8_draws_the_diagnosis_tsne(tmp_path, drawn, monkeypatch):
    pts = np.random.default_rng(0).normal(size=(20, 2)).tolist()
    monkeypatch.setattr(tian_iclr, "_diagnosis", lambda run, attack, runs, tsne_points=0: {
        "classes": C10, "tsne": {"clean": pts, "adv": pts, "labels": [k % 10 for k in range(20)]}})
    runs = figure_runs(tmp_path, "tian-iclr-f8", {tian_iclr.HOMING_BASE: [record(C10, {})]})
    registry.FIGURES["tian-iclr-f8"].draw(runs)
    assert drawn["tian-iclr-f8.png"][1:] == ["clean", "adversarial (pgd20)"]


@pytest.mark.slow  # about 60 CPU seconds: a training run, its diagnosis and a t-SNE
def test_fig8_end_to_end_at_subset_scale(tmp_path, monkeypatch):
    """`fastfair reproduce tian-iclr-f8` on the real CIFAR-10 subset: the row trains (one epoch, a narrow CNN), is
    evaluated every epoch on the test set, diagnosed once, and the figure lands in its report."""
    runs_inline(monkeypatch)
    real_data()
    out, said = tmp_path / "f8", []
    assert reproduce("tian-iclr-f8", scale="subset", data_dir=str(CIFAR_SUBSET), out=str(out), gpus="cpu", per_gpu=1,
                     sets=TINY_SUBSET, echo=said.append) == 0
    run = out / "runs" / f"{tian_iclr.HOMING_BASE}-s0"
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["val"]["pgd20"]["per_class"]  # Fig. 1's
    assert list((run / "diagnostics").glob("*-test-pgd20.json"))
    md = (out / "tian-iclr-f8.md").read_text()
    assert "![Fig. 8, tian-iclr-f8](tian-iclr-f8.png)" in md and Image.open(out / "tian-iclr-f8.png").size[0] > 600
