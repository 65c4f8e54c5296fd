"""The row-loss kernel's float arguments: the eager and the Inductor launch compute alike, in fp32.

An eager launch types a Python float argument ``fp32`` (Triton's ``mangle_type``); Inductor's
wrapper types the same argument ``fp64`` (``signature_of(SizeArg(name, value))``, what
``define_user_defined_triton_kernel`` builds for each non-tensor argument). Left so, the
compiled kernel computes in fp64 (sm_90: 160 registers instead of 63). The kernel casts its nine
floats to fp32 first, so both specialisations run the same fp32 arithmetic: checked here on the
PTX for sm_90, compiled ahead of time without a GPU (Triton's bundled ptxas), in a subprocess,
because under ``TRITON_INTERPRET=1`` the kernels are not compilable ``JITFunction`` objects; one subprocess for both
typings (an interpreter and torch's import cost more than a compile).

Run as a script (``python tests/test_kernel_scalars.py fp64``) it prints that PTX (given both typings, each in
turn, a line ``NEXT`` between them).
"""
from __future__ import annotations

import collections
import inspect
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
INTS = {"N", "C", "stride_zn", "stride_za", "stride_w"}


def _float_params():
    """Names of the kernel's float arguments (neither pointer, integer, nor constexpr)."""
    from fastfair.kernels import fused_loss

    params = inspect.signature(fused_loss._row_loss_kernel.fn).parameters.values()  # a JITFunction or interpreted
    return [p.name for p in params if "constexpr" not in str(p.annotation) and not p.name.endswith("_ptr")
            and p.name not in INTS]


def test_the_launches_type_the_floats_differently():
    """Why the cast is needed: Inductor passes fp64 where an eager launch passes fp32."""
    from torch._inductor.codegen.common import SizeArg
    from torch._inductor.codegen.triton_utils import signature_of
    from torch._inductor.virtualized import V
    from triton.runtime.jit import mangle_type

    names = _float_params()
    assert len(names) == 9  # smoothing, temperature, kappa and the six term weights
    with V.set_graph_handler(types.SimpleNamespace(current_device=torch.device("cuda"))):
        inductor = {signature_of(SizeArg(n, 0.5), size_dtype=None) for n in names}
    assert inductor == {"fp64"}
    assert {mangle_type(0.5)} == {"fp32"}


NEXT = "\nNEXT\n"  # between two PTX listings on the script's output (no PTX line is NEXT)


def _ptx(*float_types: str) -> list[str]:
    """The kernel's PTX with its floats typed as each of ``float_types``, compiled in one subprocess."""
    env = {**os.environ, "TRITON_INTERPRET": "0"}
    done = subprocess.run([sys.executable, __file__, *float_types], env=env, capture_output=True, text=True,
                          cwd=HERE.parent)
    assert done.returncode == 0, done.stderr[-3000:]
    listings = done.stdout.split(NEXT)
    assert len(listings) == len(float_types), done.stdout[-3000:]
    return listings


def _instructions(ptx: str) -> collections.Counter:
    """How many times each PTX instruction occurs (directives such as ``.loc`` and comments left out)."""
    return collections.Counter(line.split()[0] for line in ptx.splitlines()
                               if line.startswith("\t") and not line.startswith(("\t.", "\t//")))


@pytest.mark.slow
def test_inductor_and_eager_launches_compute_in_fp32():
    """All six terms with both gradients (training TRADES-like rows), C = 10, compiled for sm_90 with the
    floats typed as each launch types them: the same instructions but for the nine fp64 loads and conversions."""
    eager, inductor = _ptx("fp32", "fp64")
    assert ".f64" not in eager
    f64 = [line.strip() for line in inductor.splitlines() if ".f64" in line]
    arithmetic = [line for line in f64 if not line.startswith((".param .f64", "cvt.rn.f32.f64"))]
    assert arithmetic == [], arithmetic[:10]
    a, b = _instructions(eager), _instructions(inductor)
    n = len(_float_params())
    differ = {op: b[op] - a[op] for op in a | b if a[op] != b[op]}
    # each float is loaded as 64 bits instead of 32 and converted once; nothing else differs
    assert differ == {"ld.param.b64": n, "ld.param.b32": -n, "cvt.rn.f32.f64": n}, differ


def _compile(float_type: str) -> str:
    """PTX of the row-loss kernel for sm_90 with its float arguments typed ``float_type``."""
    import triton
    from triton.backends.compiler import GPUTarget

    from fastfair.kernels import fused_loss

    kernel = fused_loss._row_loss_kernel
    floats = set(_float_params())
    signature = {p.name: "constexpr" if p.is_constexpr else "*i64" if p.name == "y_ptr" else
                 "*fp32" if p.name.endswith("_ptr") else "i32" if p.name in INTS else float_type
                 for p in kernel.params}
    assert {n for n, t in signature.items() if t == float_type} == floats
    every = sum(fused_loss.BIT.values())
    constants = dict(TERMS=every, HAS_NAT=True, HAS_ADV=True, **fused_loss._TERM_INDEX,
                     **{f"ROW_{t}": -1 for t in fused_loss._TERM_INDEX}, GRAD_NAT=True, GRAD_ADV=True,
                     BLOCK_R=128, BLOCK_C=16)
    source = triton.compiler.ASTSource(fn=kernel, signature=signature,
                                       constexprs={(kernel.arg_names.index(n),): v for n, v in constants.items()})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import conftest  # noqa: F401  (this checkout's fastfair.kernels; TRITON_INTERPRET=0 from the caller)

    print(NEXT.join(_compile(float_type) for float_type in sys.argv[1:]))
