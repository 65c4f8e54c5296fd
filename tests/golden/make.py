"""Make the conformance golden values, or the page that lists the checks.

    python tests/golden/make.py inputs [--data NPZ]       # the fixed inputs (needs the real CIFAR-10 subset)
    python tests/golden/make.py golden --authors DIR [--only NAME ...]
    python tests/golden/make.py doc                       # docs/conformance.md from the checks

``golden`` runs each ``gen_*.py`` beside this file. A generator names the repository it runs
(``REPO = "owner/name"``) and the commit its golden values were made at (``PINNED``); it finds
the checkout as ``DIR/owner+name`` or ``DIR/name``, refuses another commit unless ``--any-commit``,
imports the authors' functions from it (on the CPU: their ``.cuda()`` calls are made no-ops for
the run) and returns ``{golden name: (arrays, meta)}``; this script adds repository and commit to
each ``meta`` and writes ``NAME.npz`` and ``NAME.json``.

A generator that declares ``FLOAT64`` (the list of what it patches so that the authors' code computes in
float64, beside what every float64 run gets: :data:`FLOAT64_RUN`) runs in float64: the fixed inputs and TinyNet
in float64 (``conformance.precision``), torch's default dtype float64, and their ``.float()`` casts made ``.double()``;
``meta`` records ``dtype`` and the patches. One without it runs in float32, as the golden values were first made.
Nothing of the authors' code is copied: it is imported from the checkout at generation time only.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE.parents[1])]  # tests/ (conformance.py), then this checkout's fastfair

import conftest  # noqa: E402,F401  (this checkout's presets and kernels, as under pytest)
import conformance  # noqa: E402

DEFAULT_DATA = HERE.parents[2] / "shared" / "data" / "cifar10-subset.npz"


def make_inputs(data: Path, n: int = 64, seed: int = 0) -> None:
    """TinyNet trained for 8 clean epochs on the subset's training split (so its predictions mean
    something: about two in five right), and ``n`` test images, every class present."""
    with np.load(data) as f:
        x_train, y_train, x_test, y_test = (f[k] for k in ("x_train", "y_train", "x_test", "y_test"))
    torch.manual_seed(seed)
    net = conformance.TinyNet()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    xt, yt = torch.from_numpy(x_train).float() / 255, torch.from_numpy(y_train).long()
    for _ in range(8):
        for idx in torch.randperm(len(xt)).split(128):
            loss = torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert set(y_test[:n].tolist()) == set(range(10)), "the first n test images miss a class"
    arrays = {f"state.{k}": v.detach().numpy() for k, v in net.state_dict().items()}
    arrays.update(x_uint8=x_test[:n], y=y_test[:n].astype(np.int64))
    np.savez_compressed(HERE / "inputs.npz", **arrays)
    net.eval()
    acc = (net(torch.from_numpy(x_test).float() / 255).argmax(1).numpy() == y_test).mean()
    print(f"inputs.npz: TinyNet, test accuracy {acc:.3f} on the subset's {len(y_test)} test images")


def checkout(authors: Path, repo: str) -> Path:
    owner, name = repo.split("/")
    for path in (authors / f"{owner}+{name}", authors / name):
        if path.is_dir():
            return path
    raise SystemExit(f"make.py: error: no checkout of {repo} under {authors} (as {owner}+{name} or {name})")


FLOAT64_RUN = [
    "inputs and TinyNet .double() (conformance.precision(torch.float64))",
    "torch.set_default_dtype(torch.float64): their torch.randn / torch.zeros / torch.tensor draw and allocate in "
    "float64",
    "torch.Tensor.float is torch.Tensor.double: their .float() casts (of values, masks, counts) give float64",
    "torch.tensor / zeros / ones / empty / full with dtype=torch.float (float32) allocate float64",
]
FACTORIES = ("tensor", "zeros", "ones", "empty", "full")


@contextlib.contextmanager
def float64_casts():
    """Their ``.float()`` casts (written for float32 models) give float64, of a float as of a mask or a count, and
    their tensors made with ``dtype=torch.float`` are float64."""
    saved = torch.Tensor.float, {name: getattr(torch, name) for name in FACTORIES}

    def widen(make):
        def made(*args, dtype=None, **kwargs):
            return make(*args, dtype=torch.float64 if dtype == torch.float32 else dtype, **kwargs)
        return made

    torch.Tensor.float = torch.Tensor.double
    for name, make in saved[1].items():
        setattr(torch, name, widen(make))
    try:
        yield
    finally:
        torch.Tensor.float = saved[0]
        for name, make in saved[1].items():
            setattr(torch, name, make)


@contextlib.contextmanager
def cpu_only():
    """The authors' code calls ``.cuda()``; on a CPU machine those calls return the object itself."""
    saved = torch.Tensor.cuda, torch.nn.Module.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.nn.Module.cuda = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.cuda, torch.nn.Module.cuda = saved


