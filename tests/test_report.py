"""fastfair report: seed grouping and the comparison table on hand-made runs, figures from a real CIFAR-10 run."""
import json
import re
from pathlib import Path

import numpy as np

import pytest

from evalreport_helpers import cifar_run
from shared_runs import figures_unrendered
from fastfair.evaluation import intervals, measures
from fastfair.cli import main
from fastfair.config import Config
from fastfair.reports import figures, report as report_module
from fastfair.reports.report import compare, group_runs, load_run, write_report


def _fake_run(path, seed, method, clean, robust, eps_over_epochs=None):
    """A run dir with config.toml, metrics.jsonl (2 epochs) and eval/best_pgd-test.json of an older fastfair (no
    per-image results); 100 test images per class."""
    cfg = Config()
    cfg.method.name, cfg.train.seed = method, seed
    (path / "eval").mkdir(parents=True)
    (path / "config.toml").write_text(cfg.to_toml())
    results = {}
    for name, acc in (("clean", clean), ("pgd20", robust)):
        conf = [[acc[0], 100 - acc[0]], [100 - acc[1], acc[1]]]
        # 100 images per class: the share of images correct equals the mean of the per-class accuracies
        results[name] = {"per_class": acc, "summary": {**measures.summary(acc), "overall": sum(acc) / 2},
                         "confusion": conf}
    rec = {"checkpoint": str(path / "checkpoints" / "best_pgd.pt"), "epoch": 1, "split": "test", "classes": ["a", "b"],
           "eps": 8 / 255, "precision": "fp32", "results": results}
    (path / "eval" / "best_pgd-test.json").write_text(json.dumps(rec))
    eps = eps_over_epochs or [[0.03, 0.03], [0.03, 0.03]]
    val = {k: {"avg": 50.0, "worst": 30.0, "per_class": [0, 0]} for k in ("clean", "pgd10")}
    lines = [{"epoch": e, "val": {k: {**v, "avg": v["avg"] + e, "worst": v["worst"] + e} for k, v in val.items()},
              "vectors": {"eps": eps[e], "alpha": [0.008, 0.008]}} for e in range(2)]
    (path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


@pytest.fixture
def fake_runs(tmp_path):
    return [
        _fake_run(tmp_path / "at-s0", 0, "pgd-at", [80, 60], [50, 30]),
        _fake_run(tmp_path / "at-s1", 1, "pgd-at", [82, 62], [54, 34]),
        _fake_run(tmp_path / "trades-s0", 0, "trades", [70, 70], [48, 40], [[0.03, 0.03], [0.02, 0.04]]),
    ]


@pytest.fixture
def unrendered(monkeypatch):
    figures_unrendered(monkeypatch)  # for the tests of what a report says; the figure tests below render theirs


def test_runs_differing_only_in_seed_form_one_group(fake_runs):
    groups = group_runs([load_run(p) for p in fake_runs])
    assert [(g.label, g.seeds) for g in groups] == [("at", [0, 1]), ("trades-s0", [0])]  # folders, seed tag gone


def test_comparison_table_mean_std_and_rho(fake_runs):
    table = compare(fake_runs, baseline=fake_runs[0])
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    at, trades = rows["at (baseline)"], rows["trades-s0"]
    # pgd-at robust avg 40, 44 -> 42 +- 2.83 (sample std) and its t interval 42 +- t(0.975, 1) 2 = [16.6, 67.4]; worst
    # 30, 34 -> 32 +- 2.83; CV 100 both; MCD 20; each cut to what the value can be
    assert ("| 2 | 71.00 ± 1.41 [58.3, 83.7] | 61.00 ± 1.41 [48.3, 73.7] | 42.00 ± 2.83 [16.6, 67.4] | 42.00 ± 2.83 "
            "[16.6, 67.4] | 32.00 ± 2.83 [6.6, 57.4] | 100.00 ± 0.00 [100.0, 100.0] | 20.00 ± 0.00 [20.0, 20.0] "
            "|") in at
    # trades, one run of an older fastfair: Wilson's interval of the share correct (88 of 200 images under pgd20) for
    # the mean of a balanced split, none for the worst class, CV and MCD, and a line saying why
    lo, hi = intervals.class_interval(88, 200)
    clean = "[{:.1f}, {:.1f}]".format(*intervals.class_interval(140, 200))
    # trades: rho = (40 - 32) / 32 + (44 - 42) / 42 = 0.2976
    assert (f"| 1 | 70.00 {clean} | 70.00 | 44.00 [{lo:.1f}, {hi:.1f}] | 44.00 [{lo:.1f}, {hi:.1f}] | 40.00 | 16.00 | "
            "8.00 | 0.298 |") in trades
    assert ("trades-s0: clean, pgd20: evaluated by a fastfair without per-image results, so the worst class, CV and "
            "MCD have no interval") in table and "at (at-s0)" not in table  # a group of seeds has its t intervals
    assert "pgd20 avg" in table.splitlines()[0] and "pgd20 share" in table.splitlines()[0]
    tex = compare(fake_runs, baseline=fake_runs[0], latex=True)
    assert r"$42.00 \pm 2.83$ [16.6, 67.4]" in tex and r"\toprule" in tex and "trades-s0" in tex


def test_compare_names_a_missing_attack(fake_runs):
    from fastfair.errors import UserError

    with pytest.raises(UserError, match="fastfair eval RUN_DIR --attacks aa"):
        compare(fake_runs, attack="aa")


def test_runs_from_before_the_one_based_numbering_report_their_epochs_one_based(fake_runs, tmp_path, unrendered):
    write_report(fake_runs[:1], tmp_path / "r")
    assert "(epoch 2)" in (tmp_path / "r" / "report.md").read_text()  # saved 0-based as 1: the second epoch
    assert [e["epoch"] for e in load_run(fake_runs[0]).epochs] == [1, 2]


def test_a_quick_run_is_named_above_every_table(fake_runs, tmp_path, unrendered):
    run = fake_runs[0]
    cfg = Config()
    cfg.method.name, cfg.data.train_per_class = "pgd-at", 100
    (run / "config.toml").write_text(cfg.to_toml())
    write_report([run], tmp_path / "r")
    note = "quick run: trained on the first 100/class of cifar10"
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.count(note) == 1 and md.count(note[0].upper() + note[1:]) == 1  # above the comparison, in the section
    assert note in (tmp_path / "r" / "tables.tex").read_text()


def test_every_figure_of_a_quick_run_says_so_in_its_title(fake_runs, tmp_path, monkeypatch, unrendered):
    titles, legends = {}, []
    for name in ("per_class_bars", "heatmap", "curves", "per_class_curves", "scatter_rank", "tsne"):
        draw = getattr(report_module.figures, name)

        def record(*args, _draw=draw, **kw):
            at = next(i for i, a in enumerate(args) if isinstance(a, Path))  # every figure takes (..., title, path)
            titles[args[at].name] = args[at - 1]
            if args[at].name == "compare-per-class.png":
                legends.append(list(args[1]))
            return _draw(*args, **kw)
        monkeypatch.setattr(report_module.figures, name, record)
    cfg = Config()
    cfg.method.name, cfg.data.train_per_class = "pgd-at", 100
    (fake_runs[0] / "config.toml").write_text(cfg.to_toml())
    write_report(fake_runs, tmp_path / "r")
    note = "quick run: trained on the first 100/class of cifar10"
    assert titles and all(note in t for f, t in titles.items() if f.startswith("g0-")), titles
    assert not any(note in t for f, t in titles.items() if not f.startswith("g0-"))  # the other runs used all data
    assert legends[0] == ["at-s0 (quick run)", "at-s1", "trades-s0"]  # one quick group of three


def test_report_draws_per_class_vectors_that_change(fake_runs, tmp_path, unrendered):
    write_report(fake_runs, tmp_path / "rep", baseline=fake_runs[0])
    figs = {p.name for p in (tmp_path / "rep" / "figures").iterdir()}
    assert "g1-vector-eps.png" in figs and "g0-vector-eps.png" not in figs  # only trades' eps varies
    assert "g1-vector-alpha.png" not in figs and "compare-per-class.png" in figs


def test_report_names_groups_by_folder_or_label_as_a_user_types_them(fake_runs, tmp_path, capsys, unrendered):
    out = tmp_path / "r"
    assert main(["report", *map(str, fake_runs), "--out", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert "| at | 2 |" in md and "| trades-s0 | 1 |" in md  # seeds at-s0, at-s1 are one group: "at"
    assert "method.name=" not in md.split("## Comparison")[1].split("What sets")[0]  # no config soup in the labels
    assert main(["report", *map(str, fake_runs), "--out", str(out), "--label", "AT", "--label", "AT",
                 "--label", "TRADES"]) == 0
    md = (out / "report.md").read_text()
    assert "| AT | 2 |" in md and "| TRADES | 1 |" in md and "## AT\n" in md


def test_a_label_count_that_does_not_match_the_runs_is_one_error_line(fake_runs, tmp_path, capsys):
    assert main(["report", *map(str, fake_runs), "--label", "AT", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["fastfair: error: 1 --label for 3 runs: give one --label per RUN_DIR, in their order (or none: "
                   "runs are then named by their folders)"]
    assert not (tmp_path / "r").exists()  # checked before anything is written
    assert main(["report", str(fake_runs[0]), "--label", " "]) == 2
    assert capsys.readouterr().err.strip() == ("fastfair: error: --label is empty; give each run a name, "
                                               "e.g. --label TRADES")


def test_one_label_for_runs_that_differ_in_more_than_the_seed_is_an_error(fake_runs, tmp_path, capsys):
    assert main(["report", *map(str, fake_runs), "--label", "A", "--label", "A", "--label", "A"]) == 2
    assert "--label 'A' names runs whose configs differ in more than the seed (method.name" in capsys.readouterr().err


def test_two_runs_in_folders_of_one_name_are_told_apart_by_their_parent(tmp_path):
    a = _fake_run(tmp_path / "a" / "run", 0, "pgd-at", [80, 60], [50, 30])
    b = _fake_run(tmp_path / "b" / "run", 0, "trades", [70, 70], [48, 40])
    assert [g.label for g in group_runs([load_run(a), load_run(b)])] == ["a/run", "b/run"]


def test_the_config_differences_are_a_table_under_the_comparison_figure(fake_runs, tmp_path, unrendered):
    from fastfair import config

    for run, method in zip(fake_runs, ("pgd-at", "pgd-at", "trades")):  # configs as train writes them
        cfg = config.resolve(None, {"method.name": method, "train.seed": int(run.name[-1])})
        (run / "config.toml").write_text(cfg.to_toml())
    write_report(fake_runs, tmp_path / "r")
    md = (tmp_path / "r" / "report.md").read_text()
    figure = md.index("(figures/compare-per-class.png)")
    table = md.index("| config key | at | trades-s0 |")
    assert figure < table < md.index("## at\n")
    assert "| `method.name` | pgd-at | trades |" in md  # rows: the keys that differ; columns: the groups
    assert "| `train.seed` |" not in md  # seeds are what a group averages over, not a difference
    # keys TRADES' own defaults set are named once, not a row each
    assert "Also different, as each method's defaults set them: `attack.bn_mode`" in md
    tex = (tmp_path / "r" / "tables.tex").read_text()  # the same table for the paper
    assert r"config key & at & trades-s0 \\" in tex and r"\texttt{method.name} & pgd-at & trades \\" in tex
    assert "% Also different, as each method's defaults set them: attack.bn\\_mode" in tex


def test_report_paths_are_relative_so_its_folder_can_move(fake_runs, tmp_path, unrendered):
    out = tmp_path / "reports" / "cmp"
    write_report(fake_runs, out)
    md = (out / "report.md").read_text()
    assert str(tmp_path) not in md
    links = re.findall(r"\]\(([^)]+)\)", md)
    assert "../../at-s0" in links and "figures/compare-per-class.png" in links
    moved = tmp_path / "moved" / "cmp"  # beside the runs at the same depth: every link still lands
    moved.parent.mkdir()
    out.rename(moved)
    assert all((moved / link).exists() for link in links), links


def test_the_report_goes_in_the_run_or_beside_the_runs_when_no_out_is_given(fake_runs, tmp_path, monkeypatch,
                                                                            capsys, unrendered):
    monkeypatch.chdir(tmp_path)
    assert main(["report", "at-s0"]) == 0
    assert capsys.readouterr().out.startswith("written: at-s0/report/report.md (figures in at-s0/report/figures")
    assert main(["report", "at-s0", "at-s1", "trades-s0", "--label", "AT", "--label", "AT", "--label", "TRADES"]) == 0
    assert capsys.readouterr().out.startswith("written: report-AT-vs-TRADES/report.md")
    assert (tmp_path / "report-AT-vs-TRADES" / "figures" / "compare-per-class.png").is_file()
    assert not (tmp_path / "report").exists()


def _drawn(monkeypatch):
    """Figures the report module draws, kept open: path name -> matplotlib figure."""
    figs = {}
    save = figures._save

    def keep(fig, path):
        fig.canvas.draw()  # lays out the legend and title before save closes the figure
        figs[path.name] = fig
        return save(fig, path)
    monkeypatch.setattr(figures, "_save", keep)
    return figs


def test_zero_bars_are_drawn_and_the_legend_sits_above_the_bars(tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    classes = [f"class {k}" for k in range(10)]
    series = {f"run-{i}": ([0.0 if k == i else 10.0 * k + i for k in range(10)], None) for i in range(4)}
    figures.per_class_bars(classes, series, "per-class pgd20 accuracy", tmp_path / "bars.png")
    ax = figs["bars.png"].axes[0]
    zeros = [line for line in ax.lines if line.get_gid() == figures.ZERO_GID]
    assert [list(line.get_ydata()) for line in zeros] == [[0.0]] * 4  # one marker at 0 per run's zero bar
    bars = [p for c in ax.containers for p in c.patches]
    heights = {round(p.get_x() + p.get_width() / 2, 3): p.get_height() for p in bars}
    assert all(heights[round(float(line.get_xdata()[0]), 3)] == 0 for line in zeros)  # each on a bar of height 0
    assert sum(t.get_text() == "0" for t in ax.texts) == 4  # the value written above it
    assert ax.get_ylim()[0] < 0  # the marker clears the axis line
    legend, box = ax.get_legend().get_window_extent(), ax.get_window_extent()
    assert legend.y0 >= box.y1 - 1 and legend.width <= box.width  # above the axes, within their width
    assert "\n" not in ax.get_title() and [t.get_text() for t in ax.get_xticklabels()] == classes


def test_a_hundred_classes_are_points_sorted_by_accuracy_on_a_page_wide_figure(tmp_path, monkeypatch):
    figs = _drawn(monkeypatch)
    classes = [f"c{k}" for k in range(100)]
    acc = [float((37 * k) % 100) for k in range(100)]
    figures.per_class_bars(classes, {"a": (acc, None), "b": (acc[::-1], None)}, "t", tmp_path / "bars.png")
    figures.heatmap(np.eye(100), classes, "t", tmp_path / "heat.png")
    ax = figs["bars.png"].axes[0]
    assert not ax.patches and figs["bars.png"].get_size_inches()[0] <= 12  # no 200 hair-thin bars
    mean = (np.asarray(acc) + np.asarray(acc[::-1])) / 2
    assert [t.get_text() for t in ax.get_xticklabels()] == [classes[k] for k in np.argsort(mean, kind="stable")]
    assert max(figs["heat.png"].get_size_inches()) <= 11


def _png_ok(path):
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    return img.shape[0] > 200 and img.shape[1] > 200 and float(img[..., :3].std()) > 0.02


@pytest.mark.slow
def test_report_of_a_real_cifar10_run(tmp_path, monkeypatch):
    run = cifar_run(tmp_path)
    from fastfair.evaluation.per_class import evaluate_checkpoint

    evaluate_checkpoint(run / "checkpoints" / "best_pgd.pt", attacks=["fgsm"], device="cpu", quiet=True)
    saved = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    assert list(saved["results"]) == ["clean", "pgd10", "fgsm"]  # the later eval added fgsm, kept the rest

    out = tmp_path / "report"
    want = ["g0-per-class", "g0-confusion", "g0-curves", "g0-misclassified", "g0-weight-norms", "g0-tsne"]
    figures_unrendered(monkeypatch, render=[f"{name}.png" for name in want])  # the report's others: unchecked here
    assert main(["report", str(run), "--out", str(out), "--attack", "pgd10"]) == 0
    md = (out / "report.md").read_text()
    for name in want:
        assert f"figures/{name}.png" in md
        assert _png_ok(out / "figures" / f"{name}.png"), name
    assert "| cat |" in md and "CVC clean" in md
    assert "every evaluated attack (clean, pgd10, fgsm)" in md  # per-class bars of each attack, not two
    assert "the dotted line marks the evaluated checkpoint's epoch" in md
    assert "| CV (variance, %²) |" in md and r"CV (variance, \%$^2$)" in (out / "tables.tex").read_text()
    diag_png = run / "diagnostics" / "best_pgd-test-pgd10-tsne.png"  # diagnose draws its t-SNE itself
    assert _png_ok(diag_png)
    assert "mean of per-class accuracies" in md and "share of images correct" in md  # both averages, labelled
    tex = (out / "tables.tex").read_text()
    assert "share of images correct" in tex
    assert tex.count(r"\begin{tabular}") == 2
    assert main(["report", str(tmp_path / "nothing-here")]) == 2


def test_rho_says_why_it_has_no_number(tmp_path, capsys, unrendered):
    base = _fake_run(tmp_path / "base", 0, "pgd-at", [80, 60], [50, 0])  # the baseline's worst class: 0 %
    other = _fake_run(tmp_path / "other", 0, "trades", [70, 70], [48, 40])
    assert main(["report", str(base), str(other), "--baseline", str(base), "--out", str(tmp_path / "r")]) == 0
    md = (tmp_path / "r" / "report.md").read_text()
    assert re.search(r"^\|(?!.*\(baseline\)).*\| n/a \|$", md, re.M), md  # the other run's rho cell
    assert ("rho is n/a: the baseline's worst class has 0 % pgd20 accuracy, and rho divides by it (a gain relative "
            "to 0 is undefined).") in md
    assert main(["report", str(base), str(other), "--out", str(tmp_path / "r2")]) == 0  # no baseline: '-' and why
    assert "rho needs a baseline: fastfair report RUN_DIR... --baseline RUN_DIR." in (tmp_path / "r2" /
                                                                                      "report.md").read_text()
