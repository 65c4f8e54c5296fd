"""fastfair report: seed grouping and the comparison table on hand-made runs, figures from a real CIFAR-10 run."""
import json
import re
from pathlib import Path

import pytest

from evalreport_helpers import cifar_run
from fastfair.evaluation import measures
from fastfair.cli import main
from fastfair.config import Config
from fastfair.reports import report as report_module
from fastfair.reports.report import compare, group_runs, load_run, write_report


def _fake_run(path, seed, method, clean, robust, eps_over_epochs=None):
    """A run dir with config.toml, metrics.jsonl (2 epochs) and eval/best_pgd-test.json; 10 test images per class."""
    cfg = Config()
    cfg.method.name, cfg.train.seed = method, seed
    (path / "eval").mkdir(parents=True)
    (path / "config.toml").write_text(cfg.to_toml())
    results = {}
    for name, acc in (("clean", clean), ("pgd20", robust)):
        conf = [[acc[0] // 10, 10 - acc[0] // 10], [10 - acc[1] // 10, acc[1] // 10]]
        # 10 images per class: the share of images correct equals the mean of the per-class accuracies
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


def test_runs_differing_only_in_seed_form_one_group(fake_runs):
    groups = group_runs([load_run(p) for p in fake_runs])
    assert [(g.label, g.seeds) for g in groups] == [("method.name=pgd-at", [0, 1]), ("method.name=trades", [0])]


def test_comparison_table_mean_std_and_rho(fake_runs):
    table = compare(fake_runs, baseline=fake_runs[0])
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[2:]}
    at, trades = rows["method.name=pgd-at (baseline)"], rows["method.name=trades"]
    # pgd-at robust avg 40, 44 -> 42 +- 2.83 (sample std); worst 30, 34 -> 32 +- 2.83; CV 100 both; MCD 20
    assert ("| 2 | 71.00 ± 1.41 | 61.00 ± 1.41 | 42.00 ± 2.83 | 42.00 ± 2.83 | 32.00 ± 2.83 | 100.00 ± 0.00 | "
            "20.00 ± 0.00 |") in at
    # trades: rho = (40 - 32) / 32 + (44 - 42) / 42 = 0.2976
    assert "| 1 | 70.00 | 70.00 | 44.00 | 44.00 | 40.00 | 16.00 | 8.00 | 0.298 |" in trades
    assert "pgd20 avg" in table.splitlines()[0] and "pgd20 share" in table.splitlines()[0]
    tex = compare(fake_runs, baseline=fake_runs[0], latex=True)
    assert r"$42.00 \pm 2.83$" in tex and r"\toprule" in tex and "method.name=trades" in tex


def test_compare_names_a_missing_attack(fake_runs):
    from fastfair.errors import UserError

    with pytest.raises(UserError, match="fastfair eval RUN_DIR --attacks aa"):
        compare(fake_runs, attack="aa")


def test_runs_from_before_the_one_based_numbering_report_their_epochs_one_based(fake_runs, tmp_path):
    write_report(fake_runs[:1], tmp_path / "r")
    assert "(epoch 2)" in (tmp_path / "r" / "report.md").read_text()  # saved 0-based as 1: the second epoch
    assert [e["epoch"] for e in load_run(fake_runs[0]).epochs] == [1, 2]


def test_a_quick_run_is_named_above_every_table(fake_runs, tmp_path):
    run = fake_runs[0]
    cfg = Config()
    cfg.method.name, cfg.data.train_per_class = "pgd-at", 100
    (run / "config.toml").write_text(cfg.to_toml())
    write_report([run], tmp_path / "r")
    note = "quick run: trained on the first 100/class of cifar10"
    md = (tmp_path / "r" / "report.md").read_text()
    assert md.count(note) == 1 and md.count(note[0].upper() + note[1:]) == 1  # above the comparison, in the section
    assert note in (tmp_path / "r" / "tables.tex").read_text()


def test_every_figure_of_a_quick_run_says_so_in_its_title(fake_runs, tmp_path, monkeypatch):
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
    assert legends[0] == ["data.train_per_class=100, method.name=pgd-at (quick run)",  # one quick group of three
                          "data.train_per_class=0, method.name=pgd-at", "data.train_per_class=0, method.name=trades"]


def test_report_draws_per_class_vectors_that_change(fake_runs, tmp_path):
    write_report(fake_runs, tmp_path / "rep", baseline=fake_runs[0])
    figs = {p.name for p in (tmp_path / "rep" / "figures").iterdir()}
    assert "g1-vector-eps.png" in figs and "g0-vector-eps.png" not in figs  # only trades' eps varies
    assert "g1-vector-alpha.png" not in figs and "compare-per-class.png" in figs


def _png_ok(path):
    import matplotlib.image as mpimg

    img = mpimg.imread(path)
    return img.shape[0] > 200 and img.shape[1] > 200 and float(img[..., :3].std()) > 0.02


@pytest.mark.slow
def test_report_of_a_real_cifar10_run(tmp_path):
    run = cifar_run(tmp_path)
    from fastfair.evaluation.per_class import evaluate_checkpoint

    evaluate_checkpoint(run / "checkpoints" / "best_pgd.pt", attacks=["fgsm"], device="cpu", quiet=True)
    saved = json.loads((run / "eval" / "best_pgd-test.json").read_text())
    assert list(saved["results"]) == ["clean", "pgd10", "fgsm"]  # the later eval added fgsm, kept the rest

    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out), "--attack", "pgd10"]) == 0
    md = (out / "report.md").read_text()
    want = ["g0-per-class", "g0-confusion", "g0-curves", "g0-misclassified", "g0-weight-norms", "g0-tsne"]
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


def test_rho_says_why_it_has_no_number(tmp_path, capsys):
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
