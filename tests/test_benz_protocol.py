"""Benz et al.'s pre-registered study as protocols: ``[paper] protocol`` rows, listed and run by ``fastfair reproduce``
without verdicts, each section's runs reported per class with the study's figures."""
from __future__ import annotations

import pytest

from fastfair import config
from fastfair.errors import UserError
from fastfair.reproduce import paper, runs, tables
from fastfair.reproduce.command import listing, reproduce
from fastfair.rundir import RunDir
from fastfair.scaleout.grid import prepare

from helpers import CIFAR_SUBSET, TINY_SUBSET, real_data
from reproduce_inline import runs_inline
from shared_runs import figures_unrendered

PAPER = '[paper]\nsource = "benz"\nrow = "R"\nfollows = "paper"\nselection = "last"\n'


def test_a_protocol_row_is_checked_like_a_table_row(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(PAPER + 'protocol = "s31-architectures"\n')
    row = paper.load(str(path))
    assert (row.protocol, row.table, row.where) == ("s31-architectures", "", "Sec. 3.1, architectures")
    for text, message in [('protocol = "architectures"\n', "protocol must name the study's section"),
                          ('protocol = "s31-x"\ntable = "1"\n', "names one of table"),
                          ('protocol = "s31-x"\nclean = {avg = 50.0}\n', "study without numbers, so it records none")]:
        path.write_text(PAPER + text)
        with pytest.raises(UserError, match=message):
            paper.load(str(path))


def test_protocols_are_tables_without_verdicts_in_the_listing():
    sections = {k: t for k, t in tables.tables().items() if t.protocol}
    assert "benz-s31-datasets" in sections
    assert all(k.startswith("benz-s") and t.source == "benz" for k, t in sections.items())
    assert not any(t.protocol for k, t in tables.tables().items() if not k.startswith("benz-"))
    lines = []
    listing(1, lines.append, only="benz-s31-datasets")  # benz-f1 and -f2 list two of its rows too
    benz = [line for line in lines if "benz-s31-datasets-" in line]
    assert len(benz) == 10 and all("[no paper numbers: a protocol;" in line for line in benz)
    assert any(line.startswith("  not run yet: ImageNet, pre-trained standard and robust ResNet-50") for line in lines)


def test_a_protocol_row_runs_its_presets_attacks_and_keeps_its_architecture_where_the_section_varies_it(tmp_path):
    real_data()
    data = tables.get("benz-s31-datasets")
    planned = runs.plan(data, 1, "subset", str(CIFAR_SUBSET.parent), tmp_path, {})
    cifar = next(p for p in planned if p.row.preset == "benz-s31-datasets-cifar10-at")
    assert cifar.attacks == ("clean", "pgd20") and cifar.sets["model.name"] == "tiny-cnn"
    mnist = next(p for p in planned if p.row.preset == "benz-s31-datasets-mnist-at")
    assert mnist.attacks == ("clean", "pgd40")
    # a section whose rows differ in their model keeps each row's, narrowed (the architectures section)
    two = tables.Table("benz-s31-x", "benz", "s31-x", (data.rows[0], paper.PaperRow(
        "tian-kdd-t5-mnist-madry", "benz", "", "", "small", "paper", "last", {}, protocol="s31-x")), protocol=True)
    kept = {p.row.preset: p.sets for p in runs.plan(two, 1, "subset", str(CIFAR_SUBSET.parent), tmp_path, {})}
    assert kept["tian-kdd-t5-mnist-madry"]["model.name"] == "small-cnn"
    assert kept[data.rows[0].preset]["model.name"] == config.resolve(data.rows[0].preset).model.name


def test_a_section_end_to_end_at_subset_scale(tmp_path, monkeypatch):
    """The data-set section on the two subsets this machine has: per data set and attack a per-class table and
    heatmap, no verdicts, the study's report per data set, and the rows without data named. The heatmaps it checks
    are rendered; the study reports' figures (some 30, most of its CPU time) are written unrendered."""
    runs_inline(monkeypatch)
    figures_unrendered(monkeypatch, render=[f"benz-s31-datasets-{attack}-{dataset}.png" for dataset, robust in (
        ("cifar10", "pgd20"), ("mnist", "pgd40")) for attack in ("clean", robust)])
    real_data()
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("cifar10-subset.npz", "mnist-subset.npz"):
        (folder / name).symlink_to(CIFAR_SUBSET.parent / name)
    out, lines = tmp_path / "s31", []
    assert reproduce("benz-s31-datasets", scale="subset", data_dir=str(folder), out=str(out), gpus="cpu", per_gpu=2,
                     sets=[*TINY_SUBSET, "data.test_per_class=1"], echo=lines.append) == 0  # one test image a class
    assert sum("not run at this scale" in line for line in lines) == 6
    md = (out / "benz-s31-datasets.md").read_text()
    assert "**No paper numbers: a protocol.**" in md and "verdict" not in md
    for dataset, robust in (("cifar10", "pgd20"), ("mnist", "pgd40")):
        assert f"## {dataset}\n" in md
        for attack in ("clean", robust):
            assert (out / f"benz-s31-datasets-{attack}-{dataset}.png").stat().st_size > 10_000
        report = (out / f"benz-s31-datasets-study-{dataset}" / "report.md").read_text()
        assert "standard training" in report and "adversarial training (PGD-AT)" in report
    row = next(line for line in md.splitlines() if "| `benz-s31-datasets-cifar10-at` |" in line)
    assert len(row.strip("| ").split(" | ")) == 7 + 10  # row, preset, seeds, avg, worst, CV, MCD and ten classes
    assert "Not run at this scale: benz-s31-datasets-svhn-at" in md
    cfg = config.load_saved_text(RunDir(out / "runs" / "benz-s31-datasets-mnist-standard-s0").read_config())
    assert (cfg.method.name, cfg.eval.attacks, cfg.train.select) == ("standard", ["clean", "pgd40"], "last")


def test_the_architecture_section_covers_the_studys_nine_models_each_narrowed_at_subset_scale(tmp_path):
    real_data()
    table = tables.get("benz-s31-architectures")
    models = {config.resolve(r.preset).model.name for r in table.rows}
    assert models == {"lenet", "vgg16", "vgg19", "resnet18", "resnet50-cifar", "densenet121", "densenet169",
                      "googlenet", "inception-v3"} and len(table.rows) == 18
    assert set(runs.SUBSET_WIDTHS) == models
    planned = runs.plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path, {})
    for p in planned:
        name = config.resolve(p.row.preset).model.name
        assert (p.sets["model.name"], p.sets["model.width"]) == (name, runs.SUBSET_WIDTHS[name])


