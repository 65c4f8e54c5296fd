"""Every Triton kernel of fastfair.kernels compiled ahead of time for sm_80 (A100) and sm_90 (H100), no GPU needed.

    python bench/lease/kernels_aot.py    # exit 1 on a compile error, a spill, or registers above the ceiling

84 compiles of the 250 configurations' launches: 150 CPU s on a loaded 2-core machine. ``--smoke`` enumerates every
specialisation but compiles one per kernel (6 compiles): tests/test_kernels_aot.py runs it in CI and checks the
committed results (``bench/results/kernels-aot-triton<version>.json``) against it: the same kernels' sources and
specialisations (so they hold today; run this script and commit its results after a kernel or a wrapper changes) and
the same registers for the sample.

What is compiled: exactly what the wrappers launch. The loss-row term sets come from the code, not a
list: one training step of every registered method and every shipped preset (tiny CNN, CPU, the
``triton`` backend) runs with the kernels' launch entry points replaced by recorders, which note each
call's term mask, per-sample weight rows and gradient flags (the kernel's constexprs). Each recorded
key is then launched again through the wrappers' own launch code (``_launch_row_loss``, the bodies of
``pgd_step_op`` and ``random_start_op``) on meta tensors at N 128 / 512, C 10 / 100, fp32 / bf16
logits and images, with the kernels' ``launcher`` replaced by a recorder: so block sizes, ``num_warps`` and every
argument are the wrappers' choice. Triton's own binder turns each launch into the signature,
constexprs and divisibility attributes its JIT would compile (meta tensors have data pointer 0:
16-byte aligned, as the CUDA caching allocator's blocks are), and ``triton.compile`` builds it for
``GPUTarget("cuda", 80, 32)`` and ``("cuda", 90, 32)`` with triton's bundled ptxas, whose ``-v``
report gives registers, spill stores / loads and the stack frame; shared memory is triton's own
``metadata.shared``.

The register ceiling (see :func:`ceiling`): every CTA of the launch's grid resident at once (one
wave), where the SM allows it. Per SM, A100 (sm_80, 108 SMs) and H100 SXM (sm_90, 132 SMs) both have
65536 32-bit registers, 2048 threads and 32 CTAs, and allocate registers per warp in units of 256
(8 per thread); a thread has at most 255 (CUDA C Programming Guide, "Technical Specifications per
Compute Capability"). A grid of G CTAs of W warps needs R = min(ceil(G / SMs), 2048 / (32 W), 32) CTAs
per SM, so the ceiling is min(255, floor(65536 / (R x 32 W) / 8) x 8). The loss rows launch at most
64 CTAs at N <= 512 (one per SM: the ceiling is 255, only spills bind); the PGD step and the random
starts launch N x 6 CTAs of 4 warps (N = 128: 768 CTAs, 8 per A100 SM: 64 registers, 6 per H100 SM:
80; N = 512: 3072 CTAs, 16 per SM, all its 2048 threads: 32 on both).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.abc
import importlib.util
import io
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels (JITFunction), not the interpreter's: read at decoration

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class _CheckoutFinder(importlib.abc.MetaPathFinder):
    """``fastfair.kernels`` and ``fastfair.presets`` are this checkout's ``kernels/`` and ``configs/``, whichever
    checkout is installed (as tests/conftest.py maps them)."""

    FOLDERS = {"fastfair.kernels": ROOT / "kernels", "fastfair.presets": ROOT / "configs"}

    def find_spec(self, name, path, target=None):
        folder = self.FOLDERS.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


sys.meta_path.insert(0, _CheckoutFinder())

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from fastfair.kernels import fused_loss, pgd  # noqa: E402
from fastfair.ops import losses, steps  # noqa: E402

TARGETS = {"sm_80": GPUTarget("cuda", 80, 32), "sm_90": GPUTarget("cuda", 90, 32)}
REGS_PER_SM = 65536  # A100 and H100 alike (CUDA C Programming Guide, Technical Specifications per Compute Capability)
MAX_REGS_PER_THREAD = 255
SMS = {"sm_80": 108, "sm_90": 132}  # A100 SXM / PCIe, H100 SXM (H100 PCIe has 114: more CTAs per SM, fewer)
THREADS_PER_SM, CTAS_PER_SM, REG_UNIT = 2048, 32, 8
NS, CS, DTYPES = (128, 512), (10, 100), (torch.float32, torch.bfloat16)
IMAGE = (3, 32, 32)  # CIFAR; the PGD kernels' specialisation does not depend on the image size beyond PER % 16


def ceiling(target: str, num_warps: int, ctas: int) -> int:
    """Registers per thread at which a grid of ``ctas`` CTAs is resident in one wave, or the SM is full (module doc)."""
    per_sm = min(-(-ctas // SMS[target]), THREADS_PER_SM // (32 * num_warps), CTAS_PER_SM)
    return min(MAX_REGS_PER_THREAD, REGS_PER_SM // (per_sm * 32 * num_warps) // REG_UNIT * REG_UNIT)


# ---- what a training step launches (derived by running the code) -------------------------------

@dataclasses.dataclass(frozen=True, order=True)
class RowKey:
    """The row-loss launch's constexprs that a call site decides (block sizes follow from N and C)."""

    terms: tuple[str, ...]
    per_sample: tuple[str, ...]  # terms whose weight is a per-sample row (ROW_<TERM> >= 0)
    grad_nat: bool
    grad_adv: bool

    def label(self) -> str:
        weights = "+".join(f"{t}[row]" if t in self.per_sample else t for t in self.terms)
        grads = ",".join(g for g, on in (("d_nat", self.grad_nat), ("d_adv", self.grad_adv)) if on) or "no grad"
        return f"{weights} ({grads})"


