"""``fastfair reproduce``: the presets' paper numbers, verdicts, --list, the missing-data error, and one
table end to end at the subset scale on the real CIFAR-10 subset (structure only, never the numbers)."""
import dataclasses
import json
from pathlib import Path
import re
import struct
import zlib

import numpy as np
import pytest

from fastfair import cli, config
from fastfair.errors import UserError
from fastfair.reproduce import paper, runs, tables, verdict, write
from fastfair.reproduce.command import reproduce
from fastfair.reproduce.paper import Number, PaperRow
from fastfair.reproduce.verdict import DEFAULT_TOLERANCE, NOT_COMPARABLE, compare_row
from fastfair.rundir import RunDir
from fastfair.preset_files import preset_names

from helpers import CIFAR10, CIFAR_SUBSET, TINY_SUBSET, real_data
from reproduce_inline import runs_inline
from shared_runs import figures_unrendered


@pytest.mark.parametrize("preset", [p for p in preset_names() if p != "demo"])
def test_every_preset_names_its_source_and_numbers_that_parse(preset):
    row = paper.load(preset)
    assert row is not None and row.source in paper.PAPERS and row.row
    assert (row.table or row.figure or row.protocol) and row.follows in paper.FOLLOWS
    # its prose description names the same table, figure or section
    where = row.where.split(",")[0]
    assert where in config.resolve(preset).preset
    for number in row.numbers.values():
        values = [number.avg, number.worst, *number.per_class, *number.classes.values()]
        assert all(0 <= v <= 100 for v in values if v is not None)
        if number.per_class:
            assert len(number.per_class) == 10 and number.worst == min(number.per_class)
            # papers round a total and its classes apart: Tian et al. KDD Table 1 prints totals up to 0.09 from their
            # classes' mean (Madry PGD 52.1 for 52.19, which ICLR Table 2 prints as 52.2); a class typo of a point
            # moves the mean by 0.1
            assert number.avg == pytest.approx(sum(number.per_class) / 10, abs=0.095)


def test_paper_numbers_stay_out_of_the_run_config():
    assert not any(k.startswith("paper") for k in config.read_preset("cfa-t1-at"))
    assert "paper" not in config.resolve("cfa-t1-at").to_dict()


def test_every_table_row_reports_numbers_or_is_another_rows_run():
    for table in tables.tables().values():
        needed = {name for row in table.rows for name in row.depends_on}
        # a figure's drawer reads its rows' runs: the numbers the paper states may be the figure's, not a row's
        assert all(row.numbers or row.preset in needed or table.protocol or table.figure for row in table.rows), \
            table.key


def test_a_broken_paper_section_is_one_user_error(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[paper]\nsource = "cfa"\ntable = "1"\nrow = "AT"\nfollows = "paper"\nselection = "best"\n'
                    'aa = {avg = 146.7}\n')
    with pytest.raises(UserError, match=r"aa.avg must be an accuracy in %"):
        paper.load(str(path))
    path.write_text('[paper]\nsource = "nope"\n')
    with pytest.raises(UserError, match="source must be one of"):
        paper.load(str(path))


def _row(**numbers) -> PaperRow:
    return PaperRow("p", "cfa", "1", "", "AT", "paper", "best", numbers)


def _record(avg, worst, per_class=None, overall=None):
    per_class = per_class or [worst] + [avg] * 9
    return {"classes": CIFAR10, "results": {"aa": {"per_class": per_class, "summary": {
        "avg": avg, "worst": worst, **({"overall": overall} if overall is not None else {})}}}}


