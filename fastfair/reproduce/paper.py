"""What a paper reported for one preset: its ``[paper]`` section, read and checked.

A preset's ``[paper]`` section names its source (a key of :data:`PAPERS`), the table or figure and
the row it reproduces, whether fastfair follows the paper or the authors' code where they differ,
how the paper picked its checkpoint, and the numbers (% accuracy) per evaluation attack::

    [paper]
    source = "cfa"
    table = "1"                      # or figure = "3(a)", or protocol = "s33-remedies" (a study without numbers)
    row = "AT + CFA"
    follows = "paper"                # paper | code | both (they agree)
    selection = "highest sum of average and worst-class robustness"
    seeds = 5                        # optional: the runs behind each number, as the paper says (1 where it
                                     # reports one run, the default); a std_* entry needs seeds >= 2
    also_in = ["2"]                  # optional: other tables printing this row with the same numbers
    init_from = "cfa-t1-trades-paper"  # optional: fine-tunes that preset's run (FRL)
    substitute = "tian-iclr-t2-standard"  # optional: that preset's run is the transfer: attacks' substitute
    pending = ["RST: ..."]           # optional: rows of the table fastfair does not run yet, and why
    robustbench = "Carmon2019Unlabeled"  # optional: the row is that RobustBench model, evaluated, not trained
    paper_selection = {"train.select_split" = "test", "train.val_attack" = "pgd20"}
                                     # optional: the keys that make fastfair pick the checkpoint by the paper's own
                                     # rule where the preset's differs (reproduce --paper-selection runs them)
    released = {url = "...", file = "TRADES/model_cifar_wrn.pt", normalize = "none", sha256 = ""}
                                     # optional: the row is the authors' file (the URL their README gives) placed at
                                     # MODEL_DIR/released/<file>, a [model] architecture, evaluated, not trained;
                                     # sha256 "" where nobody could compute it yet (fastfair prints the placed file's)
    baseline = "cfa-t1-trades-paper"   # optional: the row rho is measured against (DAFA and WAT report it)
    last = {clean = {avg = 83.6, worst = 68.7}}  # optional: the same run's last-epoch model's numbers (CFA's Last)
    clean = {avg = 80.8, worst = 64.6}
    aa = {avg = 50.1, worst = 24.4, std_avg = 0.3}   # per_class = [...], classes = {cat = 7.0}
    pgd20 = {cv = 284.43, mcd = 52.8}                 # the class-wise spread alone (Tian et al. KDD Table 5)
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastfair import config
from fastfair.attacks import autoattack
from fastfair.attacks.names import members, parse_attack
from fastfair.errors import UserError
from fastfair.evaluation.robustbench import DEFAULT_DIR


@dataclass(frozen=True)
class Paper:
    cite: str  # how a target's report names it
    title: str


PAPERS: dict[str, Paper] = {
    "me": Paper("ME-AT/ME-TRADES (ICLR 2022 submission)",
                "Understanding the robustness-accuracy tradeoff by rethinking robust fairness"),
    "cfa": Paper("Wei et al. 2023 (CVPR)", "CFA: Class-wise Calibrated Fair Adversarial Training"),
    "tian-iclr": Paper("Tian et al. (ICLR 2021 submission)",
                       "Intriguing class-wise properties of adversarial training"),
    "dafa": Paper("Lee et al. 2024 (ICLR)", "DAFA: Distance-Aware Fair Adversarial Training"),
    "tian-kdd": Paper("Tian et al. 2021 (KDD)", "Analysis and Applications of Class-wise Robustness in Adversarial "
                                                "Training"),
    # No preset names the next three: their own tables could not be read (docs/methods.md). WAT's and
    # TRIX's numbers enter through DAFA's Table 1 and the TRIX authors' rebuttal tables below.
    "wat": Paper("Li & Liu 2023 (AAAI)", "WAT: Improve the Worst-class Robustness in Adversarial Training"),
    "faal": Paper("Zhang et al. 2024 (CVPR)", "Towards Fairness-Aware Adversarial Learning"),
    "trix": Paper("Medi, Jung & Keuper 2025 (arXiv 2507.07768)",
                  "TRIX- Trading Adversarial Fairness via Mixed Adversarial Training"),
    # A pre-registered study: its sections are protocols fastfair runs (``protocol = "s31-architectures"``), no numbers
    "benz": Paper("Benz et al. 2021 (NeurIPS 2020 pre-registration workshop, PMLR 148)",
                  "Robustness May Be at Odds with Fairness: An Empirical Study on Class-wise Accuracy"),
    "trix-rebuttal": Paper("Medi, Jung & Keuper 2025, the authors' rebuttal (github.com/Fairness-a11y/TRIX, R/R.pdf)",
                           "TRIX- Trading Adversarial Fairness via Mixed Adversarial Training: rebuttal tables"),
}
FOLLOWS = ("paper", "code", "both")
STATS = ("avg", "worst")  # the statistics a number may give; per class below
SPREAD = ("cv", "mcd")  # the class-wise spread of the per-class accuracies (Tian et al. KDD 2021, Sec. 3)
PROTOCOL = re.compile(r"s(\d)(\d)-([a-z0-9]+(?:-[a-z0-9]+)*)")  # s<section><subsection>-<what it varies>


def protocol_title(slug: str) -> str:
    """``s31-architectures`` -> ``Sec. 3.1, architectures``."""
    m = PROTOCOL.fullmatch(slug)
    return f"Sec. {m[1]}.{m[2]}, {m[3].replace('-', ' ')}"


@dataclass(frozen=True)
class Number:
    """One attack's reported accuracies; None where the paper gives none."""

    avg: float | None = None
    worst: float | None = None
    std: dict[str, float] = field(default_factory=dict)  # stat -> the paper's std over its seeds
    per_class: tuple[float, ...] = ()
    classes: dict[str, float] = field(default_factory=dict)  # class name -> accuracy (a figure's text)
    cv: float | None = None  # variance of the per-class accuracies, % squared
    mcd: float | None = None  # best minus worst class accuracy, points
    # the digits after the point the paper prints these numbers with (:func:`decimals`): derived from the values
    decimals: int = field(default=2, compare=False)