def _row_key(terms: int, row_of, grad_nat: bool, grad_adv: bool) -> RowKey:
    names = [t.name for t in losses.TERMS if terms & fused_loss.BIT[t.name]]
    rows = [t.name for t, r in zip(losses.TERMS, row_of) if r >= 0 and t.name in names]
    return RowKey(tuple(names), tuple(rows), bool(grad_nat), bool(grad_adv))


@contextlib.contextmanager
def recording():
    """Inside: the kernels' ops record their call and return the PyTorch reference's result.

    ``can_launch`` says yes on a CPU, so the wrappers take the kernel path up to the op call, which
    is where the kernel's constexprs are fixed."""
    seen: dict = {"row_loss": set(), "pgd_step": set(), "random_start": set()}

    def row_loss_op(z_nat, z_adv, y, rows, scalars, row_of, terms, smoothing, temperature, kappa, grad_nat, grad_adv):
        seen["row_loss"].add(_row_key(terms, row_of, grad_nat, grad_adv))
        weights = {t.name: (rows[r] if r >= 0 else s) for t, s, r in zip(losses.TERMS, scalars, row_of)
                   if terms & fused_loss.BIT[t.name]}
        loss = losses.row_loss(z_nat, z_adv, y, smoothing=smoothing, temperature=temperature, kappa=kappa, **weights)
        return loss, None, None

    def pgd_step_op(x_adv, grad, x, y, eps_c, alpha_c):
        seen["pgd_step"].add(())
        return steps.pgd_step(x_adv, grad, x, y, eps_c, alpha_c)

    def random_start_op(x, y, eps_c, seed, normal):
        seen["random_start"].add(bool(normal))
        return steps.random_start(x, y, eps_c, "normal" if normal else "uniform")

    patches = [(fused_loss, "row_loss_op", row_loss_op), (pgd, "pgd_step_op", pgd_step_op),
               (pgd, "random_start_op", random_start_op)]
    patches += [(m, "can_launch", lambda t: True) for m in (fused_loss, pgd)]
    saved = [(m, name, getattr(m, name)) for m, name, _ in patches]
    try:
        for m, name, fn in patches:
            setattr(m, name, fn)
        yield seen
    finally:
        for m, name, fn in saved:
            setattr(m, name, fn)


