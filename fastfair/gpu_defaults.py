"""The CUDA defaults that follow the GPU measurements (issue 42): whether a compiled CUDA run records CUDA graphs and
whether Inductor issues its launches from a C++ wrapper, decided from the shipped figures
(:mod:`fastfair.gpu_figures`; the runs per GPU of ``--per-gpu auto``: :mod:`fastfair.scaleout.per_gpu`).

- CUDA graphs: on, unless a GPU measured a configuration slower with them than without (beyond ``NOISE``), or failed
  to run one with them (an error, or the run's check of its first graphed steps fell back to the step without), or
  failed the GPU test that compares a graphed step with the same step launched kernel by kernel. Before any GPU
  measured them the default rests on the prediction (the step is host-bound without them).
- Wired into ``train.cudagraphs=auto`` and ``train.cpp_wrapper=auto`` (``build.auto_cudagraphs``,
  ``build.auto_cpp_wrapper``).
- C++ wrapper: off until a GPU measured it faster (beyond ``NOISE``) than the Python wrapper in every configuration
  measured both ways, with CUDA graphs as decided above.

Only each configuration's latest measurement on each GPU counts.
"""
from __future__ import annotations

from dataclasses import dataclass

from fastfair.gpu_figures import Figures, latest

# Two medians of 3 windows within 3% are one speed: in one H200 lease the same host-bound step ran 28% slower in
# one bench than in another (docs/performance.md), so a smaller difference is not evidence either way.
NOISE = 0.03
HEADLINE = ("pgd-at", "resnet18", 128)  # the configuration a prediction is quoted for


@dataclass(frozen=True)
class Decision:
    on: bool
    measured: bool  # False: the default rests on a prediction
    why: str


def _where(row: dict) -> str:
    return f"{row['method']} {row['model']} batch {row['batch']} on an {row['device']} ({row['time_utc'][:10]})"


def _pairs(fig: Figures, switch: str, fixed: dict) -> list[tuple[dict, dict]]:
    """(with, without) ``switch`` for every configuration a GPU measured both ways, the other switch as ``fixed``."""
    rows = [r for r in latest(fig.training, lambda r: (r["device"], r["method"], r["model"], r["batch"], r["loop"],
                                                         r["graphs"], r["cpp_wrapper"]))
            if r["loop"] == "fastfair" and all(r[k] == v for k, v in fixed.items())]
    key = lambda r: (r["device"], r["method"], r["model"], r["batch"])  # noqa: E731
    on = {key(r): r for r in rows if r[switch] is True}
    off = {key(r): r for r in rows if r[switch] is False}
    return [(on[k], off[k]) for k in on if k in off]


def _speeds(on: dict, off: dict) -> str:
    fmt = lambda r: ("failed" if r["images_per_s"] is None else f"{r['images_per_s']:,.0f} img/s"  # noqa: E731
                     + (" after falling back" if r["fell_back"] else ""))
    return f"{fmt(on)} with, {fmt(off)} without"


def cudagraphs(fig: Figures) -> Decision:
    """Whether a compiled CUDA run records its step as CUDA graphs by default."""
    tests = latest(fig.gpu_tests, lambda r: r["device"])
    failed = [t for t in tests if t["graphs_test"] == "failed"]
    if failed:
        return Decision(False, True, f"the GPU test of CUDA graphs failed on an {failed[0]['device']} "
                                     f"({failed[0]['time_utc'][:10]})")
    pairs = _pairs(fig, "graphs", {"cpp_wrapper": False}) or _pairs(fig, "graphs", {"cpp_wrapper": True})
    worse = [(on, off) for on, off in pairs if off["images_per_s"] and (
        on["images_per_s"] is None or on["fell_back"] or on["images_per_s"] < (1 - NOISE) * off["images_per_s"])]
    if worse:
        on, off = worse[0]
        return Decision(False, True, f"measured slower or failing with them: {_where(on)}: {_speeds(on, off)}")
    if pairs:
        on, off = max(pairs, key=lambda p: p[0]["images_per_s"] or 0)
        return Decision(True, True, f"measured faster: {_where(on)}: {_speeds(on, off)}")
    row = next((r for r in fig.predicted if (r["method"], r["model"], r["batch"]) == HEADLINE), None)
    if row is None:
        return Decision(True, False, "predicted (no GPU measured them yet): a step without them is host-bound")
    host_ms = row["launches"] * fig.host_launch_us / 1e3
    return Decision(True, False, f"PREDICTED, no GPU measured them yet: {HEADLINE[0]} {HEADLINE[1]} batch "
                                 f"{HEADLINE[2]} issues {row['launches']:,} launches, {host_ms:.1f} ms of host time "
                                 f"without them, for {1e3 * row['s_gpu']['h200']:.1f} ms of GPU work on an H200")


def cpp_wrapper(fig: Figures, graphs: bool) -> Decision:
    """Whether Inductor's C++ wrapper issues the compiled step's launches by default (``graphs``: the CUDA graphs
    default, since with graphs the launches are replayed and the wrapper's cost is paid only while recording)."""
    pairs = _pairs(fig, "cpp_wrapper", {"graphs": graphs})
    mode = "with" if graphs else "without"
    if not pairs:
        return Decision(False, False, f"not measured on a GPU yet ({mode} CUDA graphs): off until measured faster")
    slower = [(on, off) for on, off in pairs
              if on["images_per_s"] is None or off["images_per_s"] is None
              or on["images_per_s"] <= (1 + NOISE) * off["images_per_s"]]
    if slower:
        on, off = slower[0]
        return Decision(False, True, f"not measured faster {mode} CUDA graphs: {_where(on)}: {_speeds(on, off)}")
    on, off = pairs[0]
    return Decision(True, True, f"measured faster {mode} CUDA graphs in every configuration measured both ways: "
                                f"{_where(on)}: {_speeds(on, off)}")
