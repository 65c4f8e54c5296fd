"""Every number with its interval (issue 56, part 2), as a user types the commands: eval's per-image bits and
intervals, a record of an older fastfair, AutoAttack's first look in the report, and report A B paired."""
import shutil

import numpy as np
import pytest
from evalreport_helpers import cheap_aa_backend, digits_run
from shared_runs import figures_unrendered

from fastfair import cli
from fastfair.attacks import autoattack
from fastfair.errors import UserError
from fastfair.evaluation import intervals, per_image
from fastfair.evaluation.result import Result
from fastfair.rundir import read_json, read_toml, write_json_atomic, write_toml


@pytest.fixture(autouse=True)
def unrendered(monkeypatch):
    figures_unrendered(monkeypatch)  # these tests read what the report says; test_report renders figures


def _copy(tmp_path, name="run"):
    run = tmp_path / name
    shutil.copytree(digits_run()[0], run)
    return run


def _other_model(tmp_path, name="other"):
    """A copy of the digits run whose selected checkpoint holds its last epoch's weights, under another learning
    rate in its config (so the report does not fold it with the first as a seed)."""
    run = _copy(tmp_path, name)
    shutil.rmtree(run / "eval")
    shutil.copy(run / "checkpoints" / "last.pt", run / "checkpoints" / "best_pgd.pt")
    write_toml(read_toml(run / "config.toml").replace("lr = 0.05", "lr = 0.051", 1), run / "config.toml")
    return run


