"""Table 4 and Fig. 6 of Tian et al. (KDD 2021, Sec. 6.2): a class's test images predicted as each class, natural
and under attack, before and after their background is replaced by one colour (given a foreground mask).

Both versions of the class's images go through ``fastfair eval``'s attacks and seeds
(:func:`fastfair.evaluation.per_class.evaluate`) on their own, so the two rows of each attack differ only by the
background. A second model, trained with Sec. 6.1's adjustment (``adjusted``: the Fig. 4(c) run), is attacked on the
replaced images too, with the first model's settings: Table 4's lines 3 and 6. The result goes to
``RUN/eval/<checkpoint>-test-background-<class>-<colour>.json``, never into the plain test result, with the
fingerprints of the weights, the replaced images and the settings, and the mask file's sha256; Fig. 6's examples
go beside it as ``.png``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from fastfair import build, display
from fastfair.attacks import names
from fastfair.data.background import class_index, named, parse_colour, read_masks, replace_background
from fastfair.data.subsets import dropped_note
from fastfair.evaluation.homing import probabilities
from fastfair.evaluation.per_class import (check_attack_names, evaluate, fingerprint, progress_units, settings_of,
                                           weights_sha256)
from fastfair.errors import UserError
from fastfair.progress import Progress
from fastfair.reports import figures
from fastfair.rundir import RunDir, write_json_atomic


def background_counts(path, *, cls: str, mask: str, colour: str = "white", attacks: list[str], adjusted=None,
                      examples: int = 4, device: str = "auto", data_dir: str | None = None,
                      batch_size: int | None = None, seed: int | None = None, quiet: bool = False) -> dict:
    """Evaluate class ``cls``'s test images as they are and with the background replaced (and, with ``adjusted``,
    that checkpoint on the replaced ones); writes and returns the record (``counts``: per attack, the counts per
    predicted class) and, for ``examples`` above 0, Fig. 6's PNG of that many images."""
    check_attack_names(attacks)
    if examples < 0:
        raise UserError(f"--examples takes the number of images Fig. 6 shows, 0 for no figure; got {examples}")
    rgb = parse_colour(colour)
    ck, cfg, dev, model, bundle, (x, y) = build.from_checkpoint(path, split="test", device_name=device,
                                                                data_dir=data_dir, batch_size=batch_size)
    c = class_index(cls, bundle.classes, "--class")
    members = (y == c).nonzero().flatten()
    masks, mask_sha = read_masks(mask, len(members), tuple(x.shape[2:]), c, bundle.classes)
    original, labels = x[members], y[members]
    replaced = torch.from_numpy(replace_background(original.numpy(), masks, rgb))
    if adjusted is not None:  # loaded before any attack: a model of other images fails at once
        adj_ck, _, _, adj_model, adj_bundle, (ax, ay) = build.from_checkpoint(
            adjusted, split="test", device_name=device, data_dir=data_dir, batch_size=batch_size)
        if adj_bundle.classes != bundle.classes or not torch.equal(ax[ay == c], original):
            raise UserError(f"--adjusted {adjusted}: its test images of {named(bundle.classes[c])} are not those of "
                            f"{path}; Table 4 compares both models on the same images")
    seed = cfg.eval.seed if seed is None else seed
    settings = settings_of(eps=cfg.eval.eps, alpha=cfg.eval.alpha, cw_kappa=cfg.eval.cw_kappa, amp=False, seed=seed,
                           clip_start=cfg.eval.clip_start)
    cl = build.channels_last(cfg, dev)
    prog = Progress(enabled=not quiet)

    def counts(net, images, version: str) -> dict:
        loader = build.eval_loader(cfg, (images, labels), dev, cl)
        with prog.task(f"{','.join(attacks)} on {named(bundle.classes[c])}, {version}",
                       len(loader) * progress_units(attacks, bundle.num_classes), unit="pass") as advance:
            out = evaluate(net, loader, attacks, eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=bundle.classes,
                           cw_kappa=cfg.eval.cw_kappa, seed=seed, clip_start=cfg.eval.clip_start, progress=advance)
        return {name: entry["confusion"][c] for name, entry in out.items() if "confusion" in entry}

    results = {"original": counts(model, original, "original"), "replaced": counts(model, replaced, "replaced")}
    colour_name = colour.strip().lower().replace(",", "-").replace("#", "")
    run = RunDir.of_checkpoint(path)
    name = f"{Path(path).stem}-test-background-{bundle.classes[c].replace(' ', '_')}-{colour_name}.json"
    dest = run.path / "eval" / name
    record = {"paper": "Tian et al., KDD 2021, Sec. 6.2, Table 4", "checkpoint": str(path), "epoch": ck["epoch"],
              "class": bundle.classes[c], "class_index": c, "images": len(members), "colour": list(rgb),
              "mask": str(mask), "mask_sha256": mask_sha, "classes": bundle.classes, **settings,
              "fingerprint": fingerprint(model, (replaced, labels), settings),
              "original_fingerprint": fingerprint(model, (original, labels), settings)["data"],
              **({"dropped_classes": cfg.data.drop_classes} if cfg.data.drop_classes else {}), "counts": results}
    if adjusted is not None:
        record["adjusted"] = {"checkpoint": str(adjusted), "epoch": adj_ck["epoch"],
                              "weights": weights_sha256(adj_model), "counts": counts(adj_model, replaced, "adjusted")}
    if examples:
        loader_of = {"original": build.eval_loader(cfg, (original, labels), dev, cl),
                     "replaced": build.eval_loader(cfg, (replaced, labels), dev, cl)}
        shown = figure_attack(attacks)
        scores = {}
        for version, loader in loader_of.items():
            for attack in ("clean", *([shown] if shown else [])):
                with prog.task(f"Fig. 6: {attack} on {named(bundle.classes[c])}, {version}", len(loader)) as advance:
                    scores[version, attack] = probabilities(
                        model, loader, attack, eps=cfg.eval.eps, alpha=cfg.eval.alpha, num_classes=bundle.num_classes,
                        cw_kappa=cfg.eval.cw_kappa, seed=seed, clip_start=cfg.eval.clip_start, progress=advance)
        record["figure"] = str(dest.with_suffix(".png"))
        record["examples"] = figure_6(scores, shown, original.numpy(), replaced.numpy(), members.numpy(), c,
                                      bundle.classes, examples, colour, dest.with_suffix(".png"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(record, dest)
    record["path"] = str(dest)
    if not quiet:
        print(f"\n{named(bundle.classes[c])}: {len(members)} test images predicted as each class, background replaced "
              f"by {colour} ({'x'.join(map(str, rgb))}); eps {display.eps_text(cfg.eval.eps)}, seed {seed}\n")
        display.print_table(*table_rows(record))
        if cfg.data.drop_classes:
            print(dropped_note(cfg.data.drop_classes, bundle.classes))
        print(f"\nwritten: {dest}" + (f" (Fig. 6: {record['figure']})" if examples else ""))
    return record


def figure_attack(attacks: list[str]) -> str | None:
    """The attack whose predictions Fig. 6 shows: the first of ``attacks`` attacked image by image (not clean,
    AutoAttack, a 1/T grid, transfer: or NAME/N), or None."""
    return next((a for a in attacks if a != "clean" and names.parses(a) and not names.is_transfer(a)
                 and not names.parse_attack(a).per_class), None)


def figure_6(scores: dict, attack: str | None, original: np.ndarray, replaced: np.ndarray, ids: np.ndarray, c: int,
             classes: list[str], count: int, colour: str, path: Path) -> list[int]:
    """Fig. 6 of Tian et al. (KDD 2021, Sec. 6.2): the ``count`` images whose confidence in their class under
    ``attack`` (natural without one) rises most with the new background, those it makes robust first, each
    before and after with its two most likely classes; returns their test-set indices."""
    key = attack or "clean"
    before, after = scores["original", key], scores["replaced", key]
    fixed = (before.argmax(1) != c) & (after.argmax(1) == c)
    order = np.lexsort((-(after[:, c] - before[:, c]), ~fixed))[:count]

    def lines(version: str, i: int) -> list[tuple[str, bool]]:
        out = []
        for name in ("clean", *([attack] if attack else [])):
            p = scores[version, name][i]
            top = np.argsort(-p, kind="stable")[:2]
            out.append((f"{'natural' if name == 'clean' else name}: " +
                        ", ".join(f"{classes[k]} {p[k]:.2f}" for k in top), top[0] == c))
        return out

    columns = [[(original[i], lines("original", i)), (replaced[i], lines("replaced", i))] for i in order]
    who = named(classes[c])
    title = (f"{who}: background replaced by {colour}; each image's two most likely classes with their confidence "
             f"(green: {who} ranks first)\nthe {len(order)} images whose confidence in {who} "
             f"{'under ' + attack if attack else 'naturally'} rises most with the new background")
    figures.image_grid(columns, [f"test image {int(ids[i])}" for i in order], ["original", f"{colour} background"],
                       title, path)
    return [int(ids[i]) for i in order]


def table_rows(record: dict) -> tuple[list[str], list[tuple[list[str], bool]]]:
    """(header, rows) of Table 4: per attack the original counts, then the replaced ones and, with an adjusted
    model, its counts on the replaced images, each with its change from the original."""
    classes, c = record["classes"], record["class_index"]
    header = ["images (attack)", *(f"{n} (correct)" if i == c else n for i, n in enumerate(classes))]
    rows = []
    for attack, before in record["counts"]["original"].items():
        after = [("+ background", record["counts"]["replaced"][attack])]
        if "adjusted" in record:
            after.append(("+ training adjustment", record["adjusted"]["counts"][attack]))
        rows.append(([f"original ({attack})", *map(str, before)], False))
        rows += [([f"{what} ({attack})", *(f"{a} ({a - b:+d})" for a, b in zip(counts, before))], False)
                 for what, counts in after]
    return header, rows
