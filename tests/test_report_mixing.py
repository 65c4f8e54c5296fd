"""A report never mixes test sets or counts one model twice (issue 58, item 4): runs of one config group as seeds
only when scored on the same images, each seed once; an eval --data-dir that would change nothing is refused; the
figures show a class without a number as absent, never "nan"."""
import json
import shutil

import matplotlib
import numpy as np

from evalreport_helpers import digits_run
from fastfair.cli import main
from fastfair.config import Config
from fastfair.evaluation import measures
from fastfair.reports import figures
from fastfair.reports.report import compare, group_runs, load_run, write_report
from shared_runs import figures_unrendered


def _run(path, seed, per_class, data="a" * 16, absent=()):
    """A run folder of an older fastfair (unsigned files) scored on the test images fingerprinted ``data``, ten
    classes; ``absent`` classes have no images (NaN)."""
    cfg = Config()
    cfg.method.name, cfg.train.seed = "pgd-at", seed
    (path / "eval").mkdir(parents=True)
    (path / "config.toml").write_text(cfg.to_toml())
    acc = [float("nan") if k in absent else float(a) for k, a in enumerate(per_class)]
    present = [a for a in acc if a == a]
    summary = {**measures.summary(present), "overall": sum(present) / len(present)}
    results = {}
    for name, shift in (("clean", 30), ("pgd20", 0)):
        per = [min(100.0, a + shift) if a == a else a for a in acc]
        conf = np.zeros((10, 10), int)  # 100 images a class: the correct ones on the diagonal, the rest one class on
        for k, a in enumerate(per):
            if a == a:
                conf[k, k], conf[k, (k + 1) % 10] = a, 100 - a
        results[name] = {"per_class": per, "summary": summary, "confusion": conf.tolist()}
    rec = {"checkpoint": str(path / "checkpoints" / "best_pgd.pt"), "epoch": 1, "split": "test",
           "classes": [f"c{k}" for k in range(10)], "images": 100 * len(present), "precision": "fp32",
           "fingerprint": {"data": data}, "results": results,
           **({"absent_classes": [f"c{k}" for k in absent]} if absent else {})}
    (path / "eval" / "best_pgd-test.json").write_text(json.dumps(rec))
    val = {k: {"avg": 50.0, "worst": 30.0, "per_class": [50.0] * 10} for k in ("clean", "pgd10")}
    (path / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "val": val}) + "\n")
    return path


def test_a_run_scored_on_other_test_images_is_not_a_seed_of_its_copy(tmp_path, capsys, monkeypatch):
    figures_unrendered(monkeypatch)  # it reads what the report says; its figures are test_report's
    # the case: a run evaluated on classes 0-4 and its copy on all ten were "2 seeds", classes 5-9 absent
    part = _run(tmp_path / "part", 0, [60, 50, 40, 30, 20, 0, 0, 0, 0, 0], data="1" * 16, absent=range(5, 10))
    whole = _run(tmp_path / "whole", 1, [60, 50, 40, 30, 20, 70, 80, 90, 35, 45], data="2" * 16)
    groups = group_runs([load_run(part), load_run(whole)])
    assert [(g.label, g.seeds) for g in groups] == [("part", [0]), ("whole", [1])]
    assert groups[0].apart == ""
    assert "scored on other test images: 1000 test images (data 22222222) where part has 500 test images without " \
           "classes c5, c6, c7, c8, c9 (data 11111111)" in groups[1].apart
    table = compare([part, whole])
    assert "whole: the same config as part, scored on other test images" in table
    md = write_report([part, whole], tmp_path / "r").read_text()
    assert "**whole: the same config as part, scored on other test images" in md
    assert "| whole | 1 |" in md and "| part | 1 |" in md  # never "2 seeds"
    assert "not paired" in md or "other images" in md  # the paired comparison refuses other images
    # with the same images the two are one group of two seeds, as before
    again = _run(tmp_path / "again", 1, [60, 50, 40, 30, 20, 70, 80, 90, 35, 45], data="1" * 16)
    assert [(g.label, g.seeds) for g in group_runs([load_run(part), load_run(again)])] == [("part / again", [0, 1])]


