"""What fastfair sets for itself on a CPU (fastfair/cpu.py, issue 57 item 4): oneDNN off for training's
convolutions where its 1x1 weight gradient hangs or crashes, and the notice saying so."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fastfair import cpu
from fastfair.rundir import RunDir

ROOT = Path(__file__).parents[1]
AVX2 = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}  # an AVX2-only CPU, emulated
CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.mark.parametrize("env, capability, avx2", [
    ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "AVX512", True),  # oneDNN held to AVX2 on an AVX-512 CPU
    ({"ONEDNN_MAX_CPU_ISA": "avx2_vnni"}, "AVX512", True),
    ({"DNNL_MAX_CPU_ISA": "AVX2"}, "AVX512", True),  # oneDNN's older name
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "AVX2", False),  # the hold says which kernels run
    ({"ONEDNN_MAX_CPU_ISA": "ALL"}, "AVX2", True),  # no hold: the CPU decides
    ({}, "AVX2", True), ({}, "AVX512", False), ({}, "DEFAULT", False),
])
def test_the_avx2_kernels_are_told_from_the_cpu_and_the_env_holds(env, capability, avx2, monkeypatch):
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    assert cpu.onednn_avx2() is avx2
    monkeypatch.setattr(cpu.platform, "machine", lambda: "aarch64")
    assert not cpu.onednn_avx2()  # oneDNN's ARM kernels are others


def _net(*convs: tuple[int, int]) -> torch.nn.Module:
    """1x1 convolutions of (input channels, stride), and a 3x3 one."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), *(torch.nn.Conv2d(c, 8, 1, stride=s) for c, s in convs))


@pytest.mark.parametrize("avx2, convs, failing", [
    (True, [], False),  # no 1x1 convolution: nothing to avoid
    (True, [(4, 2)], True), (True, [(8, 2), (4, 1)], False),  # AVX2: strided and narrower than its block of 8
    (False, [(8, 2)], True), (False, [(16, 2), (4, 1)], False),  # AVX-512: its block is 16
])
def test_the_failing_convolutions_are_told_from_the_isa_and_the_model(avx2, convs, failing, monkeypatch):
    monkeypatch.setattr(cpu, "onednn_avx2", lambda: avx2)
    monkeypatch.setattr(cpu.platform, "machine", lambda: "x86_64")
    assert cpu.failing_convolutions(_net(*convs)) is failing
    monkeypatch.setattr(cpu.platform, "machine", lambda: "aarch64")
    assert not cpu.failing_convolutions(_net(*convs))


def test_onednn_is_off_for_channels_last_cpu_training_of_such_a_model_and_as_the_key_says(monkeypatch):
    monkeypatch.setattr(cpu, "failing_convolutions", lambda model: True)
    net = _net()
    assert cpu.onednn_off("auto", CPU, True, net)
    assert not cpu.onednn_off("auto", CPU, False, net)  # NCHW runs oneDNN's blocked path, which held
    assert not cpu.onednn_off("auto", CUDA, True, net)
    assert not cpu.onednn_off("on", CPU, True, net) and cpu.onednn_off("off", CUDA, False, net)
    monkeypatch.setattr(cpu, "failing_convolutions", lambda model: False)
    assert not cpu.onednn_off("auto", CPU, True, net)


def test_the_block_turns_onednn_off_says_why_once_and_puts_it_back(monkeypatch):
    monkeypatch.setattr(cpu, "failing_convolutions", lambda model: True)
    said, net = [], _net()
    with cpu.training_convolutions("auto", CPU, True, net, said.append):
        assert not torch.backends.mkldnn.enabled
    assert torch.backends.mkldnn.enabled and said == [cpu.NOTICE]
    with cpu.training_convolutions("on", CPU, True, net, said.append):
        assert torch.backends.mkldnn.enabled
    with cpu.training_convolutions("off", CPU, True, net, said.append):  # asked for: nothing to say
        assert not torch.backends.mkldnn.enabled
    assert said == [cpu.NOTICE]


@pytest.mark.fault
def test_fp32_training_of_a_resnet_on_an_emulated_avx2_cpu_ends(tmp_path):
    """The trigger: preact-resnet18 width 4's first shortcut (4 input channels, stride 2) trained in fp32 with oneDNN
    held to AVX2 hung (both threads in jit_avx2_1x1_convolution_bwd_weights), crashed or went wrong with oneDNN on;
    with fastfair's default it ends (19-21 s on the 2-core machine at load average 5)."""
    rng = np.random.default_rng(0)
    npz = tmp_path / "cifar-shaped.npz"
    # 8 steps: with oneDNN on (--set train.onednn=on) 5 of 5 such runs hung past 60 s; 2 steps hung in 2 of 6
    np.savez(npz, x_train=rng.integers(0, 256, (410, 3, 32, 32), dtype=np.uint8), y_train=np.arange(410) % 10,
             x_test=rng.integers(0, 256, (10, 3, 32, 32), dtype=np.uint8), y_test=np.arange(10) % 10)
    out = tmp_path / "run"
    args = ["train", "--method", "pgd-at", "--dataset", "npz", "--data-dir", npz, "--model", "preact-resnet18",
            "--epochs", "1", "--out", out, "--quiet", "--set", "model.width=4", "--set", "data.val_per_class=1",
            "--set", "data.batch_size=50", "--set", "attack.steps=1", "--set", "train.val_attack=fgsm",
            "--set", "eval.attacks=['clean']", "--set", "train.amp=off"]
    env = {**os.environ, **AVX2, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_NUM_THREADS", None)  # torch's default threads: two on 2 cores hung, one crashed
    try:
        r = subprocess.run([sys.executable, "-m", "fastfair", *map(str, args)], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:  # subprocess.run has killed it
        pytest.fail("the emulated AVX2 fp32 training did not end within 240 s: oneDNN's AVX2 1x1 weight gradient "
                    "is back in training (fastfair/cpu.py)")
    assert r.returncode == 0, r.stderr[-3000:]
    assert cpu.NOTICE in RunDir(out).train_log.read_text()  # the run's log says why it ran without oneDNN


# ---- threads on a shared machine ---------------------------------------------------------------------------

def _policy_after(code: str, **env: str) -> str:
    """OMP_WAIT_POLICY in a fresh process after ``code`` (the environment without a policy, plus ``env``)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    r = subprocess.run([sys.executable, "-c", f"{code}\nimport os; print(os.environ.get('OMP_WAIT_POLICY'))"],
                       env={**clean, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_the_cli_lets_openmp_threads_sleep_before_torch_loads_unless_the_user_chose():
    listing = "from fastfair import cli; cli.main(['presets'])"
    assert _policy_after(listing) == "PASSIVE"
    assert _policy_after(listing, OMP_WAIT_POLICY="ACTIVE") == "ACTIVE"
    assert _policy_after(listing, GOMP_SPINCOUNT="10000") == "None"  # libgomp's own spin setting: the user's
    assert _policy_after(f"import torch; {listing}") == "None"  # its OpenMP has read the environment: too late
