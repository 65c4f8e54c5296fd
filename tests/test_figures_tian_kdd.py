"""Tian et al. KDD 2021's figures and Table 4 as reproduce targets (fastfair/reproduce/figures/tian_kdd.py): each
drawer on hand-made runs, the numbers it returns and the panels it draws."""
import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from fastfair import build, cli
from fastfair.reproduce.figures import registry, tian_kdd
from fastfair.reproduce.figures.registry import FigureRuns
from fastfair.rundir import RunDir, read_json

from helpers import real_data
from reproduce_inline import runs_inline, tiny

# the demo preset (scikit-learn digits, 10 classes) cut to seconds, as tests/test_tian_sec6.py trains it
FAST = ["--quiet", "--set", "model.width=4", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm",
        "--set", "eval.attacks=['clean', 'fgsm']", "--set", "data.batch_size=256", "--device", "cpu"]
DIGITS = [str(k) for k in range(10)]


def _figure_runs(out: Path, key: str, runs: dict, records: dict | None = None) -> FigureRuns:
    return FigureRuns(key, out, "subset", False, DIGITS, runs, records or {}, gpus="cpu", echo=lambda line: None)


def _size(path: Path) -> tuple[int, int]:
    with Image.open(path) as im:
        return im.size


def test_the_inventory_lists_every_item_with_numbers_in_the_papers_order_and_each_figure_is_a_target():
    items = registry.INVENTORY["tian-kdd"]
    assert items == ("Fig. 1", "Fig. 2", "Table 1", "Fig. 3", "Table 3", "Fig. 4", "Table 4", "Fig. 5", "Fig. 6",
                     "Table 5")  # Table 2 names super-classes: no measured number
    own = {k for k, spec in registry.FIGURES.items() if spec.source == "tian-kdd"}
    assert own == {"tian-kdd-f1", "tian-kdd-f2", "tian-kdd-f3", "tian-kdd-f4", "tian-kdd-t4", "tian-kdd-f5",
                   "tian-kdd-f6"}
    assert not any(registry.FIGURES[k].pending for k in own)  # everything runs here


# ---- Figs. 1 and 2: Table 5's runs, read from their files ---------------------------------------------------