def test_a_copied_run_is_not_a_second_seed_and_the_report_says_it_is_a_copy(tmp_path):
    run, _ = digits_run()
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(run, a)
    shutil.copytree(run, b)
    groups = group_runs([load_run(a), load_run(b)])
    assert [len(g.runs) for g in groups] == [1, 1]
    assert groups[1].apart.startswith(f"a copy of {a} (the same run id): seed 0 again is not another seed")
    # the same seed of the same config written by another run (another id) is a repeat, also kept apart
    fake = [_run(tmp_path / f"s{i}", 0, [50] * 10) for i in range(2)]
    twice = group_runs([load_run(p) for p in fake])
    assert [len(g.runs) for g in twice] == [1, 1] and twice[1].apart.startswith(f"the same seed as {fake[0]}")
    # labels a user gave twice to such runs name their folders rather than refusing them as different configs
    labelled = group_runs([load_run(p, "AT") for p in fake])
    assert len({g.label for g in labelled}) == 2


def test_eval_data_dir_on_a_built_in_data_set_is_refused_before_any_work(tmp_path, capsys):
    run, _ = digits_run()
    other = tmp_path / "other.npz"
    np.savez(other, x_train=np.zeros((2, 8, 8), np.uint8), y_train=np.zeros(2, int),
             x_test=np.zeros((2, 8, 8), np.uint8), y_test=np.zeros(2, int))
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    before = sorted(p.name for p in (copy / "eval").iterdir())
    assert main(["eval", str(copy), "--data-dir", str(other), "--attacks", "clean"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fastfair: error: data set 'digits' ships inside scikit-learn and reads no files: --data-dir "
                   f"{other} (data.data_dir) would change nothing; leave it out (a .npz file of your own is "
                   "--dataset npz, to train on)"]
    assert sorted(p.name for p in (copy / "eval").iterdir()) == before  # nothing written or moved


def test_figures_show_a_class_without_a_number_as_absent_never_nan(tmp_path, monkeypatch):
    saved = []
    monkeypatch.setattr(figures, "_save", lambda fig, path: saved.append(fig) or path)
    nan = float("nan")
    classes = ["a", "b", "c"]
    figures.per_class_bars(classes, {"x": ([50, nan, 30], None), "none": ([nan, nan, nan], None)}, "t",
                           tmp_path / "bars.png")
    figures.heatmap([[5, 1, nan], [2, 6, nan], [nan, nan, nan]], classes, "t", tmp_path / "heat.png")
    figures.models_by_class([[50, nan, 30], [nan, nan, nan]], ["m1", "m2"], classes, [40.0, nan], "t",
                            tmp_path / "models.png")
    for fig in saved:
        legend = [t.get_text() for t in fig.legends[0].get_texts()] if fig.legends else []
        legend += [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        written = [t.get_text() for ax in fig.axes for t in ax.texts]
        ticks = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
        assert not any("nan" in t.lower() for t in legend + written + ticks), (legend, written, ticks)
    bars, heat, models = saved
    legend = [t.get_text() for t in bars.legends[0].get_texts()] if bars.legends else \
        [t.get_text() for ax in bars.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
    assert "x (mean 40.0)" in legend and f"none (mean {figures.ABSENT})" in legend
    assert [t.get_text() for t in heat.axes[0].texts].count(figures.ABSENT) == 5
    assert [t.get_text() for t in models.axes[0].texts].count(figures.ABSENT) == 4
    boxes = [p for p in models.axes[0].patches if isinstance(p, matplotlib.patches.Rectangle) and not p.get_fill()]
    assert [(b.get_x(), b.get_y()) for b in boxes] == [(1.5, -0.5)]  # m1's worst is c; m2 has no class to box
