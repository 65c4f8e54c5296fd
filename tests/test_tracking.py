"""Experiment tracking: a short run's TensorBoard event file read back; a missing extra is one UserError."""
import pytest

from fastfair import config
from fastfair.errors import UserError
from fastfair.reports import tracking
from fastfair.training.trainer import Trainer, final_evaluation
from helpers import needs_extra


def _cfg(track):
    return config.resolve("demo", None, ["train.epochs=2", "train.progress=false", "attack.steps=1",
                                         "train.lr_milestones=[1]", "train.val_attack=pgd2", "data.batch_size=128",
                                         "eval.attacks=['clean', 'pgd2']", f"train.track={track}"])


def test_tensorboard_holds_every_epoch_per_class_and_the_final_figure(tmp_path):
    needs_extra("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cfg = _cfg("tensorboard")
    trainer = Trainer(cfg, tmp_path / "run", quiet=True)
    trainer.fit()
    result = final_evaluation(tmp_path / "run", cfg, quiet=True)
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    records = trainer.run.read_metrics()
    loss = events.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2]  # 1-based epochs, as metrics.jsonl numbers them
    assert [e.value for e in loss] == pytest.approx([r["loss"] for r in records])
    first = trainer.bundle.classes[0]
    assert [e.value for e in events.Scalars(f"val/pgd2/{first}")] == pytest.approx(
        [r["val"]["pgd2"]["per_class"][0] for r in records])
    assert {f"val/pgd2/{k}" for k in tracking.SUMMARY_KEYS} <= set(tags["scalars"])
    final = events.Scalars(f"test/pgd2/{first}")
    assert [e.step for e in final] == [2] and final[0].value == pytest.approx(result["results"]["pgd2"]["per_class"][0])
    assert "test/per_class" in tags["images"]
    png = tmp_path / "run" / "figures" / "best_pgd-test-per-class.png"  # the figure the closing summary names
    assert png.is_file() and f"figure: {png}" in trainer.run.train_log.read_text().splitlines()


def test_a_missing_tracker_package_is_one_user_error_naming_the_extra(tmp_path, monkeypatch):
    cfg = _cfg("wandb")
    real = tracking.importlib.import_module

    def without_wandb(name, package=None):  # the one importlib: torch's lazy imports pass through it too
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real(name, package)

    monkeypatch.setattr(tracking.importlib, "import_module", without_wandb)
    with pytest.raises(UserError, match=r"pip install 'fastfair\[wandb\]'"):
        Trainer(cfg, tmp_path / "run", quiet=True)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # refused before any epoch


def test_an_unknown_tracker_is_refused_by_the_config_check():
    from fastfair.checks import check_config

    with pytest.raises(UserError, match="train.track"):
        check_config(_cfg("mlflow"))
