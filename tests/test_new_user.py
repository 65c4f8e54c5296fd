"""What a new user met (issue 52): eval's radius from the command line, a quoted --set list, a method given as a
preset, a target's prefix, the run's ETA and the evaluation bar, and ``reproduce --list``."""
from __future__ import annotations

import io
import json
import re
import shlex
import subprocess
import types

import pytest
import torch

import fastfair
from fastfair import cli, config
from fastfair.attacks.names import parse_attack
from fastfair.errors import UserError
from fastfair.evaluation import per_class
from fastfair.progress import Progress, RunRemaining, Ticks
from fastfair.reproduce import cost, tables
from helpers import demo_train


def _said(capsys, argv) -> tuple[int, str]:
    """(exit code, stderr) of the CLI run in-process."""
    code = cli.main(argv)
    return code, capsys.readouterr().err


# 2. a list of strings as typed in bash: the --set help's example, which the run below is given
QUOTED_LIST = """--set eval.attacks='["clean","pgd20"]'"""


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A one-epoch demo run on a few images per class (seconds), typed in bash with :data:`QUOTED_LIST`."""
    out = tmp_path_factory.mktemp("run") / "demo"
    argv = " ".join(shlex.quote(a) for a in demo_train(out, "--quick", "10", "--quick-test", "3", "--set",
                                                          "data.batch_size=50"))
    # the words bash makes of the line are the arguments fastfair gets: bash splits it, fastfair runs in this process
    typed = subprocess.run(["bash", "-c", f"printf '%s\\0' {argv} {QUOTED_LIST}"], capture_output=True, text=True,
                           timeout=60, check=True)
    assert cli.main(typed.stdout.split("\0")[:-1]) == 0
    return out


# ---- 2. a list of strings given with --set -------------------------------------------------------------------

@pytest.mark.parametrize("command", ["train", "grid", "tune", "reproduce"])
def test_the_set_help_shows_a_quoted_list(command, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # the help on one line per option
    assert cli.main([command, "--help"]) == 0
    assert QUOTED_LIST.partition(" ")[2] in capsys.readouterr().out


def test_a_quoted_list_typed_in_bash_is_the_list(demo_run):
    assert config.load_run(demo_run).eval.attacks == ["clean", "pgd20"]
    (record,) = [json.loads(p.read_text()) for p in (demo_run / "eval").glob("*-test.json")]
    assert list(record["results"]) == ["clean", "pgd20"]


@pytest.mark.parametrize("typed", ["eval.attacks=[clean,pgd20]", "eval.attacks=clean,pgd20"])
def test_a_list_the_shell_unquoted_says_how_to_quote_it(typed, capsys):
    code, err = _said(capsys, ["train", "--config", "demo", "--set", typed])
    got = typed.partition("=")[2]
    assert (code, err) == (2, f"fastfair: error: eval.attacks takes a list; got {got!r}. Strings in a list keep their "
                              f"double quotes inside single quotes: {QUOTED_LIST}\n")


# ---- 1. fastfair eval --eps, and fastfair.evaluate(eps=) checked the same way ----------------------------------

def test_eval_eps_sets_the_radius_and_the_json_records_it(demo_run, capsys):
    assert cli.main(["eval", str(demo_run), "--attacks", "clean,fgsm", "--eps", "0.05", "--quiet"]) == 0
    (record,) = [json.loads(p.read_text()) for p in (demo_run / "eval").glob("*-test.json")]
    assert record["eps"] == 0.05
    per_class = ",".join(["0.01"] * 5 + ["0.02"] * 5)  # the demo's ten digits
    assert cli.main(["eval", str(demo_run), "--attacks", "fgsm", "--eps", per_class, "--quiet"]) == 0
    (record,) = [json.loads(p.read_text()) for p in (demo_run / "eval").glob("*-test.json")]
    assert record["eps"] == [0.01] * 5 + [0.02] * 5


@pytest.mark.parametrize("attacks, eps, says", [
    ("fgsm", "8", "--eps: eval.eps=8.0 is out of range: it must be within [0, 1] (images are in [0, 1]: 8/255 is "
                  "0.0314)"),
    ("fgsm", "8/255", "--eps takes a number in [0, 1] (8/255 is 0.0314)"),
    ("fgsm", "0.03,0.03", "--eps: 2 radii for a model of 10 classes"),
    ("clean", "0.03", "--eps does nothing for clean"),
    ("aa", "0.03,0.02", "--eps: AutoAttack takes one radius for every class"),
])
def test_a_wrong_eval_eps_is_one_error_line(demo_run, attacks, eps, says, capsys):
    code, err = _said(capsys, ["eval", str(demo_run), "--attacks", attacks, "--eps", eps, "--quiet"])
    assert code == 2
    assert err.startswith(f"fastfair: error: {says}") and err.count("\n") == 1, err


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 4 * 4, 4))


def _data():
    g = torch.Generator().manual_seed(0)
    return torch.rand(8, 3, 4, 4, generator=g), torch.arange(8) % 4


def test_evaluate_takes_one_eps_per_class_and_records_it():
    result = fastfair.evaluate(_model(), _data(), attacks="clean,fgsm", eps=[0.01, 0.02, 0.03, 0.04], progress=False)
    assert result.record["eps"] == [0.01, 0.02, 0.03, 0.04]
    assert fastfair.evaluate(_model(), _data(), attacks="clean", progress=False).record["eps"] == 8 / 255


@pytest.mark.parametrize("attacks, eps, says", [
    ("fgsm", 8, "^eval.eps=8.0 is out of range"),
    ("fgsm", [0.01, 0.02], "eps: 2 radii for a model of 4 classes"),
    ("clean", 0.03, "eps does nothing for clean"),
])
def test_evaluate_refuses_the_eps_eval_refuses(attacks, eps, says):
    with pytest.raises(UserError, match=says.replace("[", r"\[")):
        fastfair.evaluate(_model(), _data(), attacks=attacks, eps=eps, progress=False)


# ---- 3. a method's name where a preset goes --------------------------------------------------------------------

def test_a_method_given_as_a_preset_suggests_the_method_keyword():
    with pytest.raises(UserError, match=r"'me-trades' is a training method, not a preset or config file: did you "
                                        r'mean method="me-trades"\?'):
        fastfair.train("me-trades")


def test_a_method_given_to_config_suggests_the_method_flag(capsys):
    code, err = _said(capsys, ["train", "--config", "me-trades"])
    assert code == 2 and "did you mean --method me-trades?" in err and err.count("\n") == 1


# ---- 4. a target named by its presets' prefix ------------------------------------------------------------------

def test_a_prefix_of_presets_suggests_their_target_and_names_them(capsys):
    code, err = _said(capsys, ["reproduce", "me-table2"])
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("fastfair: error: no paper table or figure 'me-table2'. Did you mean me-t2? The 8 presets "
                          "named me-table2* (me-table2-me-trades-l15, me-table2-me-trades-l18, me-table2-me-trades-l24 "
                          "and 5 more) are rows of me-t2 (8 of its 8 rows), ")


def test_a_preset_named_as_a_target_says_its_target_and_how_to_train_it(capsys):
    code, err = _said(capsys, ["reproduce", "me-table2-trades-l9", "--list"])
    assert code == 2
    assert ("is a row of me-t2 (1 of its 8 rows); train it alone with: fastfair train --config "
            "me-table2-trades-l9") in err


# ---- 6. reproduce --list: numbers first, pending targets a short line each, counts in the singular -------------

def test_list_opens_with_the_paper_numbers_and_ends_with_short_pending_lines(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setattr(cost, "estimate", lambda *args: "-")  # each row's config resolved: seconds, not tested here
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    known, waiting = tables.tables(), tables.pending()
    targets = re.findall(r"^([a-z][\w-]*): ", out, re.M)
    first = known[targets[0]]
    assert not first.protocol and any(r.numbers and first.own(r) for r in first.rows)
    protocols = [i for i, k in enumerate(targets) if k in known and known[k].protocol]
    others = [i for i, k in enumerate(targets) if k in known and not known[k].protocol]
    assert protocols and min(protocols) > max(others)
    pending = out.split("\npending (")[1].splitlines()[1:]
    assert [line.partition(":")[0] for line in pending] == list(waiting) == targets[-len(waiting):]
    assert all(len(line) <= 100 for line in pending) and any(line.endswith("…") for line in pending)
    assert re.search(r"^benz-f1: .*; 1 row, 1 run \(", out, re.M) and " x 1 seed [" in out and " x 5 seeds [" in out
    assert " 1 rows" not in out and " 1 runs" not in out and "seed(s)" not in out


def test_a_pending_target_by_name_is_listed_whole(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")
    assert cli.main(["reproduce", "me-t5", "--list"]) == 0
    (line,) = [s for s in capsys.readouterr().out.splitlines() if s.startswith("me-t5: ")]
    assert line.endswith(tables.pending()["me-t5"].pending) and len(line) > 100


# ---- 5. progress: the run's ETA, and an evaluation bar that moves within a batch --------------------------------

class _Clock:
    """Seconds that advance 10 per reading: a 30 s period fires every third step, whatever the machine's pace."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 10.0
        return self.t