def test_verdicts_read_the_interval_of_the_difference_against_the_margin():
    """Five seeds (records without a confusion matrix: no binomial floor, the seeds' std alone): the average's 90 %
    interval lies inside +-1 point, the worst class's 95 % interval lies below 0."""
    row = _row(aa=Number(avg=50.0, worst=24.0))
    recs = [_record(v, v - 30) for v in (50.2, 50.6, 50.4, 50.3, 50.5)]
    comps = {c.stat: c for c in compare_row(row, recs, True, CIFAR10)}
    assert comps["avg"].mean == pytest.approx(50.4) and comps["avg"].verdict == "agrees"
    assert comps["avg"].margin == DEFAULT_TOLERANCE["avg"] and comps["avg"].margin_from == "default"
    assert comps["avg"].std == pytest.approx(0.1581, abs=1e-3)
    assert comps["worst"].diff == pytest.approx(-3.6) and comps["worst"].verdict == "lower"
    # three seeds against a paper's std of 0.3 over five runs: 0.5 off is more than its std (the old rule's
    # "higher"), but the 95 % interval holds 0: the data cannot tell
    strict = compare_row(dataclasses.replace(_row(aa=Number(avg=50.0, std={"avg": 0.3})), seeds=5),
                         [_record(v, 20.0) for v in (49.5, 50.5, 51.5)], True, CIFAR10)[0]
    assert (strict.margin, strict.paper_n, strict.paper_std) == (1.0, 5, 0.3)
    assert strict.verdict == verdict.UNDECIDED and strict.interval[0] < 0 < strict.interval[1]
    # one seed measures no spread: no test, whatever the paper prints
    one = compare_row(dataclasses.replace(_row(aa=Number(avg=50.0, std={"avg": 0.3})), seeds=5),
                      [_record(50.5, 20.0)], True, CIFAR10)[0]
    assert one.verdict == verdict.ONE_SEED and one.interval is None
    # averages compare with the share of images correct (the papers' accuracy) where the record has it
    share = compare_row(_row(aa=Number(avg=50.0)), [_record(40.0, 20.0, overall=v) for v in (50.1, 50.2, 50.3)],
                        True, CIFAR10)[0]
    assert share.mean == pytest.approx(50.2) and share.verdict == "agrees"


def test_verdicts_per_class_and_when_not_comparable():
    per = [60.0] * 10
    row = _row(aa=Number(per_class=tuple(per), classes={"cat": 30.0}))
    recs = [_record(60.0, 25.0 + d, per_class=[60.0 + d] * 3 + [25.0 + d] + [64.0 + d] * 6) for d in (-0.2, 0.0, 0.2)]
    comps = {c.stat: c for c in compare_row(row, recs, True, CIFAR10)}
    assert comps["airplane"].verdict == "agrees" and comps["frog"].verdict == "higher"
    assert comps["cat"].paper == 30.0 and comps["cat"].verdict == "lower"
    assert all(c.verdict == NOT_COMPARABLE for c in compare_row(row, recs, False, CIFAR10))
    assert all(c.verdict == "no result" for c in compare_row(row, [], True, CIFAR10))


def test_list_shows_every_table_its_runs_and_cost(capsys):
    assert cli.main(["reproduce", "--list", "--seeds", "3"]) == 0
    out = capsys.readouterr().out
    for key in ("me-t2", "me-t3", "me-t4", "cfa-t1", "cfa-t2", "cfa-t3", "tian-iclr-t2", "tian-iclr-t3", "tian-iclr-t4",
                "tian-iclr-t5", "tian-kdd-t1", "tian-kdd-t3", "tian-kdd-t5"):
        assert re.search(rf"^{key}: .*rows, \d+ runs \(seeds: 3 per row \(--seeds 3\)\)", out, re.M), key
    assert "me-table2-me-trades-l27" in out and "8 rows, 24 runs (seeds: 3 per row (--seeds 3))" in out
    assert "cfa-t1: Wei et al. 2023 (CVPR), Table 1" in out  # CVPR 2023, as the README cites it (not NeurIPS)
    # every table's cost: GPU hours where the shipped figures (fastfair/gpu_figures.json) hold a GPU's training figure
    # (the H200 lease measured PGD-AT on ResNet-18), else which are missing
    measured = out.count("GPU hours of training on NVIDIA H200 (evaluation extra)")
    assert measured >= 1 and measured + out.count("no GPU figure yet") == len(tables.tables())
    assert "tian-iclr-t2-madry               Madry x 3 seeds [fgsmrs avg/worst/per class, pgd20 " \
           "avg/worst/per class," in out
    assert "tian-iclr-t2-standard            standard WRN-32-10 (transfer substitute) x 3 seeds [no numbers of " \
           "its own: the transfer substitute of the other rows" in out
    # ICLR Tables 2, 3 and 4: the RST row is the released model, evaluated
    assert out.count("RobustBench's Carmon2019Unlabeled, evaluated, not trained]") == 3
    assert "tian-kdd-t5-cifar100-madry       CIFAR-100, adversarial training x 3 seeds [pgd20 cv/mcd; follows " \
           "paper]" in out


