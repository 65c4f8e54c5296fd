"""Run a model over a split once (clean and attacked) and compute every diagnostic of
:mod:`fastfair.evaluation.measures`.

Writes ``RUN/diagnostics/<checkpoint>-<split>-<attack>.json``, which ``fastfair report`` draws.
Always fp32, BN in eval mode; the attack's random starts are seeded as in ``fastfair eval``
(:mod:`fastfair.evaluation.seeds`), so diagnose and eval agree on the same checkpoint and seed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fastfair import build
from fastfair.evaluation import measures as dg
from fastfair.evaluation import measures, seeds
from fastfair.attacks import parse_attack, per_class
from fastfair.errors import UserError
from fastfair.reports import figures
from fastfair.rundir import EPOCH_NUMBERING, RunDir, check_writable, write_json_atomic


@torch.no_grad()
def _forward(model, x) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    feats = model.forward_features(x)
    logits = model.head(feats).float()
    return feats.float(), logits, logits.softmax(1)


def collect(model, loader, attack_name: str, *, eps, alpha, num_classes: int, cw_kappa: float = 50.0,
            seed: int = 0, clip_start: bool = True) -> dict:
    """Labels, and penultimate features, logits and softmax probabilities on clean and attacked inputs (CPU);
    batch ``i`` is attacked under ``seeds.derive(seed, attack_name, i)``, as ``fastfair eval`` does."""
    model.eval()
    dev = next(model.parameters()).device
    eps_c, alpha_c = per_class(eps, num_classes, dev, "eval.eps"), per_class(alpha, num_classes, dev, "eval.alpha")
    attack = parse_attack(attack_name, cw_kappa, clip_start)
    out = {f"{k}_{tag}": [] for k in ("feat", "logit", "prob") for tag in ("clean", "adv")} | {"y": []}
    for i, (x, y) in enumerate(loader):
        with seeds.seeded(seed, attack.name, i, device=dev):
            x_adv = attack(model, x, y, eps_c, alpha_c)
        for tag, inp in (("clean", x), ("adv", x_adv)):
            for k, v in zip(("feat", "logit", "prob"), _forward(model, inp)):
                out[f"{k}_{tag}"].append(v.cpu())
        out["y"].append(y.cpu())
    return {k: torch.cat(v).numpy() for k, v in out.items()}


def summarise(data: dict, head_weight, num_classes: int, tsne_points: int = 500, seed: int = 0) -> dict:
    """Every diagnostic from :func:`collect`'s arrays and the classifier's weight matrix, as JSON values: a class
    without images in the data (absent, named in ``absent_classes``) has null in every per-class cell, row and
    column of it, as the evaluation records have, and is left out of the measures over classes; a rank correlation
    that is undefined (constant values) is null."""
    y, c = data["y"], num_classes
    present = np.bincount(y, minlength=c) > 0
    out: dict = {"accuracy": {}, "summary": {}, "cvc": {}, "entropy": {}, "inter_class_similarity": {},
                 "nearest_class": {}, "intra_class_variance": {}, "logit_similarity": {}}
    conf = {}
    for tag in ("clean", "adv"):
        pred = data[f"prob_{tag}"].argmax(1)
        conf[tag] = np.bincount(y * c + pred, minlength=c * c).reshape(c, c)
        acc = measures.per_class_accuracy(conf[tag])
        feats = data[f"feat_{tag}"]
        sim, nearest = dg.inter_class_similarity(feats, y, c)
        ent = dg.entropy_per_class(data[f"prob_{tag}"], y, c)
        out["accuracy"][tag] = measures.json_values(acc)
        out["summary"][tag] = measures.summary_of_confusion(conf[tag])
        out["cvc"][tag] = measures.json_values(dg.cvc(data[f"prob_{tag}"], y, c))
        mean_entropy = float(dg.prediction_entropy(data[f"prob_{tag}"]).mean())
        out["entropy"][tag] = {"per_class": measures.json_values(ent), "mean": mean_entropy}
        out["inter_class_similarity"][tag] = measures.json_values(sim)
        out["nearest_class"][tag] = _nearest(nearest, sim)
        out["intra_class_variance"][tag] = measures.json_values(dg.intra_class_variance(feats, y, c))
        out["logit_similarity"][tag] = logit_similarity(data[f"logit_{tag}"], y, c, acc)
    norms = dg.weight_norms(head_weight)
    out["confusion"] = conf["adv"].tolist()
    out["confusion_percent"] = measures.json_values(dg.confusion_percent(conf["adv"]))
    out["misclassified_counts"] = dg.misclassified_counts(conf["adv"]).tolist()
    out["weight_norms"] = norms.tolist()
    out["weight_norm_rank_correlation"] = {
        tag: measures.json_value(dg.rank_correlation(norms, measures.per_class_accuracy(conf[tag])))
        for tag in ("clean", "adv")}
    absent = [k for k in range(c) if not present[k]]
    if absent:  # class indices here; diagnose_checkpoint names them
        out["absent_classes"] = absent
    if tsne_points:
        pick = np.random.default_rng(seed).permutation(len(y))[:tsne_points]
        clean, adv = dg.tsne(data["feat_clean"][pick], data["feat_adv"][pick], seed)
        out["tsne"] = {"labels": y[pick].tolist(), "clean": clean.round(4).tolist(), "adv": adv.round(4).tolist()}
    return out


def _nearest(nearest, similarity) -> list:
    """The nearest class of each class, null where its similarity is undefined (an absent class, or no other)."""
    return [None if s != s else int(k) for k, s in zip(nearest, similarity)]


def logit_similarity(logits, y, num_classes: int, accuracy) -> dict:
    """Benz et al. 2021, Sec. 3.2: the cosine similarity of the classes' mean logit vectors (``matrix``, rows and
    columns the true classes), each class's ``max`` (with its ``nearest`` class) and ``mean`` similarity to the
    others, and Spearman's rank correlation of each with the class's ``accuracy`` (their hypothesis: a class
    close to others is the vulnerable one, so a negative correlation). An absent class (no images, so no mean
    logit vector) is null in all of them and no other class's neighbour."""
    present = np.bincount(y, minlength=num_classes) > 0
    cos = dg.class_mean_cosine(logits, y, num_classes)
    others = dg.similarity_to_others(cos, present)
    cos = np.where(present[:, None] & present[None, :], cos.round(6), np.nan)
    return {"matrix": measures.json_values(cos), "max": measures.json_values(others["max"]),
            "nearest": _nearest(others["nearest"], others["max"]), "mean": measures.json_values(others["mean"]),
            "rank_correlation": {k: measures.json_value(dg.rank_correlation(others[k], accuracy))
                                 for k in ("max", "mean")}}


