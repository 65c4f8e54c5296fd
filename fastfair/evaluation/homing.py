"""The homing property (Tian et al., KDD 2021, Sec. 6.1, Definition 6.1, Fig. 4).

A run trained on every class is attacked on the test set; each test image of class i that the attack sends to
another class j (its confound class, Definition 3.2) is counted in the misclassified confusion matrix (Fig. 4(a):
counts, diagonal hidden). The same image *homes* when the run re-trained without class j's training images
(``data.drop_classes = [j]``, head and test set unchanged) classifies it as i under the same attack, run against
the re-trained model: the homing confusion matrix (Fig. 4(b)) counts those, cell (i, j) out of cell (i, j) of (a).

``fastfair homing GRID_DIR`` reads the runs of ``configs/grids/tian-kdd-fig4-homing.toml`` (or any run
directories: one with no dropped class, the others each without one class) and writes ``homing.md``,
``homing.json`` and ``homing.png``. Every model is attacked on the same test images with the same seeds
(:mod:`fastfair.evaluation.seeds`, batch by batch as ``fastfair eval``), so the per-image predictions line up.
Each model's predictions are kept in ``RUN/eval/homing/<checkpoint>-test-<attack>.json`` with the fingerprints of
its weights, the test images and the attack settings (:func:`fastfair.evaluation.per_class.fingerprint`); a later
call reuses them only when all three agree, so adding a run to the grid attacks that run alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fastfair import build, config
from fastfair.attacks import names, parse_attack, per_class
from fastfair.errors import UserError
from fastfair.evaluation import seeds
from fastfair.evaluation.per_class import fingerprint, settings_of
from fastfair.progress import Progress
from fastfair.reports import figures
from fastfair.rundir import RunDir, Unchecked, read_json, write_json_atomic, write_text_atomic


@torch.no_grad()
def _softmax(model, x) -> torch.Tensor:
    return model(x).softmax(1)


def probabilities(model, loader, attack_name: str, *, eps, alpha, num_classes: int, cw_kappa: float = 50.0,
                  seed: int = 0, clip_start: bool = True, progress=None) -> np.ndarray:
    """Each image's softmax output (N, C) after ``attack_name``; batch ``i`` is attacked under
    ``seeds.derive(seed, attack_name, i)``, as ``fastfair eval`` attacks it."""
    model.eval()
    dev = next(model.parameters()).device
    eps_c, alpha_c = per_class(eps, num_classes, dev, "eval.eps"), per_class(alpha, num_classes, dev, "eval.alpha")
    attack = parse_attack(attack_name, cw_kappa, clip_start)
    out = []
    for i, (x, y) in enumerate(loader):
        with seeds.seeded(seed, attack.seed_name, i, device=dev):
            out.append(_softmax(model, attack(model, x, y, eps_c, alpha_c)).cpu())
        if progress is not None:
            progress()
    return torch.cat(out).numpy()


def predictions(model, loader, attack_name: str, **kw) -> np.ndarray:
    """Each image's predicted class after ``attack_name`` (:func:`probabilities`' arguments)."""
    return probabilities(model, loader, attack_name, **kw).argmax(1)


def misclassified_matrix(y: np.ndarray, pred: np.ndarray, num_classes: int) -> np.ndarray:
    """Fig. 4(a) of Tian et al. (KDD 2021, Sec. 6.1): images of class i (row) predicted as j (column), diagonal 0."""
    m = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(m, (y, pred), 1)
    np.fill_diagonal(m, 0)
    return m


def homing_matrix(y: np.ndarray, base_pred: np.ndarray, without: dict[int, np.ndarray],
                  num_classes: int) -> np.ndarray:
    """Fig. 4(b) of Tian et al. (KDD 2021, Sec. 6.1): cell (i, j) counts images of class i the base model's attack sent
    to j that the model re-trained without j classifies as i under attack; NaN where no run dropped j, and on the
    diagonal."""
    h = np.full((num_classes, num_classes), np.nan)
    for j, pred in without.items():
        sent = (base_pred == j) & (y != j)
        h[:, j] = np.bincount(y[sent & (pred == y)], minlength=num_classes)
        h[j, j] = np.nan
    return h


@dataclass(frozen=True)
class Member:
    """A run of the homing experiment: its directory, the checkpoint evaluated, the classes it was trained without."""

    run: Path
    checkpoint: Path
    dropped: tuple[int, ...]


def _runs(targets: list[str]) -> list[Path]:
    """Run directories: each target itself when it is a run, else its sub-folders that are (a grid's folder)."""
    runs = []
    for target in targets:
        path = Path(target)
        if not path.is_dir():
            raise UserError(f"{target} is not a folder; fastfair homing takes a grid folder (fastfair grid "
                            "tian-kdd-fig4-homing) or run folders")
        if (path / "config.toml").is_file():
            runs.append(path)
            continue
        inside = sorted(p for p in path.iterdir() if (p / "config.toml").is_file())
        if not inside:
            raise UserError(f"{target} holds no run (no config.toml in it or its sub-folders)")
        runs += inside
    return runs


def members(targets: list[str], checkpoint: str = "auto") -> tuple[Member, dict[int, Member]]:
    """(the run on every class, {j: the run without class j}); a set that cannot make Fig. 4 is a UserError."""
    base, without = [], {}
    for path in _runs(targets):
        run = RunDir(path)
        cfg = config.load_run(run.path)
        ck = (run.selected_checkpoint(cfg.train.select) if checkpoint == "auto"
              else run.existing_checkpoint(checkpoint))
        if not ck.is_file():
            raise UserError(f"{path} has no checkpoint {ck.name}; train it first (fastfair grid resumes it)")
        m = Member(path, ck, tuple(cfg.data.drop_classes))
        if not m.dropped:
            base.append(m)
        elif len(m.dropped) > 1:
            raise UserError(f"{path} was trained without classes {list(m.dropped)}; the homing matrix needs one run "
                            "without each single confound class")
        elif m.dropped[0] in without:
            raise UserError(f"{without[m.dropped[0]].run} and {path} were both trained without class "
                            f"{m.dropped[0]}; pass one of them")
        else:
            without[m.dropped[0]] = m
    if len(base) != 1:
        got = ", ".join(str(m.run) for m in base) or "none"
        raise UserError(f"the homing matrix needs exactly one run trained on every class (data.drop_classes "
                        f"empty); got {got}")
    if not without:
        raise UserError("no run was trained without a class (data.drop_classes); fastfair grid "
                        "tian-kdd-fig4-homing trains one without each class")
    return base[0], without


def _settings(cfg) -> dict:
    return {"eps": cfg.eval.eps, "alpha": cfg.eval.alpha, "cw_kappa": cfg.eval.cw_kappa,
            "clip_start": cfg.eval.clip_start}


def _cache_file(m: Member, attack: str) -> Path:
    return m.run / "eval" / "homing" / f"{m.checkpoint.stem}-test-{attack}.json"


def _cached(path: Path, fp: dict) -> np.ndarray | None:
    """The predictions stored at ``path`` when they were made under the fingerprint ``fp``, else None (also for a
    file without a checksum, an older fastfair's: measured again rather than signed into homing.json)."""
    if not path.is_file():
        return None
    stored = read_json(path)
    fresh = stored.get("fingerprint") == fp and not isinstance(stored, Unchecked)
    return np.asarray(stored["predictions"]) if fresh else None


def homing(targets: list[str], *, attack: str = "pgd20", out: str | None = None, checkpoint: str = "auto",
           device: str = "auto", batch_size: int | None = None, data_dir: str | None = None,
           seed: int | None = None, quiet: bool = False) -> Path:
    """Attack the base run and each run without one class on the test set; write Fig. 4(a) and 4(b) of Tian et al.
    (KDD 2021, Sec. 6.1) as ``homing.md``, ``homing.json`` and ``homing.png`` under ``out``; returns the .md path."""
    if not names.parses(attack):  # AutoAttack's backends give no per-image prediction of their last sub-attack
        raise names.unknown_attack(attack, autoattack=False)
    if names.is_transfer(attack) or parse_attack(attack).per_class:
        raise UserError(f"--attack {attack}: the homing matrices attack every test image of every model with a "
                        "white-box attack such as pgd20, cw20, fgsm or tpgd20@t0.1; transfer: and NAME/N attacks "
                        "are not offered")
    base, without = members(targets, checkpoint)
    # one grid folder: its homing/ beside the runs; run folders named one by one: inside the base run
    grid = len(targets) == 1 and not (Path(targets[0]) / "config.toml").is_file()
    folder = Path(out) if out else (Path(targets[0]) if grid else base.run) / "homing"
    preds, first = {}, None
    prog = Progress(enabled=not quiet)
    for m in [base, *(without[j] for j in sorted(without))]:
        _, cfg, dev, model, bundle, data = build.from_checkpoint(m.checkpoint, split="test", device_name=device,
                                                                 data_dir=data_dir, batch_size=batch_size)
        if first is None:
            run_seed = cfg.eval.seed if seed is None else seed
        loader = build.eval_loader(cfg, data, dev, build.channels_last(cfg, dev))
        # the batch size too: each batch's random starts come from its index (seeds.derive)
        settings = {**settings_of(eps=cfg.eval.eps, alpha=cfg.eval.alpha, cw_kappa=cfg.eval.cw_kappa, amp=False,
                                  seed=run_seed, clip_start=cfg.eval.clip_start),
                    "attack": attack, "batch_size": loader.batch_size}
        fp = fingerprint(model, data, settings)
        this = {"classes": bundle.classes, "test data": fp["data"], "eval settings": _settings(cfg)}
        first = first or this
        for what, value in this.items():
            if value != first[what]:
                raise UserError(f"{m.run} and {base.run} differ in their {what}; the homing matrix compares the "
                                "same test images under the same attack")
        cache = _cache_file(m, attack)
        preds[m.dropped] = _cached(cache, fp)
        if preds[m.dropped] is None:
            with prog.task(f"{attack} on {m.run.name}", len(loader)) as advance:
                preds[m.dropped] = predictions(model, loader, attack, num_classes=bundle.num_classes, seed=run_seed,
                                               cw_kappa=cfg.eval.cw_kappa, clip_start=cfg.eval.clip_start,
                                               progress=advance, eps=cfg.eval.eps, alpha=cfg.eval.alpha)
            cache.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic({"checkpoint": str(m.checkpoint), **settings, "fingerprint": fp,
                               "predictions": preds[m.dropped].tolist()}, cache, indent=None)
        y = data[1].numpy()
    classes, c = first["classes"], len(first["classes"])
    mis = misclassified_matrix(y, preds[()], c)
    home = homing_matrix(y, preds[()], {j: preds[(j,)] for j in without}, c)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"paper": "Tian et al., KDD 2021, Sec. 6.1, Fig. 4", "attack": attack, "seed": run_seed,
              **first["eval settings"], "classes": classes, "images": int(len(y)),
              "test_data_sha256": first["test data"],
              "base_run": str(base.run), "base_checkpoint": str(base.checkpoint),
              "without": {str(j): str(without[j].checkpoint) for j in sorted(without)},
              "misclassified": mis.tolist(),
              "homing": [[None if math.isnan(v) else int(v) for v in row] for row in home]}
    write_json_atomic(record, folder / "homing.json")
    figures.homing_heatmaps(mis, home, classes, f"{attack}, {len(y)} test images", folder / "homing.png")
    md = folder / "homing.md"
    write_text_atomic(markdown(record), md)
    return md