def training_configs() -> list[tuple[str | None, str | None, dict]]:
    """(method, preset, settings): every registered method at its defaults, PGD-AT with every attack objective
    and start the PGD engine knows, then every shipped preset."""
    from fastfair.attacks.pgd import OBJECTIVES
    from fastfair.methods import METHODS

    presets = sorted(p.stem for p in (ROOT / "configs").glob("*.toml"))
    attacks = [("pgd-at", None, {"attack.objective": o, "attack.init": i}) for o in OBJECTIVES for i in steps.INITS]
    return [(m, None, {}) for m in METHODS] + attacks + [(None, p, {}) for p in presets]


def _trainer(method, preset, settings, small, out):
    from fastfair import config
    from fastfair.training.trainer import Trainer

    cfg = config.resolve(preset, {"method.name": method} if method else None)
    return Trainer(config.apply(cfg, {**small, **settings}, "kernels_aot"), out, quiet=True)


def launched_by_training(configs) -> tuple[dict, list[str]]:
    """The kernel keys that one training step of each config launches, and the configs that could not run."""
    from fastfair import config
    from fastfair.errors import UserError

    from bench import common

    dataset = common.register_synthetic(64, 0, (3, 8, 8))
    small = {"model.name": "tiny-cnn", "model.width": 4, "data.dataset": dataset, "data.batch_size": 8,
             "data.val_per_class": 1, "attack.steps": 1, "train.kernels": "triton", "train.compile": "off",
             "train.device": "cpu", "train.progress": False, "train.init_from": ""}
    found = {"row_loss": set(), "pgd_step": set(), "random_start": set()}
    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (method, preset, settings) in enumerate(configs):
            name = " ".join(filter(None, [method, preset, json.dumps(settings) if settings else None]))
            out = Path(tmp) / str(i)
            with recording() as seen:
                try:
                    try:
                        trainer = _trainer(method, preset, settings, small, out / "run")
                    except UserError as e:  # FRL fine-tunes, ABSLD distils: a checkpoint of the same model
                        key = next((k for k in ("train.init_from", "method.teacher")
                                    if k in str(e) or (k == "train.init_from" and "--init-from" in str(e))), None)
                        if key is None:
                            raise
                        same = {k: v for k, v in (config.read_preset(preset) if preset else {}).items()
                                if k.startswith(("model.", "data.")) and k not in small}  # the model it must fit
                        start = _trainer("pgd-at", None, {**same, **settings}, small, out / "start")
                        torch.save(start._state(0), out / "start.pt")
                        trainer = _trainer(method, preset, {**settings, key: str(out / "start.pt")}, small,
                                           out / "run")
                    trainer.method.begin_epoch(trainer.model, 0)
                    trainer.model.train()
                    x, y = next(iter(trainer.train_loader))
                    trainer.train_step(x, y)
                except Exception as e:  # noqa: BLE001 -- a config that cannot run here is reported, not hidden
                    failed.append(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
            for kind, keys in seen.items():
                found[kind] |= keys
    return found, failed


# ---- the wrappers' launches, on meta tensors -------------------------------------------------

@dataclasses.dataclass
class Launch:
    kernel: object  # the JITFunction
    args: tuple
    kwargs: dict
    ctas: int  # CTAs in the grid
    label: str  # what was launched, for the report
    shape: dict


@contextlib.contextmanager
def capturing():
    """``launcher`` in the kernel modules records ``kernel[grid](*args, **kwargs)`` instead of launching."""
    launches: list[tuple] = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((self.kernel, math.prod(grid), args, kwargs))

    saved = [(m, m.launcher) for m in (fused_loss, pgd)]
    try:
        for m, _ in saved:
            m.launcher = Recorder
        yield launches
    finally:
        for m, fn in saved:
            m.launcher = fn


def _op_body(op):
    """The Python function a ``triton_op`` wraps (what runs when the op is called on a CUDA tensor)."""
    return op._init_fn


def row_loss_launches(key: RowKey, n: int, c: int, dtype: torch.dtype) -> list[Launch]:
    meta = "meta"
    z = torch.empty(n, c, device=meta, dtype=dtype)
    y = torch.empty(n, device=meta, dtype=torch.int64)
    weights = {t: (torch.empty(n, device=meta) if t in key.per_sample else 1.0) for t in key.terms}
    rows, scalars, row_of, terms = fused_loss.kernel_weights(weights, n, meta)
    has_nat, has_adv = bool(terms & fused_loss.NAT_TERMS), bool(terms & fused_loss.ADV_TERMS)
    with capturing() as launches:
        fused_loss._launch_row_loss(z if has_nat else None, z if has_adv else None, y, rows, scalars, row_of, terms,
                                    0.0, 1.0, math.inf, key.grad_nat, key.grad_adv)
    shape = {"N": n, "C": c, "dtype": str(dtype).replace("torch.", "")}
    return [Launch(k, a, kw, ctas, f"row_loss {key.label()}", shape) for k, ctas, a, kw in launches]


def pgd_launches(kind: str, normal: bool, n: int, dtype: torch.dtype) -> list[Launch]:
    meta = "meta"
    x = torch.empty(n, *IMAGE, device=meta, dtype=dtype).to(memory_format=torch.channels_last)
    y = torch.empty(n, device=meta, dtype=torch.int64)
    eps = torch.empty(10, device=meta)
    with capturing() as launches:
        if kind == "pgd_step":
            _op_body(pgd.pgd_step_op)(x, torch.empty_like(x), x, y, eps, eps)
        else:
            _op_body(pgd.random_start_op)(x, y, eps, torch.empty(1, device=meta, dtype=torch.int64), normal)
    label = "pgd_step" if kind == "pgd_step" else f"random_start {'normal' if normal else 'uniform'}"
    shape = {"N": n, "image": list(IMAGE), "dtype": str(dtype).replace("torch.", "")}
    return [Launch(k, a, kw, ctas, label, shape) for k, ctas, a, kw in launches]


def enumerate_launches(found: dict) -> list[Launch]:
    """The wrappers' launches for every key a training step used, at each N, C and dtype."""
    out = [la for key in sorted(found["row_loss"]) for n in NS for c in CS for d in DTYPES
           for la in row_loss_launches(key, n, c, d)]
    out += [la for _ in found["pgd_step"] for n in NS for d in DTYPES for la in pgd_launches("pgd_step", False, n, d)]
    out += [la for normal in sorted(found["random_start"]) for n in NS for d in DTYPES
            for la in pgd_launches("random_start", normal, n, d)]
    return out


# ---- compiling ---------------------------------------------------------------------------------

_PTXAS = {"registers": r"Used (\d+) registers", "spill_stores": r"(\d+) bytes spill stores",
          "spill_loads": r"(\d+) bytes spill loads", "stack_frame": r"(\d+) bytes stack frame"}


def specialise(launch: Launch, target: GPUTarget):
    """(signature, constexprs, attrs, options) that triton's JIT would compile for this launch on ``target``."""
    k = launch.kernel
    backend = make_backend(target)
    binder = create_function_from_signature(k.signature, k.params, backend)
    bound, specialization, options = binder(*launch.args, **launch.kwargs)
    return k._pack_args(backend, launch.kwargs, bound, specialization, options)


def compile_one(launch: Launch, target: GPUTarget) -> dict:
    options, signature, constexprs, attrs = specialise(launch, target)
    log = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(log):  # ptxas -v, printed by triton when dump_ptxas_log is on
        compiled = triton.compile(ASTSource(launch.kernel, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
    seconds = time.perf_counter() - t0
    text = log.getvalue()
    usage = {}
    for name, pattern in _PTXAS.items():
        m = re.search(pattern, text)
        if m is None:
            raise RuntimeError(f"no '{pattern}' in ptxas's report for {launch.label}:\n{text}")
        usage[name] = int(m.group(1))
    scalars = sorted({v for v in signature.values() if v in ("fp32", "fp64")})
    names = launch.kernel.arg_names
    return {**usage, "shared_bytes": compiled.metadata.shared, "num_warps": options.num_warps,
            "compile_s": round(seconds, 2), "float_args": scalars,
            "constexprs": {names[path[0]]: value for path, value in constexprs.items()}}


def spec_id(launch: Launch) -> str:
    """The JIT's cache identity (kernel, signature, constexprs, attributes, options), target-independent."""
    options, signature, constexprs, attrs = specialise(launch, TARGETS["sm_90"])
    return json.dumps([launch.kernel.__name__, signature, sorted((str(k), str(v)) for k, v in constexprs.items()),
                       sorted((str(k), str(v)) for k, v in attrs.items()), options.num_warps, options.num_stages])


def sample(launches: list[Launch]) -> list[Launch]:
    """One launch per kernel: its last (N 512, C 100, bf16: the widest tiles)."""
    return list({la.kernel.__name__: la for la in launches}.values())


def run(launches: list[Launch], specs: list[str]) -> tuple[list[dict], list[str]]:
    """Each launch compiled for each target (once per specialisation); its rows number it by its place in ``specs``."""
    rows, failures, done = [], [], {}
    with knobs.compilation.scope(), knobs.nvidia.scope(), tempfile.TemporaryDirectory() as cache:
        knobs.compilation.always_compile = True  # ptxas runs (and reports) for every specialisation
        knobs.cache.dir = cache
        knobs.nvidia.dump_ptxas_log = True
        for la in launches:
            sid = spec_id(la)
            for tname, target in TARGETS.items():
                row = {"kernel": la.kernel.__name__, "launch": la.label, **la.shape, "target": tname, "ctas": la.ctas}
                if (sid, tname) not in done:
                    try:
                        done[sid, tname] = compile_one(la, target)
                    except Exception as e:  # noqa: BLE001 -- a compile error is a result, and fails the run
                        done[sid, tname] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                row.update(done[sid, tname], specialisation=specs.index(sid))
                if "num_warps" in row:
                    row["ceiling"] = ceiling(tname, row["num_warps"], la.ctas)
                rows.append(row)
                failures += check(row)
    return rows, failures


def identity(launches: list[Launch]) -> dict:
    """What a specialisation's registers and spills follow from, besides triton's version (in the results' name): each
    kernel's source with the jitted functions it calls (its JIT cache key) and every specialisation the wrappers
    launch (:func:`spec_id`). Results whose identity is today's hold for today's kernels (tests/test_kernels_aot.py)."""
    return {"kernel_sources": {la.kernel.__name__: la.kernel.cache_key for la in launches},
            "specialisations": list(dict.fromkeys(spec_id(la) for la in launches))}


def check(row: dict) -> list[str]:
    where = f"{row['launch']} N={row['N']} {'C=' + str(row['C']) + ' ' if 'C' in row else ''}{row['dtype']} " \
            f"{row['target']}"
    if "error" in row:
        return [f"{where}: compile error {row['error']}"]
    out = []
    if row["spill_stores"] or row["spill_loads"]:
        out.append(f"{where}: spills {row['spill_stores']} B stores / {row['spill_loads']} B loads")
    if row["registers"] > row["ceiling"]:
        out.append(f"{where}: {row['registers']} registers > ceiling {row['ceiling']} "
                   f"({row['ctas']} CTAs of {row['num_warps']} warps)")
    return out


COLUMNS = [("launch", "launch"), ("N", "N"), ("C", "C"), ("dtype", "dtype"), ("target", "target"),
           ("ctas", "CTAs"), ("num_warps", "warps"), ("registers", "registers"), ("ceiling", "ceiling"),
           ("spill_stores", "spill B"), ("stack_frame", "stack B"), ("shared_bytes", "shared B"),
           ("float_args", "float args"), ("specialisation", "spec #")]


def main(argv=None) -> int:
    import argparse

    from bench import common

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=common.RESULTS, help="folder for the JSON and Markdown results")
    p.add_argument("--smoke", action="store_true", help="every specialisation enumerated, one per kernel compiled (CI: "
                                                        "the rest are the committed results', see identity)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    configs = training_configs()
    found, unrunnable = launched_by_training(configs)
    t_trace = time.perf_counter() - t0
    launches = enumerate_launches(found)
    ident = identity(launches)
    rows, failures = run(sample(launches) if args.smoke else launches, ident["specialisations"])
    elapsed = time.perf_counter() - t0
    head = common.header(torch.device("cpu"))
    head.update(device="none (ahead-of-time compile on a CPU; nothing ran on a GPU)", device_type="none")
    record = {
        "bench": "kernels-aot", "header": head,
        "settings": {"targets": {k: [t.backend, t.arch, t.warp_size] for k, t in TARGETS.items()}, "N": NS, "C": CS,
                     "dtypes": [str(d) for d in DTYPES], "image": IMAGE, "regs_per_sm": REGS_PER_SM,
                     "sms": SMS, "threads_per_sm": THREADS_PER_SM, "ctas_per_sm": CTAS_PER_SM},
        "derived": {"row_loss": [dataclasses.asdict(k) | {"label": k.label()} for k in sorted(found["row_loss"])],
                    "pgd_step": bool(found["pgd_step"]), "random_start_normal": sorted(found["random_start"]),
                    "configs_traced": len(configs), "configs_not_run": unrunnable},
        "smoke": args.smoke, **ident,
        "unique_specialisations": len({r["specialisation"] for r in rows}),
        "compiles": len({(r["specialisation"], r["target"]) for r in rows}),
        "seconds": {"trace": round(t_trace, 1), "total": round(elapsed, 1)},
        "failures": failures, "rows": rows,
    }
    stem = f"kernels-aot-{'smoke-' if args.smoke else ''}triton{triton.__version__}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
    md = ["# Triton kernels compiled ahead of time for sm_80 and sm_90", "",
          f"- device: {head['device']}",
          f"- triton {triton.__version__} (bundled ptxas), torch {head['torch']}, Python {head['python']}",
          f"- fastfair commit {head['commit'][:12]}{' (uncommitted changes)' if head['dirty'] else ''}, "
          f"{head['time_utc']}",
          f"- {len(rows)} launch x target rows, {record['unique_specialisations']} distinct specialisations, "
          f"{record['compiles']} compiles, {elapsed:.0f} s ({t_trace:.0f} s tracing the training steps)",
          "- register ceiling: the grid resident in one wave where the SM allows (see bench/lease/kernels_aot.py)",
          "", "Term sets launched by one training step of the methods and presets (derived, not listed by hand):", ""]
    md += [f"- {k.label()}" for k in sorted(found["row_loss"])]
    md += ["", f"Configs that could not run at this size: {'; '.join(unrunnable) or 'none'}", "",
           "Failures: " + ("none" if not failures else ""), *[f"- {f}" for f in failures], "",
           common.markdown_table(rows, COLUMNS), ""]
    (args.out / f"{stem}.md").write_text("\n".join(md))
    print("\n".join(md[:12]))
    print(*(f"FAIL {f}" for f in failures), sep="\n")
    print("written:", args.out / f"{stem}.json", args.out / f"{stem}.md")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