def test_remedy_rows_name_the_pgd_at_row_as_their_baseline():
    table = tables.get("benz-s33-remedies")
    base = "benz-s33-remedies-at"
    assert {r.preset for r in table.rows} >= {base, "benz-s33-remedies-targeted-cat"}
    assert all(r.baseline == base for r in table.rows if r.preset != base)
    flat = {r.preset: config.flatten(config.resolve(r.preset).to_dict()) for r in table.rows}
    # each remedy row is the baseline with its remedy's keys: nothing else differs
    for preset, keys in flat.items():
        differ = {k for k in keys if keys[k] != flat[base].get(k)} - {"preset"}
        assert preset == base or differ and all(k.split(".")[0] not in ("data", "model", "attack", "train", "eval")
                                                for k in differ), (preset, differ)


def test_every_section_plans_at_subset_scale_and_each_run_passes_the_config_checks(tmp_path):
    real_data()
    sections = [t for t in tables.tables().values() if t.protocol]
    assert {t.key for t in sections} >= {"benz-s31-datasets", "benz-s31-architectures", "benz-s31-optimisers",
                                         "benz-s31-weight-decay", "benz-s32-explanations", "benz-s33-remedies",
                                         "benz-s34-corruptions"}
    for table in sections:
        for p in runs.plan(table, 1, "subset", str(CIFAR_SUBSET.parent), tmp_path, {}):
            if p.missing:
                continue
            _, cfg, _ = prepare(p.name, p.row.preset, p.sets, p.run_dir(tmp_path))
            assert cfg.train.epochs == runs.SUBSET_EPOCHS and cfg.train.select == "last"
    adam = config.resolve("benz-s31-optimisers-adam-cyclic-at").train
    assert (adam.optimizer, adam.lr_schedule, adam.lr) == ("adam", "cyclic", 0.001)
