"""What a new user met (issue 52): eval's radius from the command line, a quoted --set list, a method given as a
preset, a target's prefix, the run's ETA and the evaluation bar, and ``reproduce --list``."""
from __future__ import annotations

import json

import pytest
import torch

import fastfair
from fastfair import cli
from fastfair.errors import UserError
from helpers import demo_train


def _said(capsys, argv) -> tuple[int, str]:
    """(exit code, stderr) of the CLI run in-process."""
    code = cli.main(argv)
    return code, capsys.readouterr().err


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A one-epoch demo run on a few images per class (seconds)."""
    out = tmp_path_factory.mktemp("run") / "demo"
    assert cli.main(demo_train(out, "--quick", "10", "--quick-test", "3", "--set", "data.batch_size=50")) == 0
    return out


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
    ("fgsm", 8, "eps: eval.eps=8.0 is out of range"),
    ("fgsm", [0.01, 0.02], "eps: 2 radii for a model of 4 classes"),
    ("clean", 0.03, "eps does nothing for clean"),
])
def test_evaluate_refuses_the_eps_eval_refuses(attacks, eps, says):
    with pytest.raises(UserError, match=says.replace("[", r"\[")):
        fastfair.evaluate(_model(), _data(), attacks=attacks, eps=eps, progress=False)