def test_eval_records_a_bit_per_image_and_every_numbers_interval(tmp_path, capsys):
    run = _copy(tmp_path)
    assert cli.main(["eval", str(run), "--attacks", "clean,fgsm", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    path = run / "eval" / "best_pgd-test.json"
    record = read_json(path)  # its checksum checked
    entry = record["results"]["fgsm"]
    correct, labels = per_image.unpack(entry)
    conf = np.asarray(entry["confusion"])
    assert len(correct) == record["images"] == conf.sum() and len(entry[per_image.FIELD]) < record["images"] / 4
    assert np.array_equal(np.bincount(labels, weights=correct, minlength=10), np.diag(conf))
    for c in range(10):  # Wilson's interval of each class's counts
        assert entry["per_class_interval"][c] == pytest.approx(intervals.class_interval(conf[c, c], conf[c].sum()),
                                                               abs=1e-4)
    boot = intervals.bootstrap_measures(correct, labels, 10)
    for key in ("avg", "worst", "cv", "mcd", "overall"):
        assert entry["summary_interval"][key] == pytest.approx(boot[key][1:], abs=1e-4)
        lo, hi = entry["summary_interval"][key]
        assert lo <= entry["summary"][key] <= hi
    assert record["intervals"]["level"] == 0.95
    # the terminal table: each cell its interval, and a line saying what they are; the headline quotes them
    avg = "[{:.1f}, {:.1f}]".format(*entry["summary_interval"]["avg"])
    row = next(line for line in printed.splitlines() if line.startswith("mean of per-class accuracies"))
    assert row.endswith(f"{entry['summary']['avg']:.2f} {avg}"), row
    assert per_image.INTERVAL_NOTE in printed
    assert f"fgsm {entry['summary']['avg']:.1f} % {avg}" in printed
    assert Result.load(path).interval("fgsm", "worst") == tuple(entry["summary_interval"]["worst"])


def test_per_image_bits_that_disagree_with_the_counts_are_refused():
    entry = {"confusion": [[2, 1], [0, 3]], "per_class": [200 / 3, 100.0]}
    entry[per_image.FIELD] = per_image.pack(np.array([1, 1, 0, 1, 1, 1], bool), np.array([0, 0, 0, 1, 1, 1]))
    assert per_image.unpack(entry)[0].tolist() == [True, True, False, True, True, True]
    entry[per_image.FIELD] = per_image.pack(np.array([1, 0, 0, 1, 1, 1], bool), np.array([0, 0, 0, 1, 1, 1]))
    with pytest.raises(UserError, match="disagree with its confusion matrix"):
        per_image.unpack(entry)


def test_a_record_of_an_older_fastfair_gets_what_its_counts_allow_and_says_the_rest(tmp_path, capsys):
    run = _copy(tmp_path)
    path = run / "eval" / "best_pgd-test.json"
    record = read_json(path)
    record.pop("intervals", None)
    record.pop("content_sha256", None)
    for entry in record["results"].values():
        for key in (per_image.FIELD, "per_class_interval", "summary_interval"):
            entry.pop(key, None)
    write_json_atomic(record, path)
    result = Result.load(path)
    conf = result.confusion("clean")
    assert result.interval("clean", "worst") is None and result.interval("clean", "cv") is None
    assert result.interval("clean", "overall") == pytest.approx(intervals.class_interval(np.trace(conf), conf.sum()))
    assert "evaluated by a fastfair without per-image results" in str(result)
    assert cli.main(["report", str(run), "--attack", "clean"]) == 0
    md = (run / "report" / "report.md").read_text()
    assert "clean: evaluated by a fastfair without per-image results, so the worst class, CV and MCD have no " \
           "interval" in md and "evaluate again for all of them" in md


def test_report_shows_autoattacks_first_look_as_a_subset(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (cheap_aa_backend, "test stand-in"))
    run = _copy(tmp_path)
    assert cli.main(["eval", str(run), "--attacks", "aa", "--aa-backend", "cheap", "--per-class", "4",
                     "--device", "cpu", "--quiet"]) == 0
    assert cli.main(["eval", str(run), "--checkpoint", "last", "--attacks", "clean", "--device", "cpu",
                     "--quiet"]) == 0
    assert cli.main(["report", str(run)]) == 0  # the run's own robust attack; AutoAttack's look shown beside it
    md = (run / "report" / "report.md").read_text()
    assert "run also holds `last-test` (clean), not in these tables" in md  # another checkpoint: named
    assert "evaluations: `best_pgd-test`, `best_pgd-test-first4`" in md
    header = next(line for line in md.splitlines() if line.startswith("| class |"))
    assert header.endswith("| aa (subset) |")
    assert "aa (subset): on the first 4 test images of each class (40) only (a subset evaluation" in md
    assert cli.main(["report", str(run), "--attack", "aa", "--out", str(tmp_path / "aa")]) == 0
    md = (tmp_path / "aa" / "report.md").read_text()
    assert "robust columns: **aa**" in md and "aa on the first 4 test images of each class (40), a subset" in md


def test_report_a_b_pairs_runs_on_the_same_images(tmp_path, capsys):
    a, b = _copy(tmp_path, "a"), _other_model(tmp_path, "b")
    assert cli.main(["eval", str(b), "--attacks", "clean", "--device", "cpu", "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["report", str(a), str(b), "--attack", "clean", "--out", str(tmp_path / "r")]) == 0
    said = capsys.readouterr().out.splitlines()[1:]  # under where the report is
    md = (tmp_path / "r" / "report.md").read_text()
    assert "### a − b" in md and "p (McNemar, exact)" in md and "not paired" not in md
    ra, rb = (Result.load(r / "eval" / "best_pgd-test.json") for r in (a, b))
    diff = intervals.paired_difference(*(per_image.unpack(r.record["results"]["clean"])[0] for r in (ra, rb)),
                                       per_image.unpack(ra.record["results"]["clean"])[1], 10)
    point, lo, hi = diff["worst"]
    assert f"| clean | {diff['avg'][0]:+.2f} [{diff['avg'][1]:+.1f}, {diff['avg'][2]:+.1f}] | {point:+.2f}" in md
    # "beats" only where the interval excludes 0; said on the terminal too
    verdict = [line for line in said if "worst class" in line]
    assert len(verdict) == 1 and verdict[0] in md
    assert ("beats" in verdict[0]) == (lo > 0 or hi < 0)


def test_report_refuses_to_pair_runs_scored_on_other_images(tmp_path, capsys):
    a, b = _copy(tmp_path, "a"), _other_model(tmp_path, "b")
    assert cli.main(["eval", str(b), "--attacks", "clean", "--per-class", "3", "--device", "cpu", "--quiet"]) == 0
    capsys.readouterr()
    assert cli.main(["report", str(a), str(b), "--attack", "clean", "--out", str(tmp_path / "r")]) == 0
    said = capsys.readouterr().out.splitlines()[1:]
    assert said == ["a − b: not paired under clean: the two evaluations scored different test images (their data "
                    "fingerprints or image counts differ); evaluate both on the same split and images for a paired "
                    "comparison."]
    assert "beats" not in (tmp_path / "r" / "report.md").read_text()


def _run_with_bits(path, seed: int, method: str, correct: np.ndarray, labels: np.ndarray):
    """A run folder whose one evaluation (clean and pgd20 alike) holds per-image results on a shared test set."""
    from fastfair.config import Config
    from fastfair.evaluation import measures

    cfg = Config()
    cfg.method.name, cfg.train.seed = method, seed
    (path / "eval").mkdir(parents=True)
    (path / "config.toml").write_text(cfg.to_toml())
    conf = np.zeros((2, 2), dtype=int)
    np.add.at(conf, (labels, np.where(correct, labels, 1 - labels)), 1)
    entry = {"per_class": measures.json_values(measures.per_class_accuracy(conf)),
             "summary": measures.summary_of_confusion(conf), "confusion": conf.tolist(),
             per_image.FIELD: per_image.pack(correct, labels)}
    write_json_atomic({"checkpoint": str(path / "checkpoints" / "best_pgd.pt"), "epoch": 1, "split": "test",
                       "classes": ["a", "b"], "images": len(labels), "fingerprint": {"data": "d" * 64},
                       "results": {"clean": entry, "pgd20": entry}}, path / "eval" / "best_pgd-test.json")
    (path / "metrics.jsonl").write_text("")
    return path


def test_groups_of_the_same_seeds_pair_seed_by_seed(tmp_path, capsys):
    labels = np.repeat([0, 1], 100)
    rng = np.random.default_rng(0)
    runs, worst = [], {}
    for method, share in (("pgd-at", 0.5), ("trades", 0.8)):
        for seed in (0, 1, 2):
            correct = rng.random(200) < np.where(labels == 0, 0.9, share)
            runs.append(_run_with_bits(tmp_path / f"{method}-s{seed}", seed, method, correct, labels))
            worst.setdefault(method, []).append(100 * min(correct[labels == c].mean() for c in (0, 1)))
    assert cli.main(["report", *map(str, runs), "--attack", "pgd20", "--out", str(tmp_path / "r")]) == 0
    said = capsys.readouterr().out.splitlines()[1:]
    mean, _, lo, hi = intervals.seed_interval(np.subtract(worst["pgd-at"], worst["trades"]))
    assert said[-1] == (f"trades's worst class beats pgd-at's under pgd20: pgd-at − trades = {mean:+.2f} "
                        f"[{lo:+.1f}, {hi:+.1f}] points, its 95 % interval excludes 0.")
    md = (tmp_path / "r" / "report.md").read_text()
    assert "Student's t over the 3 seeds' differences" in md and "p (McNemar, exact)" not in md
