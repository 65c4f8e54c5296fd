"""Per-class evaluation under named attacks: confusion matrices on the device, metrics on the host."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from fastfair import build
from fastfair.attacks import autoattack, names
from fastfair.attacks.names import EvalAttack, parse_attack
from fastfair.attacks.pgd import per_class
from fastfair.evaluation import measures
from fastfair.progress import Progress
from fastfair.rundir import RunDir, write_json_atomic
from fastfair.scaleout import distributed


def confusion(model, loader, attack: EvalAttack, eps_c, alpha_c, num_classes: int,
              amp_dtype: torch.dtype | None = None, progress=None) -> torch.Tensor:
    """(C, C) counts, rows true class, columns prediction after ``attack``; fp32 unless ``amp_dtype``."""
    model.eval()
    dev = eps_c.device
    conf = torch.zeros(num_classes * num_classes, dtype=torch.long, device=dev)
    cast = torch.autocast(dev.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    for x, y in loader:
        with cast:
            x_adv = attack(model, x, y, eps_c, alpha_c)
            with torch.no_grad():
                pred = model(x_adv).argmax(1)
        conf.index_add_(0, y * num_classes + pred, torch.ones_like(y))
        if progress is not None:
            progress()
    return conf.view(num_classes, num_classes)


def progress_units(attack_names: list[str]) -> int:
    """Progress ticks per loader batch that :func:`evaluate` makes for these attacks."""
    return sum(autoattack.PROGRESS_UNITS if n == autoattack.NAME else 1 for n in names.expand(attack_names))


def check_attack_names(attack_names: list[str]) -> None:
    """Raise a UserError for a name that neither parses nor names AutoAttack."""
    for name in names.expand(attack_names):
        if name != autoattack.NAME:
            parse_attack(name)


def evaluate(model, loader, attack_names: list[str], *, eps, alpha, classes: list[str], cw_kappa: float = 50.0,
             amp_dtype=None, progress=None, state_prefix=None, aa_backend: str = "auto", log=None) -> dict[str, dict]:
    """{attack: {per_class, summary, confusion}} with accuracies in percent.

    ``aa`` (AutoAttack, always fp32) adds its record under ``autoattack`` and keeps its per-sample
    flags in ``<state_prefix>.aa.npz`` to resume; ``tpgdK@grid`` runs Tian et al.'s 1/T grid.
    """
    dev = next(model.parameters()).device
    c = len(classes)
    eps_c, alpha_c = per_class(eps, c, dev), per_class(alpha, c, dev)
    out = {}
    for name in names.expand(attack_names):
        extra = {}
        if name == autoattack.NAME:
            state = f"{state_prefix}.aa.npz" if state_prefix else None
            conf, extra["autoattack"] = autoattack.evaluate_split(
                model, loader, eps=autoattack.uniform_eps(eps_c), num_classes=c, state_path=state,
                backend=aa_backend, progress=progress, log=log)
        else:
            conf = confusion(model, loader, parse_attack(name, cw_kappa), eps_c, alpha_c, c, amp_dtype, progress)
        conf = distributed.all_reduce_sum(conf.to(eps_c.device)).cpu()  # torchrun: each rank saw its shard
        acc = measures.per_class_accuracy(conf.numpy())
        out[name] = {"per_class": acc.tolist(), "summary": measures.summary(acc), "confusion": conf.tolist(), **extra}
    names.add_best(out, attack_names)
    return out


def evaluate_checkpoint(path, *, attacks: list[str], split: str = "test", data_dir: str | None = None,
                        device: str = "auto", batch_size: int | None = None, amp: bool = False,
                        quiet: bool = False, aa_backend: str = "auto") -> dict:
    """Evaluate a checkpoint file per class; writes ``RUN/eval/<checkpoint>-<split>.json`` and prints a table."""
    path = Path(path)
    ck, cfg, dev, model, bundle, data = build.from_checkpoint(path, split=split, device_name=device, data_dir=data_dir,
                                                              batch_size=batch_size)
    loader = build.eval_loader(cfg, distributed.shard(data), dev, build.channels_last(cfg, dev))
    quiet = quiet or not distributed.current().is_main
    check_attack_names(attacks)
    out = RunDir.of_checkpoint(path).eval_file(path, split)
    prog = Progress(enabled=not quiet)
    with prog.task(f"eval {','.join(attacks)} on {split}", len(loader) * progress_units(attacks)) as advance:
        results = evaluate(model, loader, attacks, eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=bundle.classes,
                           cw_kappa=cfg.eval.cw_kappa, amp_dtype=torch.bfloat16 if amp else None, progress=advance,
                           state_prefix=out.with_suffix(""), aa_backend=aa_backend, log=prog.print)
    record = {"checkpoint": str(path), "epoch": ck["epoch"], "split": split, "classes": bundle.classes,
              "eps": cfg.eval.eps, "alpha": cfg.eval.alpha, "precision": "bf16" if amp else "fp32",
              "results": _merge_earlier(out, ck["epoch"], cfg.eval.eps, amp, results)}
    if distributed.current().is_main:
        out.parent.mkdir(exist_ok=True)
        write_json_atomic(record, out)
    record["path"] = str(out)
    if not quiet:
        print(f"\n{path.stem} (epoch {ck['epoch'] + 1}) on {split}, eps {cfg.eval.eps:.5f}, per-class accuracy (%):\n")
        print(measures.markdown_table(results, bundle.classes))
        print(f"\nwritten: {out}")
    return record


def _merge_earlier(path, epoch: int, eps: float, amp: bool, results: dict) -> dict:
    """Keep attacks an earlier evaluation of the same weights (epoch, eps, precision) wrote to ``path``;
    this run's attacks replace theirs, so ``eval --attacks aa`` after training adds AA to PGD/CW."""
    if not path.is_file():
        return results
    old = json.loads(path.read_text())
    if (old.get("epoch"), old.get("eps"), old.get("precision")) != (epoch, eps, "bf16" if amp else "fp32"):
        return results
    return {**old.get("results", {}), **results}