def test_list_with_a_table_shows_that_table_alone_and_an_unknown_one_is_one_line(capsys):
    assert cli.main(["reproduce", "trix-rebuttal-t1", "--list"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^[a-z][\w-]*: ", out, re.M) == ["trix-rebuttal-t1: "] and out.startswith("scales (--scale):")
    # the rebuttal's nine rows, each runnable
    assert "9 rows, 45 runs (seeds: per row its paper's count: 5 (9 rows))" in out and "not run yet" not in out
    assert cli.main(["reproduce", "me-t99", "--list"]) == 2
    assert capsys.readouterr().err.count("fastfair: error:") == 1


def test_transfer_rows_run_after_and_attack_through_their_substitute(tmp_path):
    table = tables.get("tian-iclr-t2")
    assert table.ordered()[0].preset == "tian-iclr-t2-standard"
    npz = tmp_path / "tiny.npz"
    np.savez(npz, x_train=np.zeros((40, 3, 8, 8), np.uint8), y_train=np.arange(40) % 10,
             x_test=np.zeros((20, 3, 8, 8), np.uint8), y_test=np.arange(20) % 10)
    planned = {p.name: p for p in runs.plan(table, 2, "subset", str(npz), tmp_path / "out", {})}
    trades = planned["tian-iclr-t2-trades-s1"]
    assert trades.sets["eval.substitute"] == str(tmp_path / "out" / "runs" / "tian-iclr-t2-standard-s1")
    assert "eval.substitute" not in planned["tian-iclr-t2-standard-s1"].sets
    # the subset scale runs the costly attacks shorter, on fewer images, and says which ran for which
    assert trades.runs_for["cwinf/200"] == "cwinf20/5" and trades.runs_for["nattack/200"] == "nattack10/5"
    assert trades.runs_for["transfer:pgd20"] == "transfer:pgd20" and "cwinf/200" not in trades.attacks
    full = runs.SCALES.get("full").attack
    assert full("cwinf/200") == "cwinf/200" and runs.SCALES.get("subset").attack("transfer:cwinf/200") == \
        "transfer:cwinf20/5"


def test_a_per_class_table_end_to_end_with_its_transfer_substitute(tmp_path, monkeypatch):
    real_data()
    runs_inline(monkeypatch)
    out = tmp_path / "t2"
    assert reproduce("tian-iclr-t2", scale="subset", data_dir=str(CIFAR_SUBSET), out=str(out), gpus="cpu",
                     per_gpu=2, sets=TINY_SUBSET, echo=lambda line: None) == 0
    md = (out / "tian-iclr-t2.md").read_text()
    for attack in ("fgsmrs", "pgd20", "cwinf/200", "transfer:pgd20", "nattack/200", "tpgd20@t0.142857"):
        rows = [line for line in md.splitlines() if f"| `tian-iclr-t2-mart` | {attack} |" in line]
        assert len(rows) == 12 and all(line.rstrip(" |").endswith(NOT_COMPARABLE) for line in rows), attack
    assert "| MART (re-trained) | `tian-iclr-t2-mart` | nattack/200 | cat | 49.00 (1) |" in md
    # the authors' released TRADES and MART files are not placed: pending, with where to get them and put them
    assert md.count("- Pending: tian-iclr-t2-") == 2 and "released/MART/mart_wrn-34-10.pt" in md
    assert "transfer attacks made on tian-iclr-t2-standard (same seed)" in md
    assert "Not run at this scale: tian-iclr-t2-rst (RST): " in md  # RobustBench's weights: not here, or no package
    record = json.loads(next((out / "runs" / "tian-iclr-t2-mart-s0" / "eval").glob("*-test.json")).read_text())
    assert record["substitute"].startswith(str(out / "runs" / "tian-iclr-t2-standard-s0"))
    assert record["results"]["cwinf20/5"]["images"] == 50 and _png_ok(out / "tian-iclr-t2.png")


def test_full_scale_without_cifar10_stops_at_once_naming_data_dir(tmp_path, capsys):
    code = cli.main(["reproduce", "me-t3", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("fastfair: error:")
    assert "--data-dir" in err and "https://www.cs.toronto.edu/~kriz/cifar.html" in err
    assert not (tmp_path / "out" / "runs").exists()


def test_unknown_table_and_subset_without_npz_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="targets: .*cfa-t1"):  # nothing like it: every target named
        reproduce("xyz", out=str(tmp_path))
    with pytest.raises(UserError, match=r"'cfa-t9'. Did you mean cfa-t\d"):
        reproduce("cfa-t9", out=str(tmp_path))
    with pytest.raises(UserError, match="--data-dir FILE.npz"):
        reproduce("me-t3", scale="subset", data_dir=str(tmp_path), out=str(tmp_path))


def _png_ok(path) -> bool:
    data = path.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        return False
    length, kind = struct.unpack(">I4s", data[8:16])
    crc = struct.unpack(">I", data[16 + length:20 + length])[0]
    return kind == b"IHDR" and zlib.crc32(data[12:16 + length]) == crc


def test_subset_table_end_to_end_then_skips_done_runs(tmp_path, monkeypatch):
    runs_inline(monkeypatch)
    real_data()
    out, lines = tmp_path / "t5", []
    # one test image a class: its eleven attacks on each of four runs were most of its CPU time; it reads no accuracy
    args = dict(scale="subset", data_dir=str(CIFAR_SUBSET), out=str(out), gpus="cpu", per_gpu=3,
                sets=[*TINY_SUBSET, "data.test_per_class=1"], echo=lines.append)
    assert reproduce("tian-iclr-t5", **args) == 0
    md = (out / "tian-iclr-t5.md").read_text()
    assert md.startswith("# Reproduce: Tian et al. (ICLR 2021 submission), Table 5\n")
    assert "**These numbers are not comparable to the paper**" in md
    for section in ("## Numbers", "## Protocol and differences from the paper", "## Runs"):
        assert section in md
    assert "## rho" not in md  # no row of Table 5 names a baseline
    rows = [line for line in md.splitlines() if line.startswith("| ") and "`tian-iclr-t5-" in line
            and " | pgd20 |" in line]
    assert len(rows) == 4 * 12  # per row: pgd20 avg, worst and ten classes
    assert all(line.rstrip(" |").endswith(NOT_COMPARABLE) for line in rows)
    assert "| HE | `tian-iclr-t5-he` | pgd20 | cat | 34.30 (1) |" in md
    assert "![paper vs fastfair, every number](tian-iclr-t5.png)" in md and _png_ok(out / "tian-iclr-t5.png")
    assert md.count("| done | epoch.pt |") == 4  # Sec. 3's fixed epoch (75 of 100), scaled to the one epoch run
    assert md.count("fastfair: train.select = epoch, the model after epoch 75") == 4  # the preset's; scaled
    # the runs trained the subset: tiny-cnn, one epoch, the paper's attacks
    cfg = config.load_saved_text(RunDir(out / "runs" / "tian-iclr-t5-he-s0").read_config())
    assert (cfg.model.name, cfg.train.epochs, cfg.data.dataset) == ("tiny-cnn", 1, "npz")
    assert cfg.eval.attacks[:3] == ["clean", "pgd20", "tpgd20@t0.2"]
    assert len(cfg.eval.attacks) == 2 + 9  # and Table 6's nine 1/T
    ckpt = RunDir(out / "runs" / "tian-iclr-t5-he-s0").last
    before = ckpt.stat().st_mtime_ns
    lines.clear()
    figures_unrendered(monkeypatch)  # the rerun's figure is the first's, checked above
    assert reproduce("tian-iclr-t5", **args) == 0
    assert "4 runs" in lines[0] and "4 done" in lines[0] and not any(line.startswith("start ") for line in lines)
    assert ckpt.stat().st_mtime_ns == before
    # other settings for runs already started are refused before anything runs
    with pytest.raises(UserError, match=r"started with other settings: .*tian-iclr-t5-he-s0 \(model.width\)"):
        reproduce("tian-iclr-t5", **{**args, "sets": [s.replace("width=4", "width=8") for s in args["sets"]]})


def test_frl_rows_run_after_and_start_from_the_row_they_fine_tune(tmp_path):
    table = tables.get("cfa-t1")
    order = [row.preset for row in table.ordered()]
    assert order[-2:] == ["cfa-t1-frl", "cfa-t1-frl-ema"] and "cfa-t1-trades-paper" in order[:-2]
    npz = tmp_path / "tiny.npz"
    np.savez(npz, x_train=np.zeros((40, 3, 8, 8), np.uint8), y_train=np.arange(40) % 10,
             x_test=np.zeros((20, 3, 8, 8), np.uint8), y_test=np.arange(20) % 10)
    planned = {p.name: p for p in runs.plan(table, 2, "subset", str(npz), tmp_path / "out", {})}
    frl = planned["cfa-t1-frl-s1"]
    assert frl.sets["train.init_from"] == str(tmp_path / "out" / "runs" / "cfa-t1-trades-paper-s1" / "checkpoints"
                                              / "best_fair.pt")
    assert "train.init_from" not in planned["cfa-t1-trades-paper-s1"].sets
    # the subset shrinks every epoch count with train.epochs, and averaged rows compare the averaged model
    ema = planned["cfa-t1-at-ema-paper-s0"]
    assert ema.averaged and ema.sets["train.epochs"] == runs.SUBSET_EPOCHS
    assert ema.sets["train.lr_milestones"] == [round(m * runs.SUBSET_EPOCHS / 200) for m in (100, 150)]
    assert ema.sets["train.avg_begin"] == max(1, round(50 * runs.SUBSET_EPOCHS / 200))
    assert ema.attacks == ("clean", "aa")


def test_subset_scale_shrinks_dafas_warm_up_with_the_epochs(tmp_path):
    """At 5 of 110 (DAFA) or 150 (TRIX) epochs a 70-epoch warm-up would never end: it shrinks with them."""
    npz = tmp_path / "tiny.npz"
    np.savez(npz, x_train=np.zeros((40, 3, 8, 8), np.uint8), y_train=np.arange(40) % 10,
             x_test=np.zeros((20, 3, 8, 8), np.uint8), y_test=np.arange(20) % 10)
    for key, epochs in (("dafa-t1", 110), ("trix-rebuttal-t1", 150)):
        planned = {p.name: p for p in runs.plan(tables.get(key), 1, "subset", str(npz), tmp_path / key, {})}
        for name, run in planned.items():
            if config.resolve(run.row.preset).method.name in ("dafa-trades", "trix"):
                assert run.sets["method.warmup"] == round(70 * runs.SUBSET_EPOCHS / epochs) < runs.SUBSET_EPOCHS, name
            else:
                assert "method.warmup" not in run.sets, name
    two = runs.plan(tables.get("dafa-t1"), 1, "subset", str(npz), tmp_path / "two", {"train.epochs": 2})
    assert {r.sets.get("method.warmup") for r in two} == {None, 1}  # round(70 * 2 / 110) = 1 < 2
    with pytest.raises(UserError, match=r"method.warmup = 1 .* train for 2 epochs or more"):  # before any run starts
        reproduce("dafa-t1", scale="subset", data_dir=str(npz), out=str(tmp_path / "one"), sets=["train.epochs=1"])


def test_rho_from_the_paper_numbers_matches_what_dafa_prints():
    """DAFA Table 1(a) prints rho against TRADES; the same rho computed from its printed accuracies agrees."""
    table = tables.get("dafa-t1")
    printed = {("TRADES + DAFA", "clean"): 0.03, ("TRADES + DAFA", "aa"): 0.42,
               ("TRADES + WAT", "clean"): 0.06, ("TRADES + WAT", "aa"): 0.27}
    rhos = verdict.rho_rows(list(table.rows), [])
    assert {(r.row, r.attack): round(r.paper, 2) for r in rhos} == printed
    assert all(r.baseline == "TRADES" and r.ours is None for r in rhos)  # no runs yet: no rho of ours


def test_rho_of_ours_comes_from_our_seed_means(tmp_path):
    table = tables.get("trix-rebuttal-t1")
    ours = {"trix-rebuttal-t1-trades": (50.0, 20.0), "trix-rebuttal-t1-trades-trix": (49.0, 30.0)}
    comparisons = [verdict.Comparison(p, "", "aa", stat, 0.0, [v - 1, v + 1], 1.0, "default", True)
                   for p, (avg, worst) in ours.items() for stat, v in (("avg", avg), ("worst", worst))]
    got = {r.preset: r for r in verdict.rho_rows(list(table.rows), comparisons) if r.attack == "aa"}
    assert got["trix-rebuttal-t1-trades-trix"].ours == pytest.approx((30 - 20) / 20 + (49 - 50) / 50)
    assert got["trix-rebuttal-t1-trades-dafa"].ours is None  # that row has no results
    assert got["trix-rebuttal-t1-trades-trix"].paper == pytest.approx((32.64 - 23.80) / 23.80 + (48.80 - 49.22) / 49.22)
    md = write.rho_table(table, comparisons)
    assert "| + TRIX | `trix-rebuttal-t1-trades-trix` | aa | TRADES | +0.363 | +0.480 |" in md
    zero = [dataclasses.replace(c, ours=[0.0]) if c.preset.endswith("-trades") and c.stat == "worst" else c
            for c in comparisons]  # a tiny run can leave the baseline's worst class at 0: rho has no value then
    assert "| +0.363 | undefined (the baseline's worst class is 0) |" in write.rho_table(table, zero)


@pytest.mark.parametrize("field, preset", [("baseline", "dafa-t1-trades-wat"), ("substitute", "tian-kdd-t1-he")])
def test_a_row_named_from_outside_its_table_is_refused(monkeypatch, field, preset):
    real = paper.load

    def load(name):
        row = real(name)
        return dataclasses.replace(row, **{field: "cfa-t1-at"}) if name == preset else row

    monkeypatch.setattr(tables, "load", load)
    with pytest.raises(UserError, match=rf"{preset}: \[paper\] {field} = 'cfa-t1-at' is not a row"):
        tables.tables()


def test_a_reprinted_row_keeps_its_baseline_in_its_own_table(monkeypatch):
    real = paper.load

    def load(name):  # CFA's TRADES + CFA row measured against TRADES in Table 1 only, also printed in Table 2
        row = real(name)
        if name == "cfa-t1-trades-cfa-code":
            return dataclasses.replace(row, baseline="cfa-t1-trades-code", also_in=("2",))
        return row

    monkeypatch.setattr(tables, "load", load)
    known = tables.tables()
    assert "cfa-t1-trades-cfa-code" in {r.preset for r in known["cfa-t2"].rows}
    assert [r.preset for r in verdict.rho_rows(list(known["cfa-t1"].rows), [])] == ["cfa-t1-trades-cfa-code"] * 2


def test_reproduce_md_has_rho_for_rows_naming_a_baseline(tmp_path):
    table = tables.get("dafa-t1")
    comparisons = [c for row in table.ordered() for c in compare_row(row, [], False, CIFAR10)]
    md = write.write(tmp_path, table, comparisons, scale="subset", scale_doc="a look", seeds="1 per row", runs=[],
                     user_sets=[], notes=[]).read_text()
    section = md[md.index("## rho against the baseline row"):md.index("## Protocol")]
    assert "| TRADES + DAFA | `dafa-t1-trades-dafa` | aa | TRADES | +0.418 | - |" in section  # DAFA prints 0.42
    assert section.count("| TRADES |") == 4  # DAFA and WAT, clean and AA; none for the baseline itself


def test_runs_that_did_not_finish_say_why_in_the_summary(tmp_path):
    """reproduce's closing lines name each unfinished run with its child's error line (as grid does), not only
    its log."""
    from fastfair.reproduce.command import _collect
    from fastfair.rundir import write_json_atomic
    from fastfair.scaleout.jobs import Job

    npz = tmp_path / "tiny.npz"
    np.savez(npz, x_train=np.zeros((40, 3, 8, 8), np.uint8), y_train=np.arange(40) % 10,
             x_test=np.zeros((20, 3, 8, 8), np.uint8), y_test=np.arange(20) % 10)
    planned = runs.plan(tables.get("tian-iclr-t5"), 1, "subset", str(npz), tmp_path / "out", {})[:2]
    jobs = [Job(p.name, str(p.run_dir(tmp_path / "out")), p.row.preset, ()) for p in planned]
    states = [{"status": "failed", "returncode": 2, "error": "fastfair: error: data.val_per_class=50 takes every "
                                                            "training image of class 3"},
              {"status": "running", "pid": 1}]
    for job, state in zip(jobs, states):
        Path(job.run_dir).mkdir(parents=True)
        write_json_atomic(state, RunDir(job.run_dir).grid_state)
    records, _, _, failed = _collect(planned, jobs)
    assert not records and len(failed) == 2
    assert failed[0].startswith(f"{jobs[0].name}: fastfair: error: data.val_per_class=50") and "train.log" in failed[0]
    assert "its process ended before it could record why" in failed[1]


@pytest.mark.parametrize("name, shape, names", [
    ("cifar10-part.npz", (32, 32, 3), CIFAR10),  # a CIFAR-10 file: CIFAR-10's class names
    ("my-digits.npz", (8, 8), [f"class {i}" for i in range(10)]),  # any other 10-class file is not called CIFAR-10
])
def test_the_subset_names_classes_as_the_npz_data_set_does(tmp_path, name, shape, names):
    npz = tmp_path / name
    np.savez(npz, x_train=np.zeros((60, *shape), np.uint8), y_train=np.arange(60) % 10,
             x_test=np.zeros((20, *shape), np.uint8), y_test=np.arange(20) % 10)
    sets = runs._subset_data(str(npz), tmp_path / "out", "cifar10")
    with np.load(sets["data.data_dir"]) as f:
        assert f["class_names"].tolist() == names


def test_class_wise_spread_numbers_their_verdicts_and_bad_values(tmp_path, monkeypatch):
    """Tian et al. KDD Table 5 gives CV and MCD alone: ours come from the per-class accuracies, CV within 25 % of
    the paper's, MCD within 5 points."""
    row = paper.load("tian-kdd-t5-cifar10-madry")
    assert row.table == "5" and row.numbers["pgd20"] == Number(cv=284.43, mcd=52.8)
    per_class = [80.0, 85.0, 40.0, 33.0, 45.0, 50.0, 70.0, 72.0, 80.0, 82.0]  # CV 302.8, MCD 52
    records = [{"results": {"pgd20": {"per_class": [a + d * (k == 3) for k, a in enumerate(per_class)],
                                      "summary": {"avg": 63.7, "worst": 33.0 + d}}}} for d in (-0.1, 0.0, 0.1)]
    got = {c.stat: c for c in compare_row(row, records, True, CIFAR10)}
    assert set(got) == {"cv", "mcd"} and got["cv"].ours[1] == pytest.approx(np.var(per_class))
    assert got["cv"].margin == pytest.approx(0.25 * 284.43) and got["cv"].verdict == "agrees"
    assert got["mcd"].mean == pytest.approx(52.0) and got["mcd"].margin == DEFAULT_TOLERANCE["mcd"] == 5.0
    tiny = compare_row(paper.load("tian-kdd-t5-mnist-standard"), [{"results": {"clean": {
        "per_class": [99.0] * 9 + [90.0 + d], "summary": {}}}} for d in (-0.1, 0.0, 0.1)], True, CIFAR10)  # CV 7.29,
    assert [(c.stat, c.margin, c.verdict) for c in tiny] == [("cv", 1.0, "higher"), ("mcd", 5.0, "higher")]  # MCD 9
    for bad in ("cv = -1.0", "cv = 3000.0", "mcd = 120.0"):
        monkeypatch.setattr(config, "read_paper", lambda name, b=bad: {
            "source": "tian-kdd", "table": "5", "row": "r", "follows": "paper", "selection": "s",
            "pgd20": {k.strip(): float(v) for k, v in [b.split("=")]}})
        with pytest.raises(UserError, match=bad.split(" ")[0]):
            paper.load("x")


def test_a_table_over_several_data_sets_runs_the_rows_whose_subset_is_there(tmp_path, monkeypatch):
    """KDD Table 5 trains on six data sets: at subset scale --data-dir is a folder of <dataset>-subset.npz files;
    the MNIST and CIFAR-10 rows run on theirs, the others are named as not run, and one file is refused."""
    runs_inline(monkeypatch)
    real_data()
    with pytest.raises(UserError, match="FOLDER holding cifar10-subset.npz, cifar100-subset.npz"):
        reproduce("tian-kdd-t5", scale="subset", data_dir=str(CIFAR_SUBSET), out=str(tmp_path / "one"))
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("cifar10-subset.npz", "mnist-subset.npz"):
        (folder / name).symlink_to(CIFAR_SUBSET.parent / name)
    out = tmp_path / "t5"
    lines = []
    assert reproduce("tian-kdd-t5", scale="subset", data_dir=str(folder), out=str(out), gpus="cpu", per_gpu=2,
                     sets=[*TINY_SUBSET, "data.test_per_class=1"], echo=lines.append) == 0  # one test image a class
    assert sum("not run at this scale" in line for line in lines) == 8
    md = (out / "tian-kdd-t5.md").read_text()
    for preset, attack in [("cifar10-madry", "pgd20"), ("cifar10-standard", "clean"), ("mnist-madry", "pgd40"),
                           ("mnist-standard", "clean")]:
        rows = [line for line in md.splitlines() if f"| `tian-kdd-t5-{preset}` | {attack} |" in line]
        assert [line.split(" | ")[3] for line in rows] == ["cv", "mcd"], preset
        assert all(line.rstrip(" |").endswith(NOT_COMPARABLE) for line in rows)
    assert "Not run at this scale: tian-kdd-t5-stl10-madry (STL-10, adversarial training): no stl10-subset.npz" in md
    mnist = json.loads(next((out / "runs" / "tian-kdd-t5-mnist-madry-s0" / "eval").glob("*-test.json")).read_text())
    assert mnist["classes"] == [str(d) for d in range(10)] and _png_ok(out / "tian-kdd-t5.png")