def _sec4_run(folder: Path, per_epoch: list[list[float]], attack: str) -> Path:
    folder.mkdir(parents=True)
    lines = [{"epoch": e + 1, "val": {"clean": {"per_class": [90.0] * 10}, attack: {"per_class": v}}}
             for e, v in enumerate(per_epoch)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return folder


def _record(confusion: np.ndarray, attack: str = "pgd20") -> dict:
    return {"classes": DIGITS, "results": {"clean": {"per_class": [90.0] * 10},
                                           attack: {"per_class": (100 * np.diag(confusion) / confusion.sum(1)).tolist(),
                                                    "confusion": confusion.tolist()}}}


def test_fig1_draws_a_panel_per_data_set_that_ran_and_compares_the_texts_gaps(tmp_path):
    mnist = [[90.0] * 9 + [80.0], [95.0] * 9 + [91.0]]  # gap 10 then 4: the last (4) is MNIST's
    cifar = [[50.0] * 9 + [20.0], [60.0] * 9 + [50.0]]  # gap 30 then 10: the widest (30) is CIFAR-10's
    runs = {"tian-kdd-t5-mnist-madry": [_sec4_run(tmp_path / "m", mnist, "pgd40")],
            "tian-kdd-t5-cifar10-madry": [_sec4_run(tmp_path / "c", cifar, "pgd10")]}
    records = {p: [_record(np.eye(10) * 5 + 1)] for p in runs}
    fr = _figure_runs(tmp_path, "tian-kdd-f1", runs, records)
    got = tian_kdd.fig1(fr)
    assert [(c.paper, c.ours, c.margin) for c in got] == [(6.0, [4.0], 5.0), (45.0, [30.0], 5.0)]
    # the subset scale's test images are a part of the paper's: a gap's two classes are not named, so the binomial
    # term takes the largest error, q = 1/2, on 15 images a class
    assert got[0].image_sd == pytest.approx(math.sqrt(2) * 50 / math.sqrt(15))
    assert "Fig. 1(a) MNIST" in got[0].row and "last" in got[0].row and "widest" in got[1].row
    assert [p.name for p in fr.pngs] == ["tian-kdd-f1-a-mnist.png", "tian-kdd-f1-b-cifar-10.png"]
    assert all(p.is_file() for p in fr.pngs)


def test_fig1_shows_the_papers_twelve_classes_of_cifar100_and_every_class_of_ten():
    """The paper "randomly sample[s] 12 classes" once: the ones its figure shows (the ICLR copy's axes), not 12 of
    our own drawing."""
    shown = tian_kdd._shown("c", [f"c{k}" for k in range(100)])
    assert shown == [69, 9, 1, 28, 89, 79, 81, 93, 96, 27, 4, 80]
    assert len(tian_kdd._shown("f", [f"c{k}" for k in range(1000)])) == 11  # ImageNet's ninth label is illegible
    assert tian_kdd._shown("b", DIGITS) == list(range(10))


def test_fig2_draws_each_data_sets_confusion_in_percent_of_the_true_class(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(tian_kdd.figures, "heatmap", lambda m, classes, title, path, **kw: drawn.append((m, title)))
    conf = np.full((10, 10), 1.0)
    conf[3, 5] = 11.0  # cat -> dog: 11 of cat's 20 images
    runs = {"tian-kdd-t5-cifar10-madry": [tmp_path / "s0", tmp_path / "s1"]}
    fr = _figure_runs(tmp_path, "tian-kdd-f2", runs, {p: [_record(conf), _record(conf)] for p in runs})
    assert tian_kdd.fig2(fr) == []
    (m, title), = drawn
    assert m[3, 5] == pytest.approx(55.0) and m.sum(axis=1) == pytest.approx(np.full(10, 100.0))
    assert "Fig. 2(b): CIFAR-10" in title and "pgd20" in title


# ---- the figures drawn from checkpoints: tiny demo runs stand in for the paper's -------------------------------

@pytest.fixture
def quick(monkeypatch):
    """The drawers' attacks at a step or three: the paper's 20 steps would only make the tests slower."""
    monkeypatch.setattr(tian_kdd, "HOMING_ATTACK", "fgsm")
    monkeypatch.setattr(tian_kdd, "TPGD", "tpgd2@t0.2")
    monkeypatch.setattr(tian_kdd, "PGD_STEPS", (1, 2, 3))


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kdd-runs")
    out = {}
    for name, extra in (("base", []), ("without-5", ["--set", "data.drop_classes=[5]"])):
        assert cli.main(["train", "--config", "demo", "--epochs", "1", *FAST, "--out", str(root / name), *extra]) == 0
        out[name] = root / name
    out["adjusted"] = out["base"]  # Table 4 attacks the adjusted model on the same images: any model of them will do
    return out


def _grid_record(per_class: list[float]) -> dict:
    return {"classes": DIGITS, "results": {"tpgd20@grid": {"per_class": per_class}}}


def test_fig4_compares_the_cats_sent_to_dog_and_those_that_home_and_draws_three_panels(demo_runs, quick, tmp_path):
    runs = {tian_kdd.HOMING_BASE: [demo_runs["base"]], tian_kdd.WITHOUT[5]: [demo_runs["without-5"]],
            tian_kdd.BASE: [demo_runs["base"]], tian_kdd.ADJUSTED: [demo_runs["adjusted"]]}
    records = {tian_kdd.BASE: [_grid_record([30.0] * 10)], tian_kdd.ADJUSTED: [_grid_record([35.0] * 10)]}
    fr = _figure_runs(tmp_path, "tian-kdd-f4", runs, records)
    sent, home = tian_kdd.fig4(fr)
    rec = json.loads((tmp_path / "tian-kdd-f4-homing-s0" / "homing.json").read_text())
    cats = rec["images"] / 10
    assert (sent.paper, home.paper) == (20.0, 59.5)
    assert sent.ours == [pytest.approx(100 * rec["misclassified"][3][5] / cats)]
    sent_to_dog = rec["misclassified"][3][5]  # none sent: no share to compare (a share of nothing is not 0 %)
    assert home.ours == ([pytest.approx(100 * rec["homing"][3][5] / sent_to_dog)] if sent_to_dog else [])
    assert [p.name for p in fr.pngs] == ["tian-kdd-f4-ab.png", "tian-kdd-f4-c.png"]
    assert _size(fr.pngs[0])[0] > _size(fr.pngs[0])[1]  # (a) and (b) side by side


def test_table4_returns_its_sixty_counts_as_shares_of_the_test_cats(demo_runs, quick, tmp_path):
    runs = {tian_kdd.BASE: [demo_runs["base"]], tian_kdd.ADJUSTED: [demo_runs["adjusted"]]}
    fr = _figure_runs(tmp_path, "tian-kdd-t4", runs)
    got = tian_kdd.table4(fr)
    assert len(got) == 60 and fr.pngs == []
    assert got[3].paper == 71.0 and got[33].paper == 26.2 and got[43].paper == 40.3 and got[53].paper == 43.5
    rec = json.loads(next((demo_runs["base"] / "eval").glob("*-background-3-white.json")).read_text())
    n = rec["images"]
    assert got[33].ours == [pytest.approx(100 * rec["counts"]["original"][tian_kdd.TPGD][3] / n)]
    assert got[55].ours == [pytest.approx(100 * rec["adjusted"]["counts"][tian_kdd.TPGD][5] / n)]
    for line in range(6):  # each line's shares add up to all the cats
        assert sum(c.ours[0] for c in got[10 * line:10 * line + 10]) == pytest.approx(100.0)


def test_fig6_draws_two_cats_before_and_after_the_white_background(demo_runs, quick, tmp_path):
    runs = {tian_kdd.BASE: [demo_runs["base"]], tian_kdd.ADJUSTED: [demo_runs["adjusted"]]}
    fr = _figure_runs(tmp_path, "tian-kdd-f6", runs)
    assert tian_kdd.fig6(fr) == []
    png, = fr.pngs
    rec = json.loads(next((demo_runs["base"] / "eval").glob("*-background-3-white.json")).read_text())
    assert png.name == "tian-kdd-f6.png" and png.read_bytes() == Path(rec["figure"]).read_bytes()
    assert len(rec["examples"]) == 2  # the paper shows two cats


def test_fig3_draws_the_cvc_of_each_defense_and_marts_output_after_each_number_of_steps(demo_runs, quick, tmp_path):
    runs = {preset: [demo_runs["base"]] for preset in tian_kdd.TABLE1.values()}
    fr = _figure_runs(tmp_path, "tian-kdd-f3", runs)
    assert tian_kdd.fig3(fr) == []
    assert [p.name for p in fr.pngs] == ["tian-kdd-f3-a-cvc.png", "tian-kdd-f3-b-steps1.png",
                                         "tian-kdd-f3-c-steps2.png", "tian-kdd-f3-d-steps3.png"]
    assert all(p.is_file() for p in fr.pngs)


def test_fig5_draws_the_images_and_both_confusion_matrices_under_the_presets_attack(demo_runs, tmp_path,
                                                                                    monkeypatch):
    titles = []
    heatmap = tian_kdd.figures.heatmap
    monkeypatch.setattr(tian_kdd.figures, "heatmap", lambda m, c, title, path, **kw: titles.append(title) or
                        heatmap(m, c, title, path, **kw))
    run = demo_runs["base"]
    record = read_json(RunDir(run).eval_file(build.checkpoint_path(run), "test"))  # what reproduce hands a drawer
    assert "pgd40" not in record["results"]
    fr = _figure_runs(tmp_path, "tian-kdd-f5", {tian_kdd.FIG5: [run]}, {tian_kdd.FIG5: [record]})
    assert tian_kdd.fig5(fr) == []
    assert [p.name for p in fr.pngs] == ["tian-kdd-f5-a.png", "tian-kdd-f5-b.png", "tian-kdd-f5-c.png"]
    assert all(p.is_file() for p in fr.pngs)
    # PGD-40, the preset's test attack, though the run evaluated only what reproduce asked of it
    assert "natural images" in titles[0] and "pgd40 images" in titles[1]
    assert "pgd40" in fr.records[tian_kdd.FIG5][0]["results"]


# ---- end to end, the CLI on the real CIFAR-10 subset --------------------------------------------------------

def test_fig2_end_to_end_at_subset_scale_through_the_cli(tmp_path, capsys, monkeypatch):
    runs_inline(monkeypatch)
    folder = tmp_path / "data"  # the CIFAR-10 subset alone: Fig. 2's other data sets are left out, and said so
    folder.mkdir()
    (folder / "cifar10-subset.npz").symlink_to(real_data())
    out = tmp_path / "f2"
    assert cli.main(["reproduce", "tian-kdd-f2", "--scale", "subset", "--data-dir", str(folder), "--out", str(out),
                     "--gpus", "cpu", *tiny()]) == 0
    said = capsys.readouterr().out
    assert "not run at this scale: tian-kdd-t5-mnist-madry" in said
    md = (out / "tian-kdd-f2.md").read_text()
    assert md.startswith("# Reproduce: Tian et al. 2021 (KDD), Fig. 2\n")
    assert "](tian-kdd-f2-b-cifar-10.png)" in md and (out / "tian-kdd-f2-b-cifar-10.png").stat().st_size > 0
    assert list(out.glob("tian-kdd-f2-*.png")) == [out / "tian-kdd-f2-b-cifar-10.png"]