def diagnose_checkpoint(path, *, attack: str = "pgd20", split: str = "test", data_dir: str | None = None,
                        device: str = "auto", batch_size: int | None = None, tsne_points: int = 500,
                        quiet: bool = False, seed: int | None = None) -> dict:
    """Diagnose a checkpoint file on a split; writes the JSON described in the module docstring.

    ``seed`` (of the attack's random starts) defaults to the checkpoint's ``eval.seed``."""
    path = Path(path)
    parsed = parse_attack(attack)
    if parsed.transfer or parsed.per_class:
        raise UserError(f"diagnose takes an attack on the checkpoint itself over its whole split; {attack} "
                        f"{'needs a substitute model' if parsed.transfer else 'keeps N images a class'}: run it with "
                        "fastfair eval")
    out = RunDir.of_checkpoint(path).diagnostics_file(path, split, attack)
    check_writable(out.parent, "copy the run to a writable disk and diagnose the copy")  # before the work
    ck, cfg, dev, model, bundle, data = build.from_checkpoint(path, split=split, device_name=device, data_dir=data_dir,
                                                              batch_size=batch_size, channels_last_ok=False)
    loader = build.eval_loader(cfg, data, dev, False)
    c = bundle.num_classes
    seed = cfg.eval.seed if seed is None else seed
    data = collect(model, loader, attack, eps=cfg.eval.eps, alpha=cfg.eval.alpha, num_classes=c,
                   cw_kappa=cfg.eval.cw_kappa, seed=seed, clip_start=cfg.eval.clip_start)
    record = {"checkpoint": str(path), "epoch": ck["epoch"], **EPOCH_NUMBERING, "split": split, "attack": attack,
              "classes": bundle.classes, "eps": cfg.eval.eps, "precision": "fp32", "seed": seed,
              **summarise(data, model.head.weight, c, tsne_points, cfg.train.seed)}
    if "absent_classes" in record:  # by name, as an evaluation record names them
        record["absent_classes"] = [bundle.classes[k] for k in record["absent_classes"]]
    write_json_atomic(record, out)
    record["path"] = str(out)
    if "tsne" in record:  # the picture the numbers are for, beside the JSON
        t = record["tsne"]
        record["tsne_png"] = str(figures.tsne(
            t["clean"], t["adv"], t["labels"], bundle.classes,
            f"{path.stem} (epoch {ck['epoch']}), {split}: t-SNE of penultimate features",
            out.with_name(out.stem + "-tsne.png"), attack=attack))
    if not quiet:
        s, rho = record["summary"], measures.correlation_text
        print(f"{path.stem} on {split}: clean {s['clean']['avg']:.2f} (worst {s['clean']['worst']:.2f}), "
              f"{attack} {s['adv']['avg']:.2f} (worst {s['adv']['worst']:.2f}); rank correlation with {attack} "
              f"accuracy of the classifier weight norm {rho(record['weight_norm_rank_correlation']['adv'])}, of the "
              f"highest mean-logit cosine to another class "
              f"{rho(record['logit_similarity']['adv']['rank_correlation']['max'])}\nwritten: {out}"
              + (f"\nt-SNE figure: {record['tsne_png']}" if "tsne_png" in record else "")
              + (f"\n{measures.absent_note(record['absent_classes'])}" if "absent_classes" in record else ""))
    return record