def test_a_training_line_gives_the_epochs_eta_and_the_runs(tmp_path, capsys):
    p = Progress(enabled=True, every_s=30.0, clock=_Clock())
    p.console.file = io.StringIO()  # not a terminal: plain lines
    with p.task("epoch 2/3", 6, images_per_step=64, later=6) as advance:  # epoch 3's six steps after this one
        for _ in range(6):
            advance()
    # a step per 10 s: at step 3, 3 steps of this epoch and 6 of the next are left
    assert capsys.readouterr().out.splitlines() == ["epoch 2/3  step 3/6  6 img/s  ETA 0:00:30, run 0:01:30"]


def test_the_bar_shows_the_runs_time_left():
    task = types.SimpleNamespace(remaining=3.0, speed=0.1)  # rich's task: 3 steps left at a step per 10 s
    assert RunRemaining(later=6).render(task).plain == "run 0:01:30"
    assert RunRemaining(later=6).render(types.SimpleNamespace(remaining=6.0, speed=None)).plain == "run -:--:--"


def test_an_evaluation_ticks_each_attack_step_of_a_batch():
    x, y = _data()
    model, ticks = _model(), []
    attack = parse_attack("pgd3")
    eps = torch.full((4,), 8 / 255)
    per_class.confusion(model, [(x, y)], attack, eps, eps / 4, 4, progress=Ticks(0, lambda t: ticks.append(t.done)))
    # one batch: three PGD steps (a forward and a backward: 3 units each) and the prediction (1), each counted as it
    # happens, as progress_units plans them
    assert ticks == [3, 6, 9, 10] and ticks[-1] == per_class.progress_units(["pgd3"], 4)
    assert per_class.progress_units(["clean", "fgsm", "pgd20x2", "transfer:pgd20"], 4) == 1 + 4 + 121 + 1