def _table(matrix, classes: list[str], blank) -> list[str]:
    head = "| true \\ to | " + " | ".join(classes) + " |"
    rows = [head, "|" + " --- |" * (len(classes) + 1)]
    for i, name in enumerate(classes):
        rows.append(f"| {name} | " + " | ".join("" if blank(i, j, v) else str(v) for j, v in enumerate(matrix[i]))
                    + " |")
    return rows


def markdown(record: dict) -> str:
    """homing.md: both matrices, then the pairs the attack confuses most with how many of their images home."""
    classes, mis, home = record["classes"], record["misclassified"], record["homing"]
    pairs = sorted(((mis[i][j], i, j) for i in range(len(classes)) for j in range(len(classes))
                    if i != j and home[i][j] is not None and mis[i][j]), reverse=True)[:5]
    lines = ["# Homing property (Tian et al., KDD 2021, Sec. 6.1, Fig. 4)", "",
             f"Attack {record['attack']} (eps {record['eps']:g}, seed {record['seed']}) on {record['images']} test "
             f"images; base run {record['base_run']}.", "",
             "## (a) Misclassified confusion matrix", "",
             "Test images of the row's class that the attack sends to the column's class (the confound class); "
             "the diagonal (images the attack does not flip) is left blank.", "",
             *_table(mis, classes, lambda i, j, v: i == j), "",
             "## (b) Homing confusion matrix", "",
             "Of the images in the same cell of (a), how many the model re-trained without the column's class "
             "classifies correctly under the same attack (they home). Blank: the diagonal, and columns without a "
             "re-training.", "",
             *_table(home, classes, lambda i, j, v: v is None), "",
             "## Most confused pairs", "",
             "| true class | confound class | flipped (a) | home (b) | share home |", "| --- | --- | --- | --- | --- |",
             *(f"| {classes[i]} | {classes[j]} | {n} | {home[i][j]} | {100 * home[i][j] / n:.1f} % |"
               for n, i, j in pairs), ""]
    return "\n".join(lines)
