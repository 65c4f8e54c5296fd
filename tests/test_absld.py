"""ABSLD and its teacher: a run end to end from a teacher run and from a checkpoint, the teacher frozen in eval
mode, one error line before training for a missing or mismatched teacher, and the temperature rule's edges."""
import json

import numpy as np
import pytest
import torch

import fastfair
from fastfair import cli
from fastfair.errors import UserError
from fastfair.evaluation import robustbench as rb
from fastfair.methods.absld import temperature_update
from fastfair.training.teacher import load_teacher

from helpers import NPZ_TRAIN, demo_train, needs_extra, small_npz, trained_demo

# two epochs of the cut-down demo with its lr decayed after the first: the second trains with the temperatures the
# first epoch's update set, at a tenth of the rate
ABSLD = ["--method", "absld", "--epochs", "2", "--set", "train.lr_milestones=[1]"]


@pytest.fixture(scope="module")
def teacher_run():
    return trained_demo()


def one_error(capsys, says: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and says in err and err.count("\n") == 1, err
    return err


def test_absld_trains_from_a_teacher_run_and_moves_the_class_temperatures(teacher_run, tmp_path):
    out = tmp_path / "student"
    assert cli.main(demo_train(out, *ABSLD, "--set", f"method.teacher={teacher_run}")) == 0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, second = (r["vectors"] for r in records)  # each line: the temperatures its epoch trained with
    assert first["absld_temp_adv"] == first["absld_temp_nat"] == [1.0] * 10
    for name in ("absld_temp_adv", "absld_temp_nat"):
        moved = torch.tensor(second[name]) - 1.0
        # each class moves by at most the rate (0.1 x the lr's decay to epoch 2: 0.01), the riskiest by all of it
        assert moved.abs().max() == pytest.approx(0.01, abs=1e-6) and (moved > 0).any() and (moved < 0).any()
    assert (out / "eval" / "best_pgd-test.json").is_file()


def test_absld_takes_a_checkpoint_file_and_leaves_the_teacher_frozen(teacher_run, tmp_path):
    checkpoint = teacher_run / "checkpoints" / "best_pgd.pt"
    before = checkpoint.read_bytes()
    teacher = load_teacher(str(teacher_run), dataset="digits", num_classes=10, device="cpu")
    assert not teacher.training and not any(p.requires_grad for p in teacher.parameters())
    out = tmp_path / "student"
    assert cli.main(demo_train(out, *ABSLD[:2], "--set", f"method.teacher={checkpoint}")) == 0
    assert checkpoint.read_bytes() == before and (out / "checkpoints" / "last.pt").is_file()


@pytest.mark.parametrize("teacher,says", [
    ("", "absld distils from a teacher: give one with --set method.teacher="),
    ("no/such/run", "method.teacher: no run directory or checkpoint at no/such/run"),
])
def test_a_missing_teacher_is_one_line_before_any_data_loads(tmp_path, capsys, teacher, says):
    assert cli.main(demo_train(tmp_path / "run", *ABSLD[:2], "--set", f"method.teacher={teacher}")) == 2
    one_error(capsys, says)
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match="teacher"):  # the Python API checks what the CLI checks
        fastfair.method("absld", num_classes=10, sets={"method.teacher": teacher})


def test_a_teacher_of_other_classes_is_one_line_before_training(teacher_run, tmp_path, capsys):
    small_npz(tmp_path)  # 4 classes; the demo teacher has the digits' 10
    args = [a.format(tmp=tmp_path) for a in NPZ_TRAIN]
    out = tmp_path / "run"
    assert cli.main(["train", *args, *ABSLD[:2], "--quiet", "--out", str(out),
                     "--set", f"method.teacher={teacher_run}"]) == 2
    one_error(capsys, "has 10 classes and this run's data set 4; give a teacher trained on the same classes")
    assert not (out / "metrics.jsonl").exists()


def test_a_robustbench_teacher_needs_its_weights_and_a_robustbench_data_set(tmp_path, capsys):
    with pytest.raises(UserError, match="RobustBench holds cifar10, cifar100 models; this run trains on digits"):
        load_teacher("rb:Ding2020MMA", dataset="digits", num_classes=10, device="cpu")
    if not rb.installed():
        with pytest.raises(UserError, match=r"needs RobustBench: pip install"):
            load_teacher("rb:Ding2020MMA", dataset="cifar10", num_classes=10, device="cpu")
        return
    with pytest.raises(UserError, match="fastfair zoo --fetch --models Ding2020MMA"):
        load_teacher("rb:Ding2020MMA", dataset="cifar10", num_classes=10, device="cpu", model_dir=str(tmp_path))


def test_temperature_update_steps_against_the_gap_clips_and_keeps_equal_risks():
    tau = torch.tensor([1.0, 0.55, 4.98])
    out = temperature_update(tau, torch.tensor([3.0, 5.0, 1.0]), 0.1, 0.5, 5.0)
    # gap (0, 2, -2) over max |gap| 2: the riskiest class sharpens by the whole rate, clipped at 0.5 and 5
    assert torch.allclose(out, torch.tensor([1.0, 0.5, 5.0]))
    assert torch.equal(temperature_update(tau, torch.full((3,), 2.0), 0.1, 0.5, 5.0), tau)


def test_reproduce_plans_the_absld_row_with_its_teacher_in_model_dir_or_leaves_it_out(tmp_path):
    needs_extra("robustbench")  # the rb: teacher
    from fastfair.reproduce import runs, tables

    npz = tmp_path / "tiny.npz"
    np.savez(npz, x_train=np.zeros((40, 3, 8, 8), np.uint8), y_train=np.arange(40) % 10,
             x_test=np.zeros((20, 3, 8, 8), np.uint8), y_test=np.arange(20) % 10)
    models = tmp_path / "models"

    def absld_run():
        planned = runs.plan(tables.get("trix-rebuttal-t1"), 1, "subset", str(npz), tmp_path / "out", {},
                            model_dir=str(models))
        return next(r for r in planned if r.row.preset == "trix-rebuttal-t1-absld")

    assert "its teacher: no weights for RobustBench's Zhang2019Theoretically" in absld_run().missing
    weights = rb.model_file("Zhang2019Theoretically", model_dir=str(models))
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"")  # there: the run is planned, reading the teacher from --model-dir
    run = absld_run()
    assert run.missing == "" and run.sets["method.teacher_model_dir"] == str(models)


def test_a_resumed_absld_run_keeps_its_temperatures_and_ends_as_an_uninterrupted_one(teacher_run, tmp_path):
    from fastfair import config
    from fastfair.rundir import load_checkpoint
    from fastfair.training.trainer import Trainer

    cfg = config.resolve("demo", {"method.name": "absld"}, [
        f"method.teacher={teacher_run}", "train.epochs=3", "train.lr_milestones=[]", "model.width=4",
        "attack.steps=1", "train.val_attack=fgsm", "eval.attacks=['clean']", "data.batch_size=256",
        "train.progress=false"])
    Trainer(cfg, tmp_path / "straight", quiet=True).fit()
    killed = Trainer(cfg, tmp_path / "resumed", quiet=True)
    killed.run_epoch(0)
    killed.run_epoch(1)  # its checkpoint holds the temperatures the third epoch trains with
    del killed
    resumed = Trainer(cfg, tmp_path / "resumed", resume=True, quiet=True)
    assert resumed.start_epoch == 2 and resumed.state["absld_temp_adv"].ne(1.0).any()
    resumed.fit()
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt") for run in ("straight", "resumed"))
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["class_state"][k], b["class_state"][k]) for k in ("absld_temp_adv", "absld_temp_nat"))
