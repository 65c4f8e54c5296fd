"""Per-class fairness metrics from a confusion matrix (methods.md, 'Fairness metrics')."""
from __future__ import annotations

import numpy as np


def per_class_accuracy(confusion) -> np.ndarray:
    """a_c = confusion[c, c] / sum_j confusion[c, j], in percent (rows: true class)."""
    m = np.asarray(confusion, dtype=np.float64)
    return 100.0 * np.diag(m) / np.maximum(m.sum(axis=1), 1)


def cv(acc) -> float:
    """CV = (1/C) sum_c (a_c - mean a)^2, percent squared (Tian et al. KDD 2021, Sec. 3 as the sheet defines it)."""
    a = np.asarray(acc, dtype=np.float64)
    return float(((a - a.mean()) ** 2).mean())


def mcd(acc) -> float:
    """MCD = max_c a_c - min_c a_c (maximum class-wise discrepancy, Tian et al. KDD 2021)."""
    a = np.asarray(acc, dtype=np.float64)
    return float(a.max() - a.min())


def worst_k_mean(acc, fraction: float) -> float:
    """Mean accuracy of the worst ceil(fraction * C) classes (Tiny-ImageNet reports the worst 20%)."""
    a = np.sort(np.asarray(acc, dtype=np.float64))
    return float(a[: max(1, int(np.ceil(fraction * len(a))))].mean())


def summary(acc) -> dict[str, float]:
    """Average, worst class, worst-10% and worst-20% mean, CV and MCD of per-class accuracies."""
    a = np.asarray(acc, dtype=np.float64)
    return {"avg": float(a.mean()), "worst": float(a.min()), "worst_class": int(a.argmin()),
            "worst10": worst_k_mean(a, 0.1), "worst20": worst_k_mean(a, 0.2), "cv": cv(a), "mcd": mcd(a)}


def markdown_table(results: dict[str, dict], classes: list[str]) -> str:
    """Rows: classes, then avg / worst / CV / MCD; columns: attacks (accuracy in percent)."""
    names = list(results)
    lines = ["| class | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for c, cname in enumerate(classes):
        lines.append(f"| {cname} | " + " | ".join(f"{results[n]['per_class'][c]:.2f}" for n in names) + " |")
    for key, label in (("avg", "**average**"), ("worst", "**worst class**"), ("cv", "CV"), ("mcd", "MCD")):
        lines.append(f"| {label} | " + " | ".join(f"{results[n]['summary'][key]:.2f}" for n in names) + " |")
    return "\n".join(lines)
