"""Per-class measures as pure functions of arrays (methods.md, 'Fairness metrics'): accuracy, CV,
MCD and the summary every evaluation prints, then the papers' diagnostics.

Inputs are numpy arrays or CPU tensors: confusion matrices (rows: true class), softmax
probabilities ``(N, C)``, penultimate features ``(N, D)``, labels ``(N,)``, classifier weights
``(C, D)``. Outputs are float64 numpy arrays or floats. :mod:`fastfair.evaluation.diagnose` runs a model to
produce the inputs; the report draws the outputs.

A class without images in the evaluated data is *absent*: its per-class value (accuracy, a class mean) is
NaN, never 0, and every measure over per-class accuracies (mean, worst class, worst-k, CV, MCD) is taken over
the present classes only; a record stores an absent class's cell as null (:func:`json_values`).
"""
from __future__ import annotations

import re

import numpy as np

from fastfair.errors import UserError


def present(confusion) -> np.ndarray:
    """(C,) bool: the classes with at least one image (a row of the confusion matrix that is not all 0)."""
    return np.asarray(confusion).sum(axis=1) > 0


def per_class_accuracy(confusion) -> np.ndarray:
    """a_c = confusion[c, c] / sum_j confusion[c, j], in percent (rows: true class); NaN for an absent class."""
    m = np.asarray(confusion, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * np.diag(m) / m.sum(axis=1)


def _present(acc) -> np.ndarray:
    """The accuracies of the present classes (NaN marks an absent one); a ValueError when no class has images."""
    a = np.asarray(acc, dtype=np.float64)
    a = a[~np.isnan(a)]
    if not len(a):
        raise ValueError("no class has images: a per-class measure needs at least one present class")
    return a


def cv(acc) -> float:
    """CV = (1/C) sum_c (a_c - mean a)^2 over the C present classes, percent squared (Tian et al. KDD 2021, Sec. 3
    as the sheet defines it)."""
    a = _present(acc)
    return float(((a - a.mean()) ** 2).mean())


def mcd(acc) -> float:
    """MCD = max_c a_c - min_c a_c over the present classes (maximum class-wise discrepancy, Tian et al. KDD 2021)."""
    a = _present(acc)
    return float(a.max() - a.min())


def worst_k_mean(acc, fraction: float) -> float:
    """Mean accuracy of the worst ceil(fraction * C) of the C present classes (Tiny-ImageNet reports the worst 20%)."""
    a = np.sort(_present(acc))
    return float(a[: max(1, int(np.ceil(fraction * len(a))))].mean())


def summary(acc) -> dict[str, float]:
    """Of per-class accuracies (NaN: an absent class, left out): their mean (``avg``), worst class, worst-10% and
    worst-20% mean, CV and MCD."""
    a = np.asarray(acc, dtype=np.float64)
    p = _present(a)
    return {"avg": float(p.mean()), "worst": float(p.min()), "worst_class": int(np.nanargmin(a)),
            "worst10": worst_k_mean(a, 0.1), "worst20": worst_k_mean(a, 0.2), "cv": cv(a), "mcd": mcd(a)}


def json_values(values) -> list:
    """A per-class array (or a class-by-class matrix) as a JSON list: NaN (an absent class) as null, which JSON can
    hold and NaN it cannot."""
    a = np.asarray(values, dtype=np.float64)
    out = a.astype(object)
    out[np.isnan(a)] = None
    return out.tolist()


def json_value(value: float) -> float | None:
    """A measure that can be undefined (a rank correlation of constant values) as JSON: NaN as null."""
    return None if value != value else float(value)


def absent_classes(per_class, classes: list[str]) -> list[str]:
    """The names of the classes whose per-class cell is null or NaN (no images in the evaluated data)."""
    return [name for name, v in zip(classes, per_class) if v is None or v != v]


def absent_note(absent: list[str]) -> str:
    """The line under a per-class table naming the absent classes ("" for none)."""
    if not absent:
        return ""
    return (f"absent from the evaluated images, so left out of the mean, worst class, CV and MCD (shown as -): "
            f"{', '.join(absent)}")


class NonFinite(UserError):
    """NaN or inf logits in an evaluation (a trainer's validation reads it as divergence, a setting to change)."""

    def __init__(self, message: str, nonfinite: int, images: int, attack: str):
        super().__init__(message)
        self.nonfinite, self.images, self.attack = nonfinite, images, attack


def check_finite(nonfinite: int, images: int, attack: str) -> None:
    """Refuse a result of which ``nonfinite`` of ``images`` images got NaN or inf logits: their argmax, and so every
    accuracy, would be a number that means nothing."""
    if nonfinite:
        raise NonFinite(f"the model returned NaN or inf logits for {nonfinite} of {images} images under {attack}; "
                        "no result was written. Check the weights (a diverged or damaged checkpoint) and the model's "
                        "forward pass on these images", nonfinite, images, attack)


# An attack's entry key: how many images had an input gradient holding a NaN or inf at some step of the attack
# (fastfair.attacks.pgd.flag_masked; AutoAttack: at the clean image, fastfair.attacks.autoattack.masked_at_start).
# Flagged, not refused: the number stays an upper bound of the robust accuracy, and the table says beside it that it
# may be far above the model's (docs/reliability.md).
MASKED = "gradient_masked"


def masked_column(name: str, entry: dict) -> str:
    """An attack's column header: its name, and ``[gradient masked: N]`` where N > 0 images stalled it."""
    n = entry.get(MASKED)
    return f"{name} [gradient masked: {n}]" if n else name


def masked_notes(results: dict[str, dict]) -> list[str]:
    """A line under a table per attack whose gradients were masked on some images (none where no attack's were)."""
    return [f"{name}: gradient masked on {e[MASKED]} of {int(np.asarray(e['confusion']).sum())} images: their input "
            "gradient held NaN or inf, which no step can follow, so the attack stalled there and this accuracy may be "
            "far above the model's robustness (obfuscated gradients); check the model's forward for a NaN path "
            "(sqrt, log, division at 0) or attack it without gradients (nattack)"
            for name, e in results.items() if e.get(MASKED) and "confusion" in e]


def share_correct(confusion) -> float:
    """Share of all images classified correctly, trace / sum in percent: the papers' "accuracy" over a test set."""
    m = np.asarray(confusion, dtype=np.float64)
    return float(100.0 * np.trace(m) / max(m.sum(), 1))


def summary_of_confusion(confusion) -> dict[str, float]:
    """:func:`summary` of the per-class accuracies, plus ``overall``, the share of images correct; the two
    averages agree on a balanced split and differ on any other."""
    return {**summary(per_class_accuracy(confusion)), "overall": share_correct(confusion)}


# Tian et al. call the population variance of the per-class accuracies "CV"; it is not a coefficient
# of variation, so every table says what it is (JSON keeps the key ``cv``, in %^2).
CV_LABEL = "CV (variance, %²)"
CV_NOTE = ("CV = (1/C) Σ_c (a_c − mean a)², the variance of the per-class accuracies in %² "
           "(Tian et al. KDD 2021 call it CV; it is not a coefficient of variation)")

# The summary rows every per-class table shows: key, label. Both averages are labelled by what they average.
SUMMARY_ROWS = (("avg", "mean of per-class accuracies"), ("overall", "share of images correct"),
                ("worst", "worst class"), ("cv", CV_LABEL), ("mcd", "MCD (max − min, %)"))


def accuracy_cell(value, digits: int = 2) -> str:
    """A per-class accuracy (or another per-class value) as a table shows it: ``digits`` decimals, '-' for an absent
    class (null or NaN)."""
    return "-" if value is None or value != value else f"{value:.{digits}f}"


def interval_text(interval) -> str:
    """`` [lo, hi]`` (one decimal) after a value; '' where there is none (None)."""
    return "" if interval is None else f" [{interval[0]:.1f}, {interval[1]:.1f}]"


def spread_text(sd) -> str:
    """`` ± sd`` (two decimals) of a mean over seeds; '' for none (one seed, or no seeds aggregated)."""
    return "" if sd is None or sd != sd else f" ± {sd:.2f}"


def class_cell(entry: dict, c: int) -> str:
    """Class ``c``'s accuracy in an entry, with its spread over seeds and its interval where the entry holds them
    (``per_class_sd``, ``per_class_interval``); '-' for an absent class."""
    value = entry["per_class"][c]
    if value is None or value != value:
        return "-"
    sd = entry.get("per_class_sd")
    ci = entry.get("per_class_interval")
    return accuracy_cell(value) + spread_text(sd[c] if sd else None) + interval_text(ci[c] if ci else None)


def summary_cells(results: dict[str, dict], names: list[str], key: str) -> list[str]:
    """One summary row's cells (two decimals), with the spread over seeds and the interval each entry holds
    (``summary_sd``, ``summary_interval``); '-' where a result predates the key (older files lack ``overall``)."""
    cells = []
    for n in names:
        entry = results[n]
        if key not in entry["summary"]:
            cells.append("-")
            continue
        sd, ci = entry.get("summary_sd", {}).get(key), entry.get("summary_interval", {}).get(key)
        cells.append(f"{entry['summary'][key]:.2f}" + spread_text(sd) + interval_text(ci))
    return cells


def latex_label(text: str) -> str:
    """A table label or cell for LaTeX: special characters escaped, ², − and ± as LaTeX writes them."""
    text = re.sub(r"([_&%#])", r"\\\1", text)
    return text.replace("²", "$^2$").replace("−", "$-$").replace("±", "$\\pm$")


HEADLINE_ROWS = ("avg", "overall", "worst")  # the summary rows a table emphasises


def table_rows(results: dict[str, dict], classes: list[str]) -> tuple[list[str], list[tuple[list[str], bool]]]:
    """(header, rows as (cells, emphasised)): classes, then both averages, worst class, CV and MCD; columns:
    attacks (accuracy in percent, each with the interval and spread its entry holds: :func:`class_cell`,
    :func:`summary_cells`). :func:`markdown_table` writes them for files, ``fastfair.display`` for a terminal."""
    names = list(results)
    rows = [([cname, *(class_cell(results[n], c) for n in names)], False) for c, cname in enumerate(classes)]
    rows += [([label, *summary_cells(results, names, key)], key in HEADLINE_ROWS) for key, label in SUMMARY_ROWS]
    return ["class", *(masked_column(n, results[n]) for n in names)], rows


def table_absent(results: dict[str, dict], classes: list[str]) -> list[str]:
    """The classes a table shows as '-' under any of its attacks, in class order."""
    absent = {c for r in results.values() for c in absent_classes(r["per_class"], classes)}
    return [c for c in classes if c in absent]


def markdown_table(results: dict[str, dict], classes: list[str]) -> str:
    """:func:`table_rows` as a Markdown table, emphasised rows in bold; a line under it names absent classes."""
    header, rows = table_rows(results, classes)
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    for (label, *cells), bold in rows:
        lines.append(f"| {f'**{label}**' if bold else label} | " + " | ".join(cells) + " |")
    note = absent_note(table_absent(results, classes))
    return "\n".join(lines + ([f"\n{note}"] if note else []))



def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if hasattr(a, "detach") else np.asarray(a)


def confusion_percent(confusion) -> np.ndarray:
    """Row-normalised confusion in percent: entry (i, j) = share of class i predicted as j; an absent class's row
    is NaN.

    Tian et al. KDD 2021, Fig. 2.
    """
    m = _np(confusion).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 100.0 * m / m.sum(axis=1, keepdims=True)


def misclassified_counts(confusion) -> np.ndarray:
    """Counts with the diagonal (correct predictions) hidden as 0.

    Tian et al. KDD 2021, Fig. 4(a), 'misclassified confusion matrix'.
    """
    m = _np(confusion).astype(np.float64).copy()
    np.fill_diagonal(m, 0)
    return m


def cvc(probs, y, num_classes: int) -> np.ndarray:
    """CVC_k = (1/(N C)) sum_i sum_c (p_c^i - mean_c p^i)^2 over the N images of class k.

    Tian et al. KDD 2021, Def. 5.1.
    """
    p, y = _np(probs).astype(np.float64), _np(y)
    per_image = ((p - p.mean(axis=1, keepdims=True)) ** 2).mean(axis=1)
    return _class_mean(per_image, y, num_classes)


def _labels(y, num_classes: int) -> np.ndarray:
    """Labels as an integer array, each in 0..num_classes-1: one outside would grow a per-class array silently."""
    y = _np(y)
    if len(y) and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels {int(y.min())}..{int(y.max())} lie outside the {num_classes} classes 0.."
                         f"{num_classes - 1}")
    return y.astype(np.int64)


