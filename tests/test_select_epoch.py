"""``train.select = epoch``: the checkpoint of one fixed epoch (issue 41 item 2; Tian et al. ICLR Sec. 3 keeps the
75th epoch's model), evaluated at the end of training as the other policies' are."""
import pytest
import torch

from fastfair import cli, config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.rundir import RunDir

# the demo (digits, tiny CNN) cut to seconds, without its lr milestones (the two runs below share every epoch's rate)
FAST = ["--config", "demo", "--quiet", "--set", "model.width=4", "--set", "attack.steps=1",
        "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean']", "--set", "data.batch_size=256",
        "--set", "train.lr_milestones=[]"]


def test_the_kept_weights_are_exactly_those_after_that_epoch(tmp_path):
    kept, short = tmp_path / "kept", tmp_path / "short"
    assert cli.main(["train", *FAST, "--epochs", "3", "--set", "train.select=epoch", "--set", "train.select_epoch=2",
                     "--out", str(kept)]) == 0
    assert cli.main(["train", *FAST, "--epochs", "2", "--set", "train.select=last", "--out", str(short)]) == 0
    run = RunDir(kept)
    epoch = torch.load(run.checkpoint("epoch"), weights_only=True)
    after_two = torch.load(RunDir(short).last, weights_only=True)["model"]
    after_three = torch.load(run.last, weights_only=True)["model"]
    assert epoch["epoch"] == 2
    assert epoch["model"].keys() == after_two.keys()
    assert all(torch.equal(epoch["model"][k], after_two[k]) for k in after_two)
    assert not all(torch.equal(epoch["model"][k], after_three[k]) for k in after_three)  # not simply the last
    assert run.selected_checkpoint("epoch") == run.checkpoint("epoch")
    assert run.eval_file(run.checkpoint("epoch"), "test").is_file()  # the final evaluation is of epoch.pt


@pytest.mark.parametrize("sets, said", [
    ({"train.select": "epoch"}, "train.select=epoch keeps the model after one epoch: name it with train.select_epoch"),
    ({"train.select": "epoch", "train.select_epoch": 16},
     r"train.select_epoch = 16 \(the checkpoint train.select = epoch evaluates from epoch 16\) is past train.epochs = "
     r"15.*--set train.select_epoch=15"),
    ({"train.select_epoch": 5}, "train.select_epoch = 5 is read by train.select=epoch only, so it would do nothing "
                                "with train.select=pgd"),
])
def test_a_bad_epoch_is_one_error_line(capsys, tmp_path, sets, said):
    with pytest.raises(UserError, match=said):  # the Python API checks what the CLI checks
        check_config(config.resolve("demo", sets))
    argv = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    out = tmp_path / "run"
    assert cli.main(["train", "--config", "demo", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: "), err
    assert not out.exists()