def decimals(values: list[float | int]) -> int:
    """The digits after the point a paper prints a table's entry with: the most any of ``values`` (its mean, worst
    class and their stds, as the preset writes them) shows; an integer shows none. A paper prints an entry at one
    precision, and a trailing 0 that the TOML float drops (49.80 reads as 49.8) shows in the entry's other values
    (21.31); tests/test_verdict_stats.py checks every preset against its text."""
    return max((0 if isinstance(v, int) else len(repr(float(v)).partition(".")[2]) for v in values), default=0)


@dataclass(frozen=True)
class Released:
    """An authors' released model file: where they publish it, where fastfair reads it (under ``--model-dir``'s
    ``released/``), the input scaling it expects (``fastfair eval --normalize``), and its SHA-256 ('' unknown)."""

    url: str
    file: str
    normalize: str
    sha256: str = ""

    def path(self, model_dir: str | None) -> Path:
        """``MODEL_DIR/released/<file>`` (RobustBench's default folder where no ``--model-dir`` is given)."""
        return Path(model_dir or DEFAULT_DIR) / "released" / self.file

    def place(self, model_dir: str | None) -> str:
        """How to put the file where fastfair reads it."""
        return f"download {self.url} (the authors' file) and save it as {self.path(model_dir).resolve()}"


SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PaperRow:
    preset: str
    source: str
    table: str  # "" for a figure
    figure: str
    row: str
    follows: str
    selection: str
    numbers: dict[str, Number]  # attack name (as fastfair eval names it) -> Number
    also_in: tuple[str, ...] = ()
    init_from: str = ""
    baseline: str = ""
    substitute: str = ""
    pending: tuple[str, ...] = ()
    robustbench: str = ""  # the row is this released model (RobustBench's CIFAR-10 Linf name), evaluated only
    protocol: str = ""  # a study's section the row belongs to (no numbers: the study reports what it measures)
    released: Released | None = None  # the row is this authors' model file, evaluated only
    last: dict[str, Number] = field(default_factory=dict)  # the numbers of the run's last-epoch model, where printed
    # config keys -> values that pick the checkpoint by the paper's own rule (reproduce --paper-selection)
    paper_selection: dict[str, Any] = field(default_factory=dict)
    seeds: int = 1  # the runs behind each of the paper's numbers (its mean and std are over them)

    @property
    def evaluated(self) -> bool:
        """The row is a released model, evaluated and not trained (RobustBench's, or the authors' own file)."""
        return bool(self.robustbench or self.released)

    @property
    def depends_on(self) -> tuple[str, ...]:
        """The rows whose runs this row's runs need (fine-tuned from, or attacked through)."""
        return tuple(n for n in (self.init_from, self.substitute) if n)

    @property
    def where(self) -> str:
        if self.protocol:
            return protocol_title(self.protocol)
        return f"Table {self.table}" if self.table else f"Fig. {self.figure}"


