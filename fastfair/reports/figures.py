"""PNG figures for ``fastfair report`` (matplotlib, Agg backend: no display needed).

Each function takes plain numbers (lists / arrays) and a path, writes one PNG and returns the path.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

DPI = 110


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")  # keeps legends placed outside the axes and long titles
    plt.close(fig)
    return path


def _title(text: str) -> str:
    return textwrap.fill(text, 70)


def _legend_beside(ax, handles=None) -> None:
    """The legend right of the axes, level with their top: next to what it explains, never over bars."""
    kw = {"handles": handles} if handles is not None else {}
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kw)


def _class_axis(ax, classes: list[str]) -> None:
    slanted = max(map(len, classes)) > 3  # longer names would overlap upright
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes, rotation=45 if slanted else 0, ha="right" if slanted else "center")


def per_class_bars(classes: list[str], series: dict[str, tuple[list[float], list[float] | None]], title: str,
                   path: Path, ylabel: str = "accuracy (%)") -> Path:
    """Grouped bars per class, one bar per series ``name -> (means, stds or None)``, dashed line at each
    series' mean over classes (its legend entry gives the value)."""
    fig, ax = plt.subplots(figsize=(max(7.0, 0.25 * len(classes) * (1 + len(series)) + 2.0), 3.8))
    width = 0.8 / len(series)
    x = np.arange(len(classes))
    handles = []
    for i, (name, (mean, std)) in enumerate(series.items()):
        avg = float(np.mean(mean))
        bars = ax.bar(x + (i - (len(series) - 1) / 2) * width, mean, width, yerr=std, capsize=2,
                      label=f"{name} (mean {avg:.1f})")
        ax.axhline(avg, color=bars.patches[0].get_facecolor(), ls="--", lw=1)
        handles.append(bars)
    handles.append(matplotlib.lines.Line2D([], [], color="0.3", ls="--", lw=1, label="mean over classes"))
    _class_axis(ax, classes)
    ax.set_xlabel("class")
    ax.set_ylim(0, 102)  # accuracies: a +- std bar past 0 or 100 is cut at the axis
    ax.set_ylabel(ylabel)
    ax.set_title(_title(title))
    _legend_beside(ax, handles)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def heatmap(matrix, classes: list[str], title: str, path: Path, fmt: str = "{:.0f}", cbar: str = "") -> Path:
    """A class x class matrix (rows: true class, columns: prediction) with the values written in."""
    m = np.asarray(matrix, dtype=float)
    n = len(classes)
    fig, ax = plt.subplots(figsize=(0.55 * n + 2.5, 0.5 * n + 1.8))
    im = ax.imshow(m, cmap="Blues")
    fig.colorbar(im, ax=ax, label=cbar, shrink=0.8)
    if n <= 20:
        top = m.max() if m.size else 0
        for i in range(n):
            for j in range(n):
                ax.text(j, i, fmt.format(m[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if top and m[i, j] > 0.6 * top else "black")
    _class_axis(ax, classes)
    ax.set_yticks(range(n))
    ax.set_yticklabels(classes)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    ax.set_title(_title(title))
    return _save(fig, path)


def curves(epochs: list[int], lines: dict[str, tuple[list[float], list[float] | None]], title: str, path: Path,
           ylabel: str = "accuracy (%)", selected: tuple[int, str] | None = None) -> Path:
    """Lines over epochs, ``name -> (means, stds or None)``; a shaded band shows +- std over seeds;
    ``selected`` = (epoch, checkpoint name) draws a vertical line at the epoch whose weights were evaluated."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ep = np.asarray(epochs)  # 1-based, as every file fastfair writes numbers them
    for name, (mean, std) in lines.items():
        mean = np.asarray(mean, dtype=float)
        ax.plot(ep, mean, marker="o" if len(ep) < 15 else None, ms=3, label=name)
        if std is not None:
            ax.fill_between(ep, mean - np.asarray(std), mean + np.asarray(std), alpha=0.2)
    if selected is not None:
        ax.axvline(selected[0], color="0.2", ls=":", lw=1.2, label=f"selected: {selected[1]} (epoch {selected[0]})")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(_title(title))
    ax.grid(alpha=0.3)
    _legend_beside(ax)
    return _save(fig, path)


def per_class_curves(epochs: list[int], values, classes: list[str], title: str, path: Path, ylabel: str) -> Path:
    """One line per class over epochs (a per-class vector such as CFA's eps_k or beta_k)."""
    v = np.asarray(values, dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    cmap = plt.get_cmap("tab10" if len(classes) <= 10 else "viridis")
    for k, name in enumerate(classes):
        ax.plot(epochs, v[:, k], color=cmap(k / max(1, len(classes) - 1)) if len(classes) > 10
                else cmap(k), label=name if len(classes) <= 10 else None)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(_title(title))
    ax.grid(alpha=0.3)
    if len(classes) <= 10:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def scatter_rank(x, y, classes: list[str], xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """One labelled point per class (e.g. classifier weight norm against class robustness)."""
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    ax.scatter(x, y)
    for k, name in enumerate(classes[:50]):
        ax.annotate(name, (x[k], y[k]), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(_title(title), fontsize=10)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def tsne(clean, adv, labels, classes: list[str], title: str, path: Path, attack: str = "") -> Path:
    """t-SNE of penultimate features: clean (left) and adversarial (right) on one shared embedding."""
    clean, adv, labels = np.asarray(clean), np.asarray(adv), np.asarray(labels)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharex=True, sharey=True)
    cmap = plt.get_cmap("tab10" if len(classes) <= 10 else "viridis")
    adv_name = f"adversarial ({attack})" if attack else "adversarial"
    for ax, pts, name in ((axes[0], clean, "clean"), (axes[1], adv, adv_name)):
        for k, cname in enumerate(classes):
            sel = labels == k
            if sel.any():
                ax.scatter(pts[sel, 0], pts[sel, 1], s=6, color=cmap(k if len(classes) <= 10 else k / len(classes)),
                           label=cname)
        ax.set_title(f"{name}")
        ax.set_xticks([])
        ax.set_yticks([])
    if len(classes) <= 10:
        axes[1].legend(fontsize=7, markerscale=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(_title(title))
    return _save(fig, path)