def _class_mean(values: np.ndarray, y, num_classes: int) -> np.ndarray:
    """The mean of ``values`` over each class's images; NaN for an absent class (a mean of nothing)."""
    y = _labels(y, num_classes)
    counts = np.bincount(y, minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.bincount(y, weights=values, minlength=num_classes) / counts


def class_means(features, y, num_classes: int) -> np.ndarray:
    """(C, D) mean penultimate feature of each class; 0 for an absent class (so its cosine with any class is 0)."""
    f, y = _np(features).astype(np.float64), _labels(y, num_classes)
    return np.stack([f[y == k].mean(axis=0) if (y == k).any() else np.zeros(f.shape[1]) for k in range(num_classes)])


def class_mean_cosine(values, y, num_classes: int) -> np.ndarray:
    """(C, C) cos(mu_k, mu_j) of the class means mu_k of ``values`` (features, or logits as Benz et al. 2021,
    Sec. 3.2: "the average logit vector for samples from each ground-truth label"); a class without images
    has mu = 0 and cosine 0 with every class."""
    mu = class_means(values, y, num_classes)
    unit = mu / np.maximum(np.linalg.norm(mu, axis=1, keepdims=True), 1e-12)
    return unit @ unit.T


def inter_class_similarity(features, y, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(similarity, nearest class): max_{j != k} cos(mu_k, mu_j) of class means over the present classes j, and
    the j attaining it (ME-AT paper, Sec. 1, Fig. 2a); NaN for an absent class (:func:`similarity_to_others`)."""
    cos = class_mean_cosine(features, y, num_classes)
    others = similarity_to_others(cos, np.bincount(_labels(y, num_classes), minlength=num_classes) > 0)
    return others["max"], others["nearest"]


def similarity_to_others(cos, present=None) -> dict[str, np.ndarray]:
    """A class's similarity to the other classes, from a (C, C) cosine matrix: ``max`` = max_{j != k} cos_kj
    with ``nearest`` the j attaining it, and ``mean`` = (1/(C'-1)) sum_{j != k} cos_kj (Benz et al. 2021,
    Sec. 3.2 speak of "high cross-class feature similarity with other labels" without saying max or mean).
    Only the ``present`` classes (all by default) count as others, C' of them, since an absent class has no mean to
    be near; an absent class, or one with no other, has NaN (its ``nearest`` is then meaningless)."""
    c = _np(cos).astype(np.float64)
    keep = np.ones(len(c), dtype=bool) if present is None else np.asarray(present, dtype=bool)
    off = ~np.eye(len(c), dtype=bool) & keep[None, :]
    defined = keep & off.any(axis=1)
    masked = np.where(off, c, -np.inf)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = (c * off).sum(axis=1) / off.sum(axis=1)
    return {"max": np.where(defined, masked.max(axis=1), np.nan), "nearest": masked.argmax(axis=1),
            "mean": np.where(defined, mean, np.nan)}


def intra_class_variance(features, y, num_classes: int) -> np.ndarray:
    """Variance of a class's features: (1/D) sum_d Var_i(h_id), population variance per dimension
    averaged over dimensions (ME-AT paper, Sec. 1, Fig. 2b; the paper does not say how dimensions combine); NaN for
    an absent class."""
    f, y = _np(features).astype(np.float64), _labels(y, num_classes)
    return np.array([f[y == k].var(axis=0).mean() if (y == k).any() else np.nan for k in range(num_classes)])


def weight_norms(weight) -> np.ndarray:
    """||w_k||_2 of each class's row of the linear classifier (Tian et al. ICLR 2021, Sec. 3.4)."""
    return np.linalg.norm(_np(weight).astype(np.float64), axis=1)


def rank_correlation(a, b) -> float:
    """Spearman's rank correlation (ties get their average rank) over the classes where both are known (NaN marks
    an absent class); NaN when either input is constant there."""
    from scipy.stats import spearmanr

    a, b = _np(a).astype(np.float64), _np(b).astype(np.float64)
    known = ~(np.isnan(a) | np.isnan(b))
    a, b = a[known], b[known]
    if len(a) < 2:
        return float("nan")
    if np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    return float(spearmanr(a, b).statistic)


def correlation_text(rho) -> str:
    """A rank correlation as text: two decimals, or why there is none (null, or NaN in a record from before)."""
    return "undefined (constant values)" if rho is None or rho != rho else f"{rho:.2f}"


def prediction_entropy(probs) -> np.ndarray:
    """Per-image H(p) = -sum_c p_c log p_c of the predicted distribution (ME-AT paper, Sec. 3.2, Fig. 7)."""
    p = _np(probs).astype(np.float64)
    return -(p * np.log(np.clip(p, 1e-30, None))).sum(axis=1)


def entropy_per_class(probs, y, num_classes: int) -> np.ndarray:
    """Mean prediction entropy over each class's images (ME-AT paper, Fig. 7, split by class)."""
    return _class_mean(prediction_entropy(probs), _np(y), num_classes)


def rho(avg: float, worst: float, base_avg: float, base_worst: float) -> float:
    """rho = (worst - worst_0) / worst_0 + (avg - avg_0) / avg_0: relative worst-class gain plus relative
    average change against a baseline (WAT, Li & Liu 2023; DAFA, Lee et al. 2024, Table 1's rho columns). NaN when the
    baseline's worst class or average is 0 (the relative change is undefined)."""
    if base_worst == 0 or base_avg == 0:
        return float("nan")
    return (worst - base_worst) / base_worst + (avg - base_avg) / base_avg


def critical_class_change(acc, base_acc, critical: int) -> dict[str, float]:
    """What class ``critical`` gained and the other classes lost against a baseline, in points (Benz et al. 2021,
    Sec. 3.3, second scenario): gain = a_k - b_k; loss_j = b_j - a_j over j != k, their mean and their largest
    (``worst_other``: the class losing most)."""
    a, b = np.asarray(acc, dtype=np.float64), np.asarray(base_acc, dtype=np.float64)
    others = np.arange(len(a)) != critical
    loss = (b - a)[others]
    worst = int(np.arange(len(a))[others][loss.argmax()])
    return {"gain": float(a[critical] - b[critical]), "others_mean_loss": float(loss.mean()),
            "others_worst_loss": float(loss.max()), "worst_other": worst}


def tsne(clean_features, adv_features, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """2-D t-SNE (van der Maaten & Hinton 2008) of clean and adversarial features embedded together,
    so both sets share one map: ((N, 2) clean, (N, 2) adversarial)."""
    from sklearn.manifold import TSNE

    a, b = _np(clean_features).astype(np.float32), _np(adv_features).astype(np.float32)
    both = np.concatenate([a, b])
    perplexity = float(min(30.0, max(2.0, (len(both) - 1) / 3)))
    emb = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(both)
    return emb[: len(a)].astype(np.float64), emb[len(a):].astype(np.float64)
