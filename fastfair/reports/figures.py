"""PNG figures for ``fastfair report`` (matplotlib, Agg backend: no display needed).

Each function takes plain numbers (lists / arrays) and a path, writes one PNG and returns the path.
"""
from __future__ import annotations

import io
from pathlib import Path
from typing import NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.lines  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402

from fastfair.rundir import write_bytes_atomic  # noqa: E402

DPI = 110


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    return save_figure(fig, path)


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` to ``path`` (its format from the suffix) atomically, as every file of a run, and close it."""
    buf = io.BytesIO()
    fig.savefig(buf, format=Path(path).suffix[1:], dpi=DPI, bbox_inches="tight")  # keeps outside legends and titles
    plt.close(fig)
    write_bytes_atomic(buf.getvalue(), path)
    return path


MANY_CLASSES = 20  # past this, bars per class are too thin to read: points, classes sorted (CIFAR-100)
MANY_INDEXED = 100  # past this, a class x class matrix's axes show class indices, not names (ImageNet)
ZERO_GID = "zero-bar"  # the marker drawn where a bar has height 0 (tests find it by this id)


def _title_size(text: str, width_in: float) -> float:
    """A one-line title's font size: it shrinks (to 8 pt at the least) to fit ``width_in`` inches rather than
    wrap onto the plot."""
    return min(11.0, max(8.0, width_in * 72 / (0.58 * max(1, len(text)))))


def _title(ax, text: str, width_in: float, pad: float = 6.0) -> None:
    ax.set_title(text, fontsize=_title_size(text, width_in), pad=pad)


def _legend_beside(ax, handles=None) -> None:
    """The legend right of the axes, level with their top: next to what it explains, never over bars."""
    kw = {"handles": handles} if handles is not None else {}
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **kw)


def _legend_above(ax, handles, width_in: float) -> float:
    """The legend in compact rows just above the axes, so the plot keeps the figure's whole width;
    returns the points the title must clear."""
    longest = max(len(h.get_label()) for h in handles)
    ncol = max(1, min(len(handles), int(width_in * 72 // (4.6 * longest + 28))))
    ax.legend(handles=handles, fontsize=8, loc="lower left", bbox_to_anchor=(0.0, 1.01), ncol=ncol, frameon=False,
              borderaxespad=0.0, handlelength=1.5, columnspacing=1.2)
    return 8.0 + 13.0 * -(-len(handles) // ncol)


def _class_axis(ax, classes: list[str]) -> None:
    slanted = max(map(len, classes)) > 3  # longer names would overlap upright
    many = len(classes) > MANY_CLASSES
    ax.set_xticks(range(len(classes)))
    ax.set_xticklabels(classes, rotation=90 if many else 45 if slanted else 0,
                       ha="center" if many or not slanted else "right", fontsize=6 if many else None,
                       rotation_mode="anchor" if slanted and not many else "default")


ABSENT = "–"  # written where a class has no number (not in the test set, or no model scored it)


def _mean_text(values) -> str:
    """A series' mean over its classes for a legend, over the classes it has: ABSENT when it has none."""
    v = np.asarray(values, dtype=float)
    return f"{float(np.nanmean(v)):.1f}" if np.isfinite(v).any() else ABSENT


def _cell_text(fmt: str, value: float) -> str:
    """A matrix cell's value as written in it: ABSENT for a class with no number rather than "nan"."""
    return fmt.format(value) if np.isfinite(value) else ABSENT


def _zero_marks(ax, xs: np.ndarray, heights: np.ndarray, color, bar_pt: float) -> None:
    """A short thick line at 0 in the bar's colour, with the value, where a bar has height 0: "0 %" told from
    "not drawn", and not read as a 1 % bar."""
    zero = heights < 0.05
    if zero.any():
        ax.plot(xs[zero], np.zeros(zero.sum()), ls="none", marker="_", ms=max(3.0, 0.9 * bar_pt),
                mew=2.0, color=color, gid=ZERO_GID, zorder=3)
        for xz in xs[zero]:
            ax.annotate("0", (xz, 0), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6.5, color=color)


class Interval(NamedTuple):
    """An error bar's two ends per class (an interval's lo and hi, in the values' unit; NaN: none drawn)."""
    lo: list[float]
    hi: list[float]


def per_class_bars(classes: list[str], series: dict[str, tuple[list[float], list[float] | Interval | None]],
                   title: str, path: Path, ylabel: str = "accuracy (%)", percent: bool = True,
                   errors: str = "") -> Path:
    """Grouped bars per class, one bar per series ``name -> (means, error)``, dashed line at each series' mean over
    classes (its legend entry gives the value). ``error``: None, stds (bars at mean +- std) or an :class:`Interval`
    (bars from its lo to its hi), ``errors`` saying what they are in the legend. A bar of height 0 gets a short thick
    line at 0 in its colour, so "0 %" is told from "not drawn". With more than :data:`MANY_CLASSES`
    classes, points replace bars and the classes are sorted by their mean over the series. ``percent``: the
    values are percentages (y from 0 to 100, error bars kept within); else the y scale follows the values."""
    many = len(classes) > MANY_CLASSES
    means = np.asarray([m for m, _ in series.values()], dtype=float)
    order = np.argsort(np.nanmean(means, 0), kind="stable") if many else np.arange(len(classes))
    width_in = 12.0 if many else min(12.0, max(6.4, 0.18 * len(classes) * (len(series) + 1) + 1.5))
    fig, ax = plt.subplots(figsize=(width_in, 4.2))
    width = 0.8 / len(series)
    x = np.arange(len(classes))
    bar_pt = width * (width_in - 1.0) * 72 / max(1, len(classes))  # a bar's width in points, for its 0 marker
    handles = []
    for i, (name, (mean, error)) in enumerate(series.items()):
        mean = np.asarray(mean, dtype=float)[order]
        lo, hi = _error_ends(mean, error, order, percent)
        color = f"C{i % 10}"
        label = f"{name} (mean {_mean_text(mean)})"
        if many:
            ax.plot(x, mean, color=color, lw=0.6, alpha=0.35)  # faint: classes are categories, the dots carry it
            handle, = ax.plot(x, mean, color=color, marker="o", ms=3.5, ls="none", label=label)
            if lo is not None:
                ax.fill_between(x, lo, hi, color=color, alpha=0.2, lw=0)
        else:
            xs = x + (i - (len(series) - 1) / 2) * width
            yerr = None if lo is None else [mean - lo, hi - mean]
            handle = ax.bar(xs, mean, width, yerr=yerr, capsize=2, color=color, label=label,
                            error_kw={"elinewidth": 0.8, "ecolor": "0.25"})
            if percent:  # a 0 % bar is told from "not drawn"; on another scale small values are not zeros
                _zero_marks(ax, xs, mean, color, bar_pt)
        if np.isfinite(mean).any():
            ax.axhline(float(np.nanmean(mean)), color=color, ls="--", lw=1)
        handles.append(handle)
    handles.append(matplotlib.lines.Line2D([], [], color="0.3", ls="--", lw=1, label="mean over classes"))
    if errors:
        handles.append(matplotlib.lines.Line2D([], [], color="0.25", ls="none", marker="|", ms=9, mew=0.8,
                                               label=errors))
    _class_axis(ax, [classes[k] for k in order])
    ax.set_xlim(-0.6, len(classes) - 0.4)
    ax.set_xlabel("class, sorted by the mean over the series" if many else "class")
    if percent:
        ax.set_ylim(-2, 102)  # accuracies; the margin below 0 keeps a 0 % marker clear of the axis line
    ax.set_ylabel(ylabel)
    _title(ax, title, width_in, pad=_legend_above(ax, handles, width_in))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def _error_ends(mean: np.ndarray, error, order: np.ndarray, percent: bool):
    """(lo, hi) of each bar's error bar (in ``order``), or (None, None): an :class:`Interval`'s ends, else mean -+
    std, kept within 0-100 for percentages; a NaN end (no interval) draws none."""
    if error is None:
        return None, None
    if isinstance(error, Interval):
        lo, hi = (np.asarray(v, dtype=float)[order] for v in error)
    else:
        std = np.asarray(error, dtype=float)[order]
        lo, hi = mean - std, mean + std
        if percent:
            lo, hi = np.maximum(lo, 0.0), np.minimum(hi, 100.0)
    none = np.isnan(lo) | np.isnan(hi)
    return np.where(none, mean, lo), np.where(none, mean, hi)


def _blocks(ax, blocks) -> None:
    """Super-class boundaries across a class x class matrix and each super-class's name right of its rows
    (``blocks``: :class:`fastfair.data.superclasses.Block`, along the matrix's ordered classes)."""
    for blk in blocks[1:]:
        for line in (ax.axhline, ax.axvline):
            line(blk.start - 0.5, color="0.35", lw=0.6)
    right = ax.secondary_yaxis("right")
    right.set_yticks([b.start + (b.size - 1) / 2 for b in blocks])
    right.set_yticklabels([b.name.replace("_", " ") for b in blocks], fontsize=7)
    right.tick_params(length=0)


def heatmap(matrix, classes: list[str], title: str, path: Path, fmt: str = "{:.0f}", cbar: str = "",
            blocks=None) -> Path:
    """A class x class matrix (rows: true class, columns: prediction) with the values written in (up to 20
    classes); ``blocks`` (super-classes along the classes' order, CIFAR-100) draws their boundaries and names."""
    m = np.asarray(matrix, dtype=float)
    n = len(classes)
    side = min(0.55 * n + 2.5, 11.0)  # 100 classes: a readable page, not a poster
    fig, ax = plt.subplots(figsize=(side + (1.8 if blocks else 0), min(0.5 * n + 1.8, 10.0) + (0.8 if blocks else 0)))
    im = ax.imshow(np.ma.masked_invalid(m), cmap="Blues")
    ax.set_facecolor("#f2f2f2")  # a class with no number (absent from the test set) reads as blank, not as 0
    if blocks:  # the super-classes' names take the right side: the colour bar goes below
        _blocks(ax, blocks)
        fig.colorbar(im, ax=ax, label=cbar, shrink=0.5, orientation="horizontal", pad=0.1, aspect=40)
    else:
        fig.colorbar(im, ax=ax, label=cbar, shrink=0.8)
    if n <= 20:
        top = np.nanmax(m) if np.isfinite(m).any() else 0
        for i in range(n):
            for j in range(n):
                ax.text(j, i, _cell_text(fmt, m[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if top and m[i, j] > 0.6 * top else "black")
    if n > MANY_INDEXED:  # a thousand names are a blot: indices every few hundred, as Tian et al.'s ImageNet panel
        ticks = list(range(0, n, 200))
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
    else:
        _class_axis(ax, classes)
        ax.set_yticks(range(n))
        ax.set_yticklabels(classes, fontsize=6 if n > MANY_CLASSES else None)
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    _title(ax, title, side - 1.5)
    return _save(fig, path)


def homing_heatmaps(misclassified, homing, classes: list[str], subtitle: str, path: Path,
                    cite: str = "Tian et al. 2021, Fig. 4") -> Path:
    """Tian et al. (KDD 2021, Sec. 6.1) Fig. 4(a) and 4(b) side by side (``cite``: the paper's figure, which the
    ICLR submission numbers Fig. 3); the diagonal and columns without a re-training (NaN in ``homing``) are blank,
    every other cell has its count written in."""
    n = len(classes)
    side = min(0.5 * n + 2.2, 9.0)
    fig, axes = plt.subplots(1, 2, figsize=(2 * side + 0.6, side))
    mis = np.asarray(misclassified, dtype=float)
    off = ~np.eye(n, dtype=bool)
    panels = ((np.where(off, mis, np.nan), "(a) misclassified: attacked images of row class i\nsent to "
               "column class j", "confound class j (attack's prediction)"),
              (np.asarray(homing, dtype=float), "(b) homing: of those, classified i "
               "by the model\nre-trained without class j", "confound class j (removed from training)"))
    top = np.nanmax(mis[off]) if n > 1 and np.any(mis[off]) else 1.0  # one colour scale: (b) reads as a share of (a)
    for ax, (shown, title, xlabel) in zip(axes, panels):
        ax.imshow(np.ma.masked_invalid(shown), cmap="Blues", vmin=0, vmax=top)
        ax.set_facecolor("#f2f2f2")  # blank cells read as "not applicable", not as 0
        if n <= 20:
            for i in range(n):
                for j in range(n):
                    if not np.isnan(shown[i, j]):
                        ax.text(j, i, f"{shown[i, j]:.0f}", ha="center", va="center", fontsize=7,
                                color="white" if shown[i, j] > 0.6 * top else "black")
        _class_axis(ax, classes)
        ax.set_yticks(range(n))
        ax.set_yticklabels(classes)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("true class i")
        ax.set_title(title, fontsize=10)
    fig.suptitle(f"Homing property ({cite}): {subtitle}", fontsize=11)
    return _save(fig, path)


RIGHT, WRONG = "#1a7f37", "#c62828"  # caption colours: prediction right (green) or wrong (red)


def image_grid(columns, column_titles: list[str], row_titles: list[str], title: str, path: Path) -> Path:
    """Images, a column per example and a row per version of it (Tian et al. KDD 2021 Fig. 6: before and after the
    background is replaced); ``columns[j][i] = (uint8 image (C, H, W), [(caption line, right), ...])``, each line
    under its image in green when ``right``, else red, as the paper's prediction boxes."""
    n, rows = len(columns), len(row_titles)
    lines = max(len(cap) for col in columns for _, cap in col)
    fig, axes = plt.subplots(rows, n, figsize=(2.6 * n + 0.4, (2.3 + 0.2 * lines) * rows), squeeze=False)
    for j in range(n):
        for i in range(rows):
            ax = axes[i][j]
            ax.set_xticks([])
            ax.set_yticks([])
            image, caption = columns[j][i]
            hwc = np.asarray(image).transpose(1, 2, 0)
            grey = hwc.shape[2] == 1
            ax.imshow(hwc[..., 0] if grey else hwc, cmap="gray" if grey else None, vmin=0, vmax=255,
                      interpolation="nearest")  # a 32x32 image blurred would hide the mask's edge
            for k, (text, right) in enumerate(caption):
                ax.annotate(text, (0.5, 0), xycoords="axes fraction", xytext=(0, -4 - 11 * k),
                            textcoords="offset points", ha="center", va="top", fontsize=7.5,
                            color=RIGHT if right else WRONG)
            if i == 0:
                ax.set_title(column_titles[j], fontsize=9)
            if j == 0:
                ax.set_ylabel(row_titles[i], fontsize=9)
    fig.suptitle(title, fontsize=_title_size(max(title.splitlines(), key=len), 2.6 * n))
    return _save(fig, path)


def curves(epochs: list[int], lines: dict[str, tuple[list[float], list[float] | None]], title: str, path: Path,
           ylabel: str = "accuracy (%)", selected: tuple[int, str] | None = None, paired: bool = True,
           xlabel: str = "epoch", baselines: dict[str, float] | None = None) -> Path:
    """Lines over epochs, ``name -> (means, stds or None)``, in pairs (average, worst class) of one colour,
    the worst class dashed (``paired=False``: a colour per line, all solid); a shaded band shows +- std over seeds;
    ``selected`` = (epoch, checkpoint name) draws a vertical line at the epoch whose weights were evaluated. A later
    pair (or line) is drawn thinner, so a line hidden beneath it (two worst classes at 0 %) still shows at its edges.
    ``xlabel`` other than epoch: the x values are a hyper-parameter's (CFA Figs. 5(a), 7(a)); ``baselines``:
    ``name -> value``, horizontal grey lines (the method without the hyper-parameter), dash-dot then dotted."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ep = np.asarray(epochs)  # 1-based, as every file fastfair writes numbers them
    for i, (name, (mean, std)) in enumerate(lines.items()):
        mean = np.asarray(mean, dtype=float)
        color = f"C{(i // 2 if paired else i) % 10}"
        ax.plot(ep, mean, color=color, ls="--" if paired and i % 2 else "-",
                lw=1.0 + ((len(lines) - 1 - i) // 2 if paired else 1.6 * (len(lines) - 1 - i) / max(1, len(lines) - 1)),
                marker="o" if len(ep) < 15 else None, ms=3,
                label=name)
        if std is not None:
            ax.fill_between(ep, mean - np.asarray(std), mean + np.asarray(std), color=color, alpha=0.15)
    for i, (name, value) in enumerate((baselines or {}).items()):
        ax.axhline(value, color="0.35", ls=":" if i % 2 else "-.", lw=1.2, label=name)
    if selected is not None:
        ax.axvline(selected[0], color="0.2", ls=":", lw=1.2, label=f"selected: {selected[1]} (epoch {selected[0]})")
    ax.set_xlabel(xlabel)
    if xlabel == "epoch":
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    else:
        ax.set_xticks(ep)
    ax.set_ylabel(ylabel)
    _title(ax, title, 5.6)
    ax.grid(alpha=0.3)
    _legend_beside(ax)
    return _save(fig, path)


def _class_lines(ax, epochs: list[int], v: np.ndarray, classes: list[str], ylabel: str) -> None:
    """One line per class over epochs: up to 10 classes in tab10 colours with a legend; more in faint grey, with
    the classes lowest in the most epochs (at the most five) in colour and named in a legend inside the axes (a
    hundred coloured lines would be a blot)."""
    many = len(classes) > 10
    lowest = np.bincount(v.argmin(axis=1), minlength=len(classes))
    named = [int(k) for k in np.argsort(-lowest, kind="stable")[:5] if lowest[k]] if many else range(len(classes))
    for k in (k for k in range(len(classes)) if many and k not in named):
        ax.plot(epochs, v[:, k], color="0.6", lw=0.5, alpha=0.5)
    marker = "o" if len(epochs) < 15 else None
    for i, k in enumerate(named):  # each line thinner than the one before: tied classes show as stripes, not one
        thick = (len(named) - 1 - i) / max(1, len(named) - 1)
        ax.plot(epochs, v[:, k], color=f"C{i % 10}", lw=1.0 + 2.4 * thick, marker=marker, ms=3.0 + 3.0 * thick,
                label=classes[k])
    if many:
        ax.legend(fontsize=6.5, loc="best", title="lowest most often", title_fontsize=6.5, frameon=False)
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


def per_class_curves(epochs: list[int], values, classes: list[str], title: str, path: Path, ylabel: str,
                     baselines: dict[str, float] | None = None) -> Path:
    """One line per class over epochs (a per-class vector such as CFA's eps_k or beta_k); ``baselines``: ``name ->
    value``, horizontal grey lines (the value every class had before calibration), named in the legend."""
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    _class_lines(ax, epochs, np.asarray(values, dtype=float), classes, ylabel)
    for i, (name, value) in enumerate((baselines or {}).items()):
        ax.axhline(value, color="0.35", ls=":" if i % 2 else "-.", lw=1.2, label=name)
    _title(ax, title, 5.6)
    if len(classes) <= 10:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _save(fig, path)


def per_class_accuracy_curves(epochs: list[int], panels: dict[str, np.ndarray], classes: list[str], title: str,
                              path: Path, selected: int | None = None) -> Path:
    """Per-class validation accuracy over epochs, a panel per evaluation (``name -> (epochs, C)``), side by side
    on one y scale (Benz et al. 2021, Sec. 3.1: does the vulnerable class change during training?);
    ``selected`` marks the evaluated checkpoint's epoch with a dotted line."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels) + 1.4, 3.8), sharey=True, squeeze=False)
    for ax, (name, v) in zip(axes[0], panels.items()):
        v = np.asarray(v, dtype=float)
        _class_lines(ax, epochs, v, classes, "accuracy (%)" if ax is axes[0][0] else "")
        if selected is not None:
            ax.axvline(selected, color="0.2", ls=":", lw=1.2)
        ax.set_title(name, fontsize=10)
    axes[0][0].set_ylim(-2, 102)
    if len(classes) <= 10:
        _legend_beside(axes[0][-1])
    fig.suptitle(title, fontsize=_title_size(title, 4.6 * len(panels)))
    return _save(fig, path)


def class_gap_curves(epochs: list[int], values, classes: list[str], overall, title: str, path: Path,
                     ylabel: str) -> Path:
    """Each class's line over epochs, the overall one dashed black, and the band between the lowest and the highest
    class shaded (Tian et al.'s Fig. 1, ICLR 2021 submission and KDD 2021: the class-wise gap at each epoch); up to
    20 classes."""
    v = np.asarray(values, dtype=float)
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.fill_between(epochs, v.min(axis=1), v.max(axis=1), color="0.85", lw=0, label="gap between classes")
    marker = "o" if len(epochs) < 15 else None
    for k, name in enumerate(classes):
        ax.plot(epochs, v[:, k], color=plt.get_cmap("tab20" if len(classes) > 10 else "tab10")(k), lw=1.0,
                marker=marker, ms=3, label=name)
    ax.plot(epochs, overall, color="black", ls="--", lw=2.0, label="overall")
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylim(-2, 102)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    _title(ax, title, 5.6)
    _legend_beside(ax)
    return _save(fig, path)


def interval_counts(counts: dict[str, list[int]], intervals: list[str], title: str, path: Path,
                    xlabel: str) -> Path:
    """How many classes fall in each interval, a panel per series side by side (Tian et al. ICLR 2021 submission,
    Fig. 6: CIFAR-100's and ImageNet's classes per robustness interval)."""
    fig, axes = plt.subplots(1, len(counts), figsize=(5.2 * len(counts), 3.8), squeeze=False)
    for ax, (name, n) in zip(axes[0], counts.items()):
        ax.bar(range(len(intervals)), n, color="C0")
        for x, c in enumerate(n):
            ax.annotate(str(c), (x, c), xytext=(0, 2), textcoords="offset points", ha="center", fontsize=7)
        _class_axis(ax, intervals)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("number of classes")
        ax.set_title(name, fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=_title_size(title, 5.2 * len(counts)))
    return _save(fig, path)


def discrepancy_grid(classes: list[str], series: dict[str, tuple[list[float], list[float]]], robust_name: str,
                     title: str, path: Path) -> Path:
    """Benz et al. 2021, Figs. 1-2: per-class accuracy (top) and robustness (bottom), as they are (left) and
    with the series' mean over classes subtracted (right); ``series``: name -> (clean, robust) per-class
    accuracies, the series' bars side by side (standard beside adversarial). The right column shares one
    symmetric y scale, so the spread of the series compares at a glance. Past :data:`MANY_CLASSES` classes
    points replace bars and the four panels stand one under the other, each the page's width, so the class
    names stay legible."""
    many = len(classes) > MANY_CLASSES
    width_in = 12.0 if many else min(14.0, max(9.0, 2 * (0.16 * len(classes) * (len(series) + 1) + 1.2)))
    fig, grid = plt.subplots(4 if many else 2, 1 if many else 2, figsize=(width_in, 11.0 if many else 6.6),
                             sharex=True)
    axes = [grid[:2], grid[2:]] if many else grid  # axes[row][column] either way
    x = np.arange(len(classes))
    width = 0.8 / len(series)
    # NaN: a class absent from the evaluated images, no bar; means and spread are of the present classes
    values = {name: [np.asarray(v, dtype=float) for v in pair] for name, pair in series.items()}
    spread = max(float(np.nanmax(np.abs(v - np.nanmean(v)))) for pair in values.values() for v in pair)
    lim = 5.0 * np.ceil(max(spread, 1.0) * 1.08 / 5.0)  # a round symmetric limit above the largest deviation
    rows = (("accuracy", "clean accuracy (%)"), (f"robustness ({robust_name})", f"{robust_name} accuracy (%)"))
    bar_pt = width * (width_in / 2 - 1.0) * 72 / max(1, len(classes))  # a bar's width in points, for its 0 marker
    for r, (what, ylabel) in enumerate(rows):
        for c, centred in enumerate((False, True)):
            ax = axes[r][c]
            for i, (name, pair) in enumerate(values.items()):
                v, color = pair[r] - (np.nanmean(pair[r]) if centred else 0.0), f"C{i % 10}"
                label = f"{name} (mean: clean {_mean_text(pair[0])}, {robust_name} {_mean_text(pair[1])})"
                if many:
                    ax.plot(x, v, color=color, marker="o", ms=2.5, lw=0.5, label=label)
                else:
                    xs = x + (i - (len(values) - 1) / 2) * width
                    ax.bar(xs, v, width, color=color, label=label)
                    if not centred:
                        _zero_marks(ax, xs, v, color, bar_pt)
                if not centred:
                    ax.axhline(float(np.nanmean(pair[r])), color=color, ls="--", lw=1)
            ax.axhline(0, color="0.2", lw=0.8)
            ax.set_ylim((-lim, lim) if centred else (-2, 102))
            ax.set_title(f"{what}, {'mean subtracted' if centred else 'w/o mean subtracted'}", fontsize=10)
            ax.set_ylabel(ylabel if not centred else "difference from the mean (points)")
            ax.grid(axis="y", alpha=0.3)
            if ax is grid.flat[-1] or (r == 1 and not many):
                _class_axis(ax, classes)
            else:
                ax.tick_params(labelbottom=False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    handles.append(matplotlib.lines.Line2D([], [], color="0.3", ls="--", lw=1))
    labels.append("mean over classes")
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.96), ncol=len(labels), fontsize=8,
               frameon=False)
    fig.suptitle(title, fontsize=_title_size(title, width_in), y=0.995)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return save_figure(fig, path)


def similarity_heatmaps(panels: dict[str, np.ndarray], classes: list[str], title: str, path: Path,
                        blocks=None) -> Path:
    """Class x class cosine similarities (Benz et al. 2021, Sec. 3.2: of the mean logit vectors), a panel per
    input (clean, adversarial), on one fixed scale -1..1 so figures of different runs compare; the diagonal
    (1 by definition) is blank, the values are written in up to 10 classes."""
    n = len(classes)
    side = min(0.45 * n + 1.6, 9.0)
    stacked = n > MANY_CLASSES  # CIFAR-100: one matrix under the other, each the page's width
    rows, cols = (len(panels), 1) if stacked else (1, len(panels))
    extra = 2.2 if blocks else 0.6  # the super-classes' names, or the row labels' room
    fig, axes = plt.subplots(rows, cols, figsize=(cols * (side + extra) + 1.2, rows * side + 0.6), squeeze=False,
                             layout="constrained")
    for ax, (name, m) in zip(axes.flat, panels.items()):
        m = np.asarray(m, dtype=float).copy()
        np.fill_diagonal(m, np.nan)
        im = ax.imshow(np.ma.masked_invalid(m), cmap="RdBu_r", vmin=-1, vmax=1)
        ax.set_facecolor("#d9d9d9")
        if n <= 10:
            for i in range(n):
                for j in range(n):
                    if i != j:
                        ax.text(j, i, f"{m[i, j]:.2f}", ha="center", va="center", fontsize=7,
                                color="white" if abs(m[i, j]) > 0.6 else "black")
        _class_axis(ax, classes)
        ax.set_yticks(range(n))
        ax.set_yticklabels(classes, fontsize=6 if n > MANY_CLASSES else None)
        if blocks:
            _blocks(ax, blocks)
        ax.set_title(name, fontsize=10)
    fig.colorbar(im, ax=list(axes.flat), label="cosine similarity", shrink=0.6 if stacked else 0.8)
    fig.suptitle(title, fontsize=_title_size(title, cols * side))
    return save_figure(fig, path)


def scatter_rank(x, y, classes: list[str], xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """One point per class (e.g. classifier weight norm against class robustness), each named; past
    :data:`MANY_CLASSES` only the five lowest and five highest in ``y`` are named (the rest would be a blot). A class
    without a value (an absent class's null) has no point."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)  # null as NaN
    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    ax.scatter(x, y, s=12 if len(classes) > MANY_CLASSES else None)
    shown = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    ranked = shown[np.argsort(y[shown], kind="stable")]
    named = shown if len(classes) <= MANY_CLASSES else [*ranked[:5], *ranked[-5:]]
    at: dict[tuple[float, float], list[str]] = {}  # classes on one point are named together, not over each other
    for k in named:
        at.setdefault((float(x[k]), float(y[k])), []).append(classes[k])
    for xy, names in at.items():
        ax.annotate(", ".join(names), xy, fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    _title(ax, title, 4.6)
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
    fig.suptitle(title, fontsize=_title_size(title, 9.5))
    return _save(fig, path)


def models_by_class(matrix, models: list[str], classes: list[str], averages: list[float], title: str,
                    path: Path) -> Path:
    """Per-class accuracy of several models (rows, best first) as a heatmap with the values written in, each
    row's worst class boxed, and the row's mean beside it."""
    m = np.asarray(matrix, dtype=float)
    rows, n = m.shape
    width = min(0.62 * n + 0.09 * max(len(s) for s in models) + 2.5, 16.0)
    fig, ax = plt.subplots(figsize=(width, 0.42 * rows + 1.9))
    im = ax.imshow(np.ma.masked_invalid(m), cmap="viridis", vmin=0, vmax=100, aspect="auto")
    ax.set_facecolor("#f2f2f2")  # a class a model has no number for reads as blank, not as 0
    fig.colorbar(im, ax=ax, label="accuracy (%)", shrink=0.9, pad=0.09)
    if n <= MANY_CLASSES:
        for i in range(rows):
            for j in range(n):
                ax.text(j, i, _cell_text("{:.0f}", m[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if m[i, j] <= 60 else "black")
    for i in range(rows):
        if not np.isfinite(m[i]).any():
            continue
        j = int(np.nanargmin(m[i]))
        ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=1.8))
    _class_axis(ax, classes)
    ax.set_yticks(range(rows))
    ax.set_yticklabels(models, fontsize=8)
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(rows))
    right.set_yticklabels([_cell_text("{:.1f}", a) for a in averages], fontsize=8)
    right.set_ylabel("mean (%)")
    ax.set_xlabel("class (red box: the model's worst class)")
    _title(ax, title, width - 1.5)
    return _save(fig, path)


def _panel_grid(n: int, ncols: int, width: float, height: float):
    """``n`` panels in rows of ``ncols`` (all in one row when 0), unused cells hidden; the axes in reading order."""
    cols = min(n, ncols or n)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols + 1.6, height * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def class_lines(panels: dict[str, dict], title: str, path: Path, ncols: int = 0) -> Path:
    """Values per class as lines with markers, a panel per measurement (in rows of ``ncols``; 0: one row), each on
    its own y scale (ME paper Figs. 1, 2, 4, 5, 6, 8, 9: class-wise errors, inter-class similarity, intra-class
    variance). ``panels``: panel title -> {``classes``: the x axis in its order, ``series``: name -> one value per
    class along it, ``ylabel``, and optionally ``right``: (name, values, label), one more line in green on a y axis
    of its own at the right (Fig. 5's similarity to the cat in standard training)}."""
    width = max(4.4, 0.42 * max(len(p["classes"]) for p in panels.values()) + 1.6)
    fig, axes = _panel_grid(len(panels), ncols, width, 3.8)
    for ax, (name, panel) in zip(axes, panels.items()):
        x = np.arange(len(panel["classes"]))
        handles = [ax.plot(x, np.asarray(v, dtype=float), color=f"C{i % 10}", marker="o", ms=4, label=s)[0]
                   for i, (s, v) in enumerate(panel["series"].items())]
        if panel.get("right"):
            label, values, ylabel = panel["right"]
            twin = ax.twinx()
            handles += twin.plot(x, np.asarray(values, dtype=float), color="C2", marker="s", ms=4, ls="--",
                                 label=label)
            twin.set_ylabel(ylabel, color="C2")
        _class_axis(ax, panel["classes"])
        ax.set_xlim(-0.5, len(x) - 0.5)
        ax.set_ylabel(panel["ylabel"])
        ax.grid(alpha=0.3)
        if panel.get("right"):  # above the axes: loc="best" avoids the left axis' lines only, not the right one
            ax.set_title(name, fontsize=10, pad=_legend_above(ax, handles, width))
        else:
            ax.legend(handles=handles, fontsize=7.5, loc="best", frameon=False)
            ax.set_title(name, fontsize=10)
    fig.suptitle(title, fontsize=_title_size(title, width * min(len(panels), ncols or len(panels))))
    return _save(fig, path)


def feature_scatter(panels: dict[str, tuple], classes: list[str], title: str, path: Path, ncols: int = 0) -> Path:
    """2-D penultimate features, a point per test image coloured by its class, a panel per model (in rows of
    ``ncols``; 0: one row) (ME paper Figs. 3 and 8, bottom: a ResNet-18 whose penultimate layer outputs 2-D
    features); ``panels``: panel title -> (features (N, 2), labels (N,))."""
    fig, axes = _panel_grid(len(panels), ncols, 4.2, 4.0)
    cmap = plt.get_cmap("tab10")
    for ax, (name, (feats, labels)) in zip(axes, panels.items()):
        feats, labels = np.asarray(feats, dtype=float), np.asarray(labels)
        for k, cname in enumerate(classes):
            sel = labels == k
            ax.scatter(feats[sel, 0], feats[sel, 1], s=4, color=cmap(k % 10), label=cname, alpha=0.7)
        ax.axhline(0, color="0.6", lw=0.5)
        ax.axvline(0, color="0.6", lw=0.5)
        ax.set_aspect("equal", adjustable="datalim")  # the angle between two classes is their similarity: kept true
        ax.set_xlabel("feature 1")
        ax.set_ylabel("feature 2")
        ax.set_title(name, fontsize=10)
    axes[min(len(axes), ncols or len(axes)) - 1].legend(fontsize=7, markerscale=2.5, loc="upper left",
                                                        bbox_to_anchor=(1.0, 1.0), frameon=False)
    fig.suptitle(title, fontsize=_title_size(title, 4.2 * min(len(panels), ncols or len(panels))))
    return _save(fig, path)
