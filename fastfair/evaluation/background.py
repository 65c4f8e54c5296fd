"""Table 4 of Tian et al. (KDD 2021, Sec. 6.2): a class's test images predicted as each class, natural and under
attack, before and after their background is replaced by one colour (given a foreground mask).

Both versions of the class's images go through ``fastfair eval``'s attacks and seeds
(:func:`fastfair.evaluation.per_class.evaluate`) on their own, so the two rows of each attack differ only by the
background. The result goes to ``RUN/eval/<checkpoint>-test-background-<class>-<colour>.json``, never into the plain
test result, with the fingerprints of the weights, the replaced images and the settings, and the mask file's sha256.
"""
from __future__ import annotations

from pathlib import Path

import torch

from fastfair import build, display
from fastfair.data.background import class_index, named, parse_colour, read_masks, replace_background
from fastfair.data.subsets import dropped_note
from fastfair.evaluation.per_class import check_attack_names, evaluate, fingerprint, settings_of
from fastfair.progress import Progress
from fastfair.rundir import RunDir, write_json_atomic


def background_counts(path, *, cls: str, mask: str, colour: str = "white", attacks: list[str], device: str = "auto",
                      data_dir: str | None = None, batch_size: int | None = None, seed: int | None = None,
                      quiet: bool = False) -> dict:
    """Evaluate class ``cls``'s test images as they are and with the background replaced; writes and returns the
    record (``rows``: per attack, the counts per predicted class before and after)."""
    check_attack_names(attacks)
    rgb = parse_colour(colour)
    ck, cfg, dev, model, bundle, (x, y) = build.from_checkpoint(path, split="test", device_name=device,
                                                                data_dir=data_dir, batch_size=batch_size)
    c = class_index(cls, bundle.classes, "--class")
    members = (y == c).nonzero().flatten()
    masks, mask_sha = read_masks(mask, len(members), tuple(x.shape[2:]), c, bundle.classes)
    original = x[members]
    replaced = torch.from_numpy(replace_background(original.numpy(), masks, rgb))
    seed = cfg.eval.seed if seed is None else seed
    settings = settings_of(eps=cfg.eval.eps, alpha=cfg.eval.alpha, cw_kappa=cfg.eval.cw_kappa, amp=False, seed=seed,
                           clip_start=cfg.eval.clip_start)
    cl = build.channels_last(cfg, dev)
    results = {}
    prog = Progress(enabled=not quiet)
    for version, images in (("original", original), ("replaced", replaced)):
        loader = build.eval_loader(cfg, (images, y[members]), dev, cl)
        with prog.task(f"{','.join(attacks)} on {named(bundle.classes[c])}, {version}", len(loader)) as advance:
            out = evaluate(model, loader, attacks, eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=bundle.classes,
                           cw_kappa=cfg.eval.cw_kappa, seed=seed, clip_start=cfg.eval.clip_start,
                           progress=advance)
        results[version] = {name: entry["confusion"][c] for name, entry in out.items() if "confusion" in entry}
    colour_name = colour.strip().lower().replace(",", "-").replace("#", "")
    run = RunDir.of_checkpoint(path)
    name = f"{Path(path).stem}-test-background-{bundle.classes[c].replace(' ', '_')}-{colour_name}.json"
    dest = run.path / "eval" / name
    record = {"paper": "Tian et al., KDD 2021, Sec. 6.2, Table 4", "checkpoint": str(path), "epoch": ck["epoch"],
              "class": bundle.classes[c], "class_index": c, "images": len(members), "colour": list(rgb),
              "mask": str(mask), "mask_sha256": mask_sha, "classes": bundle.classes, **settings,
              "fingerprint": fingerprint(model, (replaced, y[members]), settings),
              "original_fingerprint": fingerprint(model, (original, y[members]), settings)["data"],
              **({"dropped_classes": cfg.data.drop_classes} if cfg.data.drop_classes else {}), "counts": results}
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(record, dest)
    record["path"] = str(dest)
    if not quiet:
        print(f"\n{named(bundle.classes[c])}: {len(members)} test images predicted as each class, background replaced "
              f"by {colour} ({'x'.join(map(str, rgb))}); eps {display.eps_text(cfg.eval.eps)}, seed {seed}\n")
        display.print_table(*table_rows(record))
        if cfg.data.drop_classes:
            print(dropped_note(cfg.data.drop_classes, bundle.classes))
        print(f"\nwritten: {dest}")
    return record


def table_rows(record: dict) -> tuple[list[str], list[tuple[list[str], bool]]]:
    """(header, rows) of Table 4: per attack the original counts, then the replaced ones with their change."""
    classes, c = record["classes"], record["class_index"]
    header = ["images (attack)", *(f"{n} (correct)" if i == c else n for i, n in enumerate(classes))]
    rows = []
    for attack, before in record["counts"]["original"].items():
        after = record["counts"]["replaced"][attack]
        rows.append(([f"original ({attack})", *map(str, before)], False))
        rows.append(([f"+ background ({attack})", *(f"{a} ({a - b:+d})" for a, b in zip(after, before))], False))
    return header, rows

