"""What train and eval end with, as a user types them (issue 28, items 4 and 5): the run, its headline
numbers and the next commands (the same lines in train.log); tables rendered, not Markdown; eval --per-class;
a reused AutoAttack result said as such; eps as 8/255; the worst class named once."""
import contextlib
import io
import json
import re
import shutil

import pytest
from evalreport_helpers import cheap_aa_backend

from fastfair import cli, display
from fastfair.attacks import autoattack
from fastfair.rundir import RunDir

# the demo preset cut to seconds; eval.eps rounded to five places as configs often hold 8/255
TRAIN = ["train", "--config", "demo", "--epochs", "1", "--quick", "5", "--quick-test", "4", "--set", "model.width=4",
         "--set", "attack.steps=1", "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean', 'pgd2']",
         "--set", "eval.eps=0.03137", "--set", "eval.alpha=0.00784", "--set", "data.batch_size=25"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run folder, what train printed)."""
    out = tmp_path_factory.mktemp("summary") / "run"
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        assert cli.main([*TRAIN, "--out", str(out)]) == 0
    return out, said.getvalue()


def _summary(printed: str) -> list[str]:
    """The closing lines: from the last 'run: ' line to the end."""
    lines = printed.rstrip("\n").splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("run: "))
    return lines[start:]


def _copy(trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained[0], run)
    return run


def test_train_ends_with_the_run_its_numbers_and_the_next_commands(trained):
    out, printed = trained
    rec = json.loads((out / "eval" / "best_pgd-test.json").read_text())
    clean, pgd = (rec["results"][n]["summary"] for n in ("clean", "pgd2"))
    ci = {n: {k: "[{:.1f}, {:.1f}]".format(*v) for k, v in rec["results"][n]["summary_interval"].items()}
          for n in ("clean", "pgd2")}  # each number with its 95 % interval
    worst = f"worst class {pgd['worst_class']}: {pgd['worst']:.1f} % {ci['pgd2']['worst']}"  # classes named 0..9
    # AutoAttack's cost at the pace this machine just measured (fastfair/reports/summary.py) is the machine's
    summary = [re.sub(r": (about [\d.]+ (min|h)|under a minute) here$", ": T here", line) for line in _summary(printed)]
    assert summary == [
        f"run: {out} (best_pgd, epoch 1; test, 40 images (the first 4 of each class, in file order); eps 8/255, "
        "seed 0)",
        f"  clean {clean['avg']:.1f} % {ci['clean']['avg']}, pgd2 {pgd['avg']:.1f} % {ci['pgd2']['avg']} (mean of "
        f"per-class accuracies); under pgd2 {worst}",
        f"  written: {out / 'eval' / 'best_pgd-test.json'}",
        "next:",
        f"  fastfair report {out}                           # per-class figures and tables (Markdown, LaTeX)",
        f"  fastfair eval {out} --attacks aa --per-class 4  # AutoAttack on the same 4 images a class: T here",
        f"  fastfair report {out} OTHER_RUN                 # compare with another run"]
    # train.log ends with the same lines, without terminal styling
    assert RunDir(out).train_log.read_text().splitlines()[-len(_summary(printed)):] == _summary(printed)
    # the per-class table is rendered for the terminal, not printed as Markdown
    assert "eps 8/255, seed 0" in printed and "**" not in printed and "|---" not in printed
    assert re.search(r"^worst class +│", printed, re.M)


def test_eval_says_an_inherited_quick_test_and_per_class_overrides_it(trained, tmp_path, capsys):
    run = _copy(trained, tmp_path)
    main_file = run / "eval" / "best_pgd-test.json"
    assert cli.main(["eval", str(run), "--attacks", "clean,pgd2"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("testing on the first 4 images of each class, as the run did (its --quick-test, "
                              "data.test_per_class); --per-class N sets another number\n")
    assert _summary(printed)[0].startswith(f"run: {run} (best_pgd, epoch 1; test, 40 images (the first 4 of each")
    assert "**" not in printed
    full = main_file.read_bytes()

    assert cli.main(["eval", str(run), "--attacks", "clean,pgd2", "--per-class", "2"]) == 0
    printed = capsys.readouterr().out
    assert "as the run did" not in printed and "tested on the first 2/class of digits" in printed
    capped_file = run / "eval" / "best_pgd-test-first2.json"
    end = _summary(printed)
    assert end[0] == (f"run: {run} (best_pgd, epoch 1; test, 20 images (the first 2 of each class, in file order); "
                      "eps 8/255, seed 0)") and end[2] == f"  written: {capped_file}"
    capped = json.loads(capped_file.read_text())
    assert capped["images"] == 2 * 10 and capped["test_per_class"] == 2
    assert all(sum(map(sum, r["confusion"])) == 20 for r in capped["results"].values())  # every attack: 2 x classes
    first = json.loads(full)
    assert capped["fingerprint"]["data"] != first["fingerprint"]["data"]
    assert capped["fingerprint"]["settings"] != first["fingerprint"]["settings"]
    assert main_file.read_bytes() == full  # the run's own result is neither replaced nor merged


def test_a_second_autoattack_says_it_reused_the_finished_result(trained, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (cheap_aa_backend, "test stand-in"))
    run = _copy(trained, tmp_path)
    argv = ["eval", str(run), "--attacks", "aa", "--aa-backend", "cheap", "--per-class", "2"]
    state = run / "eval" / "best_pgd-test-first2.aa.npz"
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    assert "AutoAttack apgd-ce (1/4) done in" in first and "reused" not in first
    assert cli.main(argv) == 0
    second = capsys.readouterr().out
    assert f"AutoAttack: reused {state} (same model, data, attack, seed; 4 of 4 sub-attacks finished)" in second
    assert "done in" not in second and "AutoAttack square (4/4) reused: robust accuracy" in second
    assert "class class" not in first + second and re.search(r"worst class \d: \d+\.\d %", second)
    assert "--attacks aa" not in "\n".join(_summary(second))  # AutoAttack is in the result: not suggested again


@pytest.mark.parametrize("value, want", [(8 / 255, "8/255"), (0.03137, "8/255"), (0.03125, "8/256"),
                                         (2 / 255, "2/255"), (0.00784, "2/255"), (0.1, "0.1"), (0.0314, "0.0314"),
                                         (8 / 255 + 2 * display.EPS_TOLERANCE, "0.0313825"), ([8 / 255, 0.1],
                                                                                             "[8/255, 0.1]")])
def test_eps_is_shown_as_the_fraction_papers_write(value, want):
    assert display.eps_text(value) == want


def test_the_worst_class_is_named_once():
    assert display.worst_class_text("cat", 21.26) == "worst class: cat 21.3 %"
    assert display.worst_class_text("class 0", 21.26) == "worst class 0: 21.3 %"  # a .npz without class names
    assert display.worst_class_text("3", 0.0) == "worst class 3: 0.0 %"


@pytest.mark.parametrize("extra, says", [
    (["--per-class", "0"], "--per-class takes the number of test images per class, 1 or more; got 0"),
    (["--per-class", "-2"], "--per-class takes the number of test images per class, 1 or more; got -2"),
    (["--per-class", "3", "--split", "val"], "--per-class caps the test split; --split val evaluates"),
    # a cap above every class's count keeps every image: it would do nothing, yet the result would say "capped"
    (["--per-class", "100000"], "data.test_per_class=100000 (--quick-test/--per-class 100000) keeps every image"),
])
def test_a_bad_per_class_is_one_error_line_and_writes_nothing(trained, tmp_path, capsys, extra, says):
    run = _copy(trained, tmp_path)
    before = sorted(p.name for p in (run / "eval").iterdir())
    assert cli.main(["eval", str(run), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fastfair: error: {says}"), err
    assert sorted(p.name for p in (run / "eval").iterdir()) == before


def test_the_report_shows_eps_as_the_same_fraction(trained, tmp_path):
    run = _copy(trained, tmp_path)
    assert cli.main(["report", str(run)]) == 0
    assert "(epoch 1), eps 8/255, one seed" in (run / "report" / "report.md").read_text()
