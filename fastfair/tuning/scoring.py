"""The final fronts on the test set: each point under the validation's attack, the first robust evaluation attack and
AutoAttack where asked, with each image's correctness, so that two contenders' points are compared image by image
(issue 56 Sec. 3; the record's form in :mod:`fastfair.tuning.front`).

An attack of one pass per batch (clean, PGD, CW, FGSM, ...) is run here batch by batch as ``fastfair eval`` runs it
(:func:`fastfair.evaluation.per_class.confusion`: the same loader order and per-batch seeds, so the same per-class
numbers), keeping each image's prediction; AutoAttack, a transfer attack, a grid or a capped ``NAME/N`` goes through
``fastfair eval`` (:func:`~fastfair.evaluation.per_class.evaluate_checkpoint`), whose record keeps per-class counts,
not images: its numbers get intervals, not pairs.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fastfair import build
from fastfair.attacks import names
from fastfair.attacks.names import parse_attack
from fastfair.attacks.pgd import per_class
from fastfair.evaluation import measures
from fastfair.evaluation.per_class import confusion, evaluate_checkpoint
from fastfair.tuning.front import encode_bits, encode_labels, images_of_counts, summarize


def per_image(name: str) -> bool:
    """Whether ``name`` is an attack this module runs image by image (one pass per batch over every image)."""
    if name == "aa" or not names.parses(name) or names.members(name) != [name] or names.is_transfer(name):
        return False
    return not parse_attack(name).per_class


def _correct(model, loader, name: str, eps_c, alpha_c, classes: int, cfg) -> tuple[np.ndarray, np.ndarray]:
    """(correctness, label) of each image under ``name`` in loader order: ``fastfair eval``'s own pass
    (:func:`fastfair.evaluation.per_class.confusion`, batch ``i`` under the seed ``seeds.derive(eval.seed, attack,
    i)``), keeping each batch's scored images."""
    nonfinite, scored = torch.zeros((), dtype=torch.long, device=eps_c.device), []
    conf = confusion(model, loader, parse_attack(name, cfg.eval.cw_kappa, cfg.eval.clip_start), eps_c, alpha_c,
                     classes, seed=cfg.eval.seed, nonfinite=nonfinite, scored=scored)
    measures.check_finite(int(nonfinite), int(conf.sum()), name)
    return torch.cat([k for _, k in scored]).cpu().numpy(), torch.cat([y for y, _ in scored]).cpu().numpy()


def test_record(checkpoint: Path, attacks: list[str], device: str) -> dict:
    """The test record of one front point (:mod:`fastfair.tuning.front`'s form): its checkpoint on the run's test
    set, clean and under each of ``attacks``, with intervals, and each image's correctness where :func:`per_image`."""
    _, cfg, dev, model, bundle, (x, y) = build.from_checkpoint(checkpoint, split="test", device_name=device,
                                                               data_dir=None, batch_size=None)
    c = len(bundle.classes)
    loader = build.eval_loader(cfg, (x, y), dev, build.channels_last(cfg, dev))
    eps_c, alpha_c = per_class(cfg.eval.eps, c, dev, "eval.eps"), per_class(cfg.eval.alpha, c, dev, "eval.alpha")
    wanted = ["clean", *attacks]
    counted = [a for a in wanted if not per_image(a)]
    results = evaluate_checkpoint(checkpoint, attacks=counted, split="test", device=device,
                                  quiet=True)["results"] if counted else {}
    record: dict = {"classes": c, "attacks": {}}
    for name in wanted:  # clean first: its pass gives the labels in the loader's order
        if per_image(name):
            correct, labels = _correct(model, loader, name, eps_c, alpha_c, c, cfg)
            if name == "clean":
                sizes = np.bincount(labels, minlength=c)
                record.update(images=len(labels), per_class=[int(sizes[sizes > 0].min()), int(sizes.max())],
                              labels=encode_labels(labels))
            entry = {**summarize(correct, labels, c), "correct": encode_bits(correct)}
        else:
            conf = np.asarray(results[name]["confusion"])
            entry = summarize(*images_of_counts(np.diag(conf).tolist(), conf.sum(1).tolist()), c)
        if name == "clean":
            record["clean"] = entry["avg"]
        else:
            record["attacks"][name] = entry
    return record