def write(name: str, arrays: dict, meta: dict) -> None:
    np.savez_compressed(HERE / f"{name}.npz", **{k: np.asarray(v) for k, v in arrays.items()})
    meta = {**meta, "torch": torch.__version__, "python": platform.python_version()}
    (HERE / f"{name}.json").write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
    print(f"wrote {name}.npz ({len(arrays)} arrays)")


def make_golden(authors: Path, only: list[str], any_commit: bool) -> None:
    gens = sorted(p.stem for p in HERE.glob("gen_*.py"))
    for stem in gens:
        if only and stem.removeprefix("gen_") not in only:
            continue
        gen = importlib.import_module(stem)
        meta = {"repository": gen.REPO} if gen.REPO else {}
        if gen.REPO:
            if authors is None:
                raise SystemExit(f"make.py: error: {stem} runs {gen.REPO}: pass --authors DIR holding its checkout")
            path = checkout(authors, gen.REPO)
            if hasattr(gen, "check_files"):  # files read from an index, no git history: it checks their definitions
                commit = gen.check_files(path)
            else:
                commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                                        text=True, check=True).stdout.strip()
            if commit != gen.PINNED and not any_commit:
                raise SystemExit(f"make.py: error: {path} is at {commit}, {stem} is pinned to {gen.PINNED}; "
                                 f"git -C {path} checkout {gen.PINNED} (or pass --any-commit)")
            meta["commit"] = commit
            sys.path.insert(0, str(path))
        else:
            path = None
        f64 = hasattr(gen, "FLOAT64")
        if f64:
            meta.update(dtype="float64", float64_patches=FLOAT64_RUN + gen.FLOAT64)
        try:
            torch.manual_seed(0)
            np.random.seed(0)
            with cpu_only(), conformance.precision(torch.float64 if f64 else torch.float32), \
                    (float64_casts() if f64 else contextlib.nullcontext()):
                out = gen.generate(path, conformance.inputs())
        finally:
            if path is not None:
                sys.path.remove(str(path))
                # repositories share module names (utils, models): the next one must import its own
                for mod in [m for m, v in sys.modules.items()
                            if str(getattr(v, "__file__", "") or "").startswith(str(path))]:
                    del sys.modules[mod]
        for name, (arrays, m) in out.items():
            write(name, arrays, {**meta, **m})


def make_doc() -> None:
    bad = []
    for name in sorted(conformance.load_cases()):
        full, smoke = conformance.case_checks(name)
        bad += [f"  {c.method} / {c.quantity} ({dtype}): {c.diff:.3g} > {c.tol.value:.3g} ({c.tol.how})"
                for dtype, cs in (("float64", full), ("float32", smoke)) for c in cs if not c.ok]
    if bad:
        raise SystemExit("make.py: error: failing checks; fix them first:\n" + "\n".join(bad))
    on = (f"torch {torch.__version__.split('+')[0]}, {platform.machine()} CPU, "
          f"ATen kernels {torch.backends.cpu.get_cpu_capability()}")
    conformance.DOC.write_text(conformance.render(on))
    print(f"wrote {conformance.DOC}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("inputs")
    s.add_argument("--data", type=Path, default=DEFAULT_DATA)
    s = sub.add_parser("golden")
    s.add_argument("--authors", type=Path, help="folder holding the authors' checkouts (not needed for gen_paper.py)")
    s.add_argument("--only", nargs="*", default=[], help="generator names (gen_NAME.py) to run")
    s.add_argument("--any-commit", action="store_true", help="accept checkouts at other commits")
    sub.add_parser("doc")
    args = p.parse_args()
    torch.set_num_threads(1)  # golden values do not depend on how a machine splits its sums
    if args.what == "inputs":
        make_inputs(args.data)
    elif args.what == "golden":
        sys.path.insert(0, str(HERE))
        make_golden(args.authors, args.only, args.any_commit)
    else:
        make_doc()


if __name__ == "__main__":
    main()