def _percent(preset: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100 or math.isnan(value):
        raise UserError(f"preset {preset}: [paper] {key} must be an accuracy in % (0 to 100); got {value!r}")
    return float(value)


def _number(preset: str, attack: str, spec: Any, within: str = "") -> Number:
    """One attack's numbers checked; ``within``: the table holding them (``last.``), as messages name it."""
    where = f"[paper] {within}{attack}"
    if not isinstance(spec, dict):
        raise UserError(f"preset {preset}: {where} must be a table such as {{avg = 50.1, worst = 24.4}}")
    known = {*STATS, *(f"std_{s}" for s in STATS), "per_class", "classes", *SPREAD}
    unknown = sorted(set(spec) - known)
    if unknown:
        raise UserError(f"preset {preset}: {where} has unknown entries {unknown}; it takes {', '.join(sorted(known))}")
    if attack != autoattack.NAME:  # the name must be one fastfair eval runs
        for name in members(attack):
            parse_attack(name)
    per_class = tuple(_percent(preset, f"{attack}.per_class", v) for v in spec.get("per_class", []))
    classes = {str(k): _percent(preset, f"{attack}.classes.{k}", v) for k, v in spec.get("classes", {}).items()}
    cv = spec.get("cv")
    if cv is not None and (isinstance(cv, bool) or not isinstance(cv, (int, float)) or not 0 <= cv <= 2500):
        raise UserError(f"preset {preset}: [paper] {attack}.cv must be a variance of accuracies in % squared "
                        f"(0 to 2500); got {cv!r}")
    std = {s: _percent(preset, f"{attack}.std_{s}", spec[f"std_{s}"]) for s in STATS if f"std_{s}" in spec}
    printed = [spec[s] for s in STATS if s in spec] + list(std.values())
    return Number(avg=_percent(preset, f"{attack}.avg", spec["avg"]) if "avg" in spec else None,
                  worst=_percent(preset, f"{attack}.worst", spec["worst"]) if "worst" in spec else None,
                  std=std, per_class=per_class, classes=classes, cv=None if cv is None else float(cv),
                  mcd=_percent(preset, f"{attack}.mcd", spec["mcd"]) if "mcd" in spec else None,
                  decimals=decimals(printed))


FIELDS = {"source", "table", "figure", "row", "follows", "selection", "also_in", "init_from", "baseline",
          "substitute", "pending", "robustbench", "protocol", "released", "paper_selection", "last", "seeds"}


def _released(preset: str, spec: Any) -> Released | None:
    if spec is None:
        return None
    if not isinstance(spec, dict) or set(spec) - {"url", "file", "normalize", "sha256"} or \
            not all(isinstance(spec.get(k), str) and spec[k] for k in ("url", "file", "normalize")):
        raise UserError(f"preset {preset}: [paper] released must be a table {{url = \"...\", file = \"...\", "
                        f"normalize = \"none\", sha256 = \"\"}} (the URL the authors give, the file's place under "
                        f"--model-dir's released/, its input scaling, its SHA-256 or \"\" when unknown)")
    sha = spec.get("sha256", "")
    if sha and not SHA256.fullmatch(sha):
        raise UserError(f"preset {preset}: [paper] released.sha256 must be 64 hex digits, or \"\" while unknown; "
                        f"got {sha!r}")
    return Released(spec["url"], spec["file"], spec["normalize"], sha)


def load(preset: str) -> PaperRow | None:
    """The preset's ``[paper]`` section checked, or None when it has none (the demo)."""
    raw = config.read_paper(preset)
    if not raw:
        return None
    text = {k: v for k, v in raw.items() if k in FIELDS}
    numbers = {k: v for k, v in raw.items() if k not in FIELDS}
    if text.get("source") not in PAPERS:
        raise UserError(f"preset {preset}: [paper] source must be one of {', '.join(PAPERS)}; got "
                        f"{text.get('source')!r}")
    if sum(k in text for k in ("table", "figure", "protocol")) != 1:
        raise UserError(f"preset {preset}: [paper] names one of table = \"N\", figure = \"N\" or protocol = "
                        "\"sNN-what\" (a section of a study without numbers)")
    protocol = str(text.get("protocol", ""))
    if protocol and not PROTOCOL.fullmatch(protocol):
        raise UserError(f"preset {preset}: [paper] protocol must name the study's section and what it varies, as "
                        f"s31-architectures (Sec. 3.1); got {protocol!r}")
    if protocol and numbers:
        raise UserError(f"preset {preset}: [paper] protocol = {protocol!r} is a study without numbers, so it records "
                        f"none; remove {', '.join(numbers)}")
    if text.get("follows") not in FOLLOWS:
        raise UserError(f"preset {preset}: [paper] follows must be one of {', '.join(FOLLOWS)}")
    if text.get("robustbench") and text.get("released"):
        raise UserError(f"preset {preset}: [paper] names one released model: robustbench or released, not both")
    last = text.get("last", {})
    if not isinstance(last, dict):
        raise UserError(f"preset {preset}: [paper] last holds the last epoch's numbers per attack, such as "
                        "{clean = {avg = 83.6, worst = 68.7}}")
    chosen = text.get("paper_selection", {})
    if not isinstance(chosen, dict) or not all(str(k).startswith("train.") for k in chosen):
        raise UserError(f"preset {preset}: [paper] paper_selection must be a table of train.* keys, such as "
                        "{\"train.select_split\" = \"test\", \"train.val_attack\" = \"pgd20\"}")
    for key in ("row", "selection"):
        if not isinstance(text.get(key), str) or not text[key]:
            raise UserError(f"preset {preset}: [paper] {key} must be a non-empty string")
    seeds = text.get("seeds", 1)
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise UserError(f"preset {preset}: [paper] seeds must be the number of runs behind the paper's numbers, an "
                        f"integer of at least 1 (1 where it reports one run); got {seeds!r}")
    numbers = {a: _number(preset, a, s) for a, s in numbers.items()}
    last = {a: _number(preset, a, n, "last.") for a, n in last.items()}
    with_std = [f"{w}{a}" for w, table in (("", numbers), ("last.", last)) for a, n in table.items() if n.std]
    if with_std and seeds < 2:
        raise UserError(f"preset {preset}: [paper] {', '.join(with_std)} give a std over seeds, so the paper ran "
                        f"several: set [paper] seeds = N (its number of runs, at least 2)")
    return PaperRow(preset=preset, source=text["source"], table=str(text.get("table", "")),
                    figure=str(text.get("figure", "")), row=text["row"], follows=text["follows"],
                    selection=text["selection"],
                    numbers=numbers, seeds=seeds,
                    also_in=tuple(str(t) for t in text.get("also_in", [])), init_from=text.get("init_from", ""),
                    baseline=text.get("baseline", ""), substitute=text.get("substitute", ""),
                    pending=tuple(str(t) for t in text.get("pending", [])), robustbench=text.get("robustbench", ""),
                    protocol=protocol, released=_released(preset, text.get("released")), paper_selection=dict(chosen),
                    last=last)
