"""What fastfair sets for itself when it trains on a CPU (issue 57 item 4; docs/reliability.md, "CPU training").

oneDNN off for training's convolutions where its weight gradient of a strided 1x1 convolution in channels-last
memory (``jit_1x1`` backward_weights: ``jit_avx2_1x1_convolution_bwd_weights`` and its AVX-512 and bf16 siblings, in
torch 2.13's oneDNN 3.12) hung, crashed the process or returned a wrong gradient: with fewer input channels than
the kernel's block, 8 for AVX2 and 16 for AVX-512 (bench/investigations/onednn_avx2_hang.py; oneDNN issue 6035: it
writes past its workspace there). NCHW memory, stride 1 and evaluation (no weight gradient) keep oneDNN.

OpenMP's idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``, :func:`share_cores`): spinning ones made the demo
train 7-18 times slower at two threads than at one on a shared 2-core machine (bench/investigations/threads.py).

This module imports torch only inside its functions: nothing here needs it loaded.
"""
from __future__ import annotations

import contextlib
import os
import platform
import sys
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) that stop below AVX-512: its AVX2 kernels are the ones it runs there
_BELOW_AVX512 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
# input channels oneDNN's 1x1 kernel takes at once, by its ISA: narrower strided 1x1 convolutions failed
BLOCK = {"avx2": 8, "avx512": 16}
NOTICE = ("train.onednn=auto: oneDNN is off for this training's convolutions: its weight gradient of strided 1x1 "
          "convolutions of few input channels in channels-last memory can hang, crash or be wrong "
          "(docs/reliability.md); --set model.channels_last=off keeps oneDNN in NCHW memory, where it held (faster "
          "here), --set train.onednn=on keeps it as it is")


def share_cores() -> None:
    """Before torch loads (the CLI's first act): OpenMP's idle threads sleep at once (``OMP_WAIT_POLICY=PASSIVE``)
    instead of spinning for a while first, which on a shared machine took the core from the thread the others waited
    for (docs/reliability.md, "CPU training"). A policy the user set (``OMP_WAIT_POLICY``, libgomp's
    ``GOMP_SPINCOUNT``) is kept; once torch is loaded its OpenMP has read the environment, so nothing changes."""
    if "torch" in sys.modules or "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def onednn_avx2() -> bool:
    """Whether oneDNN runs its AVX2 kernels here: an x86 CPU without AVX-512 (as ATen sees it, so
    ``ATEN_CPU_CAPABILITY=avx2`` counts), or oneDNN held below AVX-512 by ``ONEDNN_MAX_CPU_ISA``."""
    if not _x86():
        return False
    hold = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if hold and hold.upper() != "ALL":
        return hold.upper() in _BELOW_AVX512
    import torch

    return torch.backends.cpu.get_cpu_capability() == "AVX2"


def failing_convolutions(model: torch.nn.Module) -> bool:
    """Whether ``model`` has a strided 1x1 convolution of fewer input channels than oneDNN's block here: its weight
    gradient failed with oneDNN in channels-last memory."""
    import torch

    if not _x86():
        return False
    block = BLOCK["avx2" if onednn_avx2() else "avx512"]
    return any(isinstance(m, torch.nn.Conv2d) and m.kernel_size == (1, 1) and m.stride != (1, 1)
               and m.in_channels < block for m in model.modules())


def onednn_off(choice: str, dev: torch.device, channels_last: bool, model: torch.nn.Module) -> bool:
    """Whether ``train.onednn`` (auto | on | off) turns oneDNN off for training ``model`` on ``dev``."""
    if choice != "auto":
        return choice == "off"
    return dev.type == "cpu" and channels_last and failing_convolutions(model)


@contextlib.contextmanager
def training_convolutions(choice: str, dev: torch.device, channels_last: bool, model: torch.nn.Module,
                          log: Callable[[str], None]):
    """oneDNN off for the block where :func:`onednn_off` says so (ATen's own convolutions run instead); ``auto``
    says so in one line. Restored afterwards: evaluation keeps oneDNN."""
    import torch

    if not (onednn_off(choice, dev, channels_last, model) and torch.backends.mkldnn.is_available()):
        yield
        return
    if choice == "auto":
        log(NOTICE)
    with torch.backends.mkldnn.flags(enabled=False):
        yield
