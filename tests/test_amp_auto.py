"""train.amp = auto: bf16 autocast on CUDA and on a CPU with native bf16, fp32 elsewhere; said in train.log."""
import pytest
import torch

from fastfair import build, config
from fastfair.training.trainer import Trainer

CPU = torch.device("cpu")


@pytest.mark.parametrize("amp, native, want", [
    ("auto", True, torch.bfloat16), ("auto", False, None), ("off", True, None), ("bf16", False, torch.bfloat16)])
def test_auto_follows_the_cpus_bf16_and_explicit_choices_win(monkeypatch, amp, native, want):
    monkeypatch.setattr(build, "cpu_has_native_bf16", lambda: native)
    assert build.autocast_dtype(config.resolve("demo", {}, [f"train.amp={amp}"]), CPU) is want


def test_auto_is_bf16_on_cuda_whatever_the_cpu(monkeypatch):
    monkeypatch.setattr(build, "cpu_has_native_bf16", lambda: False)
    assert build.autocast_dtype(config.resolve("demo"), torch.device("cuda")) is torch.bfloat16


def test_the_flag_is_read_from_cpuinfo(monkeypatch, tmp_path):
    info = tmp_path / "cpuinfo"
    monkeypatch.setattr(build, "Path", lambda _: info)
    info.write_text("flags\t: fpu avx512f avx512_bf16 avx512_vnni\n")
    assert build.cpu_has_native_bf16()
    info.write_text("flags\t: fpu avx512f avx512bw\n")  # avx512bw alone emulates bf16: no
    assert not build.cpu_has_native_bf16()


@pytest.mark.parametrize("native", [True, False])
def test_a_run_says_when_auto_chose_bf16_on_a_cpu(monkeypatch, tmp_path, native):
    monkeypatch.setattr(build, "cpu_has_native_bf16", lambda: native)
    cfg = config.resolve("demo", {}, ["train.epochs=1", "train.lr_milestones=[]", "train.device=cpu"])
    t = Trainer(cfg, tmp_path / "run", quiet=True)
    assert (t.amp is torch.bfloat16) is native
    log = tmp_path / "run" / "train.log"  # written when there is a line to keep
    said = log.is_file() and "train.amp=auto: bf16 autocast on this CPU" in log.read_text()
    assert said is native