def test_an_evaluation_line_counts_attack_steps(capsys):
    p = Progress(enabled=True, every_s=30.0, clock=_Clock())
    p.console.file = io.StringIO()
    with p.task("eval clean,pgd20 on test", 62, unit="pass") as advance:
        for _ in range(4):
            advance(3)
    assert capsys.readouterr().out.splitlines() == ["eval clean,pgd20 on test  pass 9/62  ETA 0:02:57"]


def test_the_next_lines_say_what_autoattack_s_first_look_is_and_costs():
    from fastfair.reports.summary import _autoattack_commands

    # an evaluation of 360 images, 90 % classified correctly, that ran 20,000 passes x images a second here
    record = {"split": "test", "images": 360, "classes": [str(c) for c in range(10)], "image_passes_per_s": 20_000.0,
              "results": {"clean": {"summary": {"overall": 90.0}}}}
    (first, why), (whole, why_whole) = _autoattack_commands("runs/x", record)
    # AutoAttack plans a forward per image, then 11,600 passes per correctly classified one (10 classes): on 200
    # images 200 + 180 x 11,600 = 2,088,200, 104 s; on 360, 360 + 324 x 11,600, 188 s
    assert (first, why) == ("fastfair eval runs/x --attacks aa --per-class 20",
                            "standard AutoAttack on 20 images a class, a first look: about 2 min here")
    assert (whole, why_whole) == ("fastfair eval runs/x --attacks aa",
                                  "standard AutoAttack on the whole test set: about 3 min here")
    assert _autoattack_commands("runs/x", {**record, "image_passes_per_s": 1e6})[0][1].endswith(
        "a first look: under a minute here")
    del record["image_passes_per_s"]  # no pace measured: what it is, without a time
    assert _autoattack_commands("runs/x", record)[0][1] == "standard AutoAttack on 20 images a class, a first look"
