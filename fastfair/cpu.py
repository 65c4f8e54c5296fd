"""What fastfair sets for itself when it trains on a CPU (issue 57 item 4; docs/reliability.md, "CPU training").

oneDNN off for training's convolutions on an AVX2-only CPU in fp32 (``train.onednn = auto``): torch 2.13's oneDNN
weight gradient of a 1x1 convolution in channels-last memory (``jit_avx2_1x1_convolution_bwd_weights``, every
ResNet's shortcut) hung, crashed the process or returned a wrong gradient there, in most runs of the shapes measured
(bench/investigations/onednn_avx2_hang.py). AVX-512 CPUs run other kernels, bf16 autocast runs other kernels, and
evaluation takes no weight gradient: each keeps oneDNN.
"""
from __future__ import annotations

import contextlib
import os
import platform
from typing import Callable

import torch

# oneDNN's ISA names (ONEDNN_MAX_CPU_ISA) that stop below AVX-512: its AVX2 kernels are the ones it runs there
_BELOW_AVX512 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2")
NOTICE = ("train.onednn=auto: oneDNN is off for this training's convolutions: on a CPU without AVX-512, torch's "
          "oneDNN fp32 weight gradient of 1x1 convolutions can hang or crash (docs/reliability.md); "
          "--set train.onednn=on keeps it")


def onednn_avx2() -> bool:
    """Whether oneDNN runs its AVX2 kernels here: an x86 CPU without AVX-512 (as ATen sees it, so
    ``ATEN_CPU_CAPABILITY=avx2`` counts), or oneDNN held below AVX-512 by ``ONEDNN_MAX_CPU_ISA``."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    hold = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    if hold and hold.upper() != "ALL":
        return hold.upper() in _BELOW_AVX512
    return torch.backends.cpu.get_cpu_capability() == "AVX2"


def onednn_off(choice: str, dev: torch.device, amp: torch.dtype | None) -> bool:
    """Whether ``train.onednn`` (auto | on | off) turns oneDNN off for a training on ``dev`` under autocast ``amp``
    (None: fp32)."""
    if choice != "auto":
        return choice == "off"
    return dev.type == "cpu" and amp is None and onednn_avx2()


@contextlib.contextmanager
def training_convolutions(choice: str, dev: torch.device, amp: torch.dtype | None, log: Callable[[str], None]):
    """oneDNN off for the block where :func:`onednn_off` says so (ATen's own convolutions run instead); ``auto``
    says so in one line. Restored afterwards: evaluation keeps oneDNN."""
    if not (onednn_off(choice, dev, amp) and torch.backends.mkldnn.is_available()):
        yield
        return
    if choice == "auto":
        log(NOTICE)
    with torch.backends.mkldnn.flags(enabled=False):
        yield
