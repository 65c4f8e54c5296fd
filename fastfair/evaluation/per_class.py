"""Per-class evaluation under named attacks: confusion matrices on the device, metrics on the host.

Every random start is seeded (:mod:`fastfair.evaluation.seeds`), so a checkpoint evaluated twice on
the same data with the same settings gives the same numbers, per class. A result file records
fingerprints of the weights, the data (every image and label of the split) and the attack
settings; an evaluation adds its attacks to an earlier file only when all three agree, and moves
an earlier file of other weights, data or settings to ``eval/previous/`` instead of overwriting it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from fastfair import build, display, rules
from fastfair.config import load_saved_text
from fastfair.attacks import autoattack, corruptions, names
from fastfair.attacks.corruptions import Corrupt
from fastfair.attacks.names import EvalAttack, parse_attack
from fastfair.attacks.pgd import per_class
from fastfair.data import subset_note as data_subset_note
from fastfair.data.subsets import dropped_note
from fastfair.errors import UserError
from fastfair.evaluation import measures, per_image, seeds
from fastfair.progress import BACKWARD, FORWARD, PassMeter, Progress
from fastfair.rundir import (EPOCH_NUMBERING, RunDir, Unchecked, check_writable, read_json, state_sha256,
                             write_bytes_atomic, write_json_atomic)
from fastfair.scaleout import distributed


def confusion(model, loader, attack: EvalAttack, eps_c, alpha_c, num_classes: int,
              amp_dtype: torch.dtype | None = None, progress=None, seed: int = 0, substitute=None,
              entropy: torch.Tensor | None = None, nonfinite: torch.Tensor | None = None,
              scored: list | None = None, masked: torch.Tensor | None = None) -> torch.Tensor:
    """(C, C) counts, rows true class, columns prediction after ``attack``; fp32 unless ``amp_dtype``. ``entropy``
    (one float per class) gains each image's prediction entropy H(p) at its class (ME paper Fig. 7); ``nonfinite``
    (one integer, on the device) counts the images whose logits hold a NaN or inf, whose argmax means nothing
    (:func:`measures.check_finite` reads it once, after the loop); ``scored`` gains each batch's (labels, correct) of
    the images scored, in loader order; ``masked`` (one integer, on the device) counts the images whose input gradient
    was not finite at some step of the attack (:func:`fastfair.attacks.pgd.flag_masked`), summed on the device batch
    by batch, so the caller reads it once, after the loop, as ``nonfinite``.

    Batch ``i`` is attacked under the seed ``seeds.derive(seed, attack.seed_name, i)``. A ``NAME/N`` attack sees the
    first N images of each class in the loader's order; ``transfer:`` attacks are made on ``substitute``. ``progress``
    (:class:`fastfair.progress.Ticks`) counts the model's passes as they run, :func:`planned_units` a batch."""
    model.eval()
    dev = eps_c.device
    cast = torch.autocast(dev.type, dtype=amp_dtype) if amp_dtype else contextlib.nullcontext()
    meter = PassMeter(progress) if progress is not None else None  # the bar moves within a batch (PGD-20's is long)
    hook = model.register_forward_hook(meter) if meter is not None else None
    try:
        return _confusion(model, loader, attack, eps_c, alpha_c, num_classes, cast, meter, seed, substitute, entropy,
                          nonfinite, scored, masked)
    finally:
        if hook is not None:
            hook.remove()


def _confusion(model, loader, attack, eps_c, alpha_c, num_classes, cast, meter, seed, substitute, entropy,
               nonfinite, scored, masked) -> torch.Tensor:
    """:func:`confusion`'s loop; ``meter`` counts each batch's passes against :func:`planned_units`."""
    dev = eps_c.device
    conf = torch.zeros(num_classes * num_classes, dtype=torch.long, device=dev)
    seen = torch.zeros(num_classes, dtype=torch.long, device=dev)  # images of each class so far (NAME/N)
    for i, (x, y) in enumerate(loader):
        with meter.piece(planned_units(attack)) if meter is not None else contextlib.nullcontext():
            if attack.per_class:
                x, y, seen = _first_of_each_class(x, y, seen, attack.per_class)
            if len(y):
                flags = torch.zeros(len(y), dtype=torch.bool, device=dev) if masked is not None else None
                with cast, seeds.seeded(seed, attack.seed_name, i, device=dev):
                    x_adv = attack(model, x, y, eps_c, alpha_c, substitute, masked=flags)
                    with torch.no_grad():
                        logits = model(x_adv)
                if masked is not None:
                    masked += flags.sum()
                if logits.shape[1] != num_classes:  # a prediction past C would land in the next row's cells
                    raise UserError(f"the model returns {logits.shape[1]} logits per image and the data has "
                                    f"{num_classes} classes; evaluate it on the data set it was trained for")
                if nonfinite is not None:
                    nonfinite += (~torch.isfinite(logits)).any(1).sum()
                pred = logits.argmax(1)
                conf.index_add_(0, y * num_classes + pred, torch.ones_like(y))
                if scored is not None:
                    scored.append((y, pred == y))
                if entropy is not None:
                    p = logits.float().softmax(1)
                    entropy.index_add_(0, y, -(p * p.clamp_min(1e-30).log()).sum(1))
    return conf.view(num_classes, num_classes)


def _first_of_each_class(x, y, seen, n: int):
    """The rows of a batch among the first ``n`` images of their class, given ``seen`` per class before it."""
    onehot = torch.nn.functional.one_hot(y, len(seen))
    rank = seen[y] + onehot.cumsum(0).gather(1, y[:, None]).squeeze(1) - 1  # this image's place in its class
    keep = rank < n
    return x[keep], y[keep], seen + onehot.sum(0)


def progress_units(attack_names: list[str], num_classes: int) -> int:
    """Progress units (model passes, :data:`fastfair.progress.FORWARD` and ``BACKWARD``) :func:`evaluate` plans per
    loader batch for these attacks on a ``num_classes``-way model (AutoAttack's targets depend on it)."""
    return sum(autoattack.planned_units(num_classes) if n == autoattack.NAME else planned_units(parse_attack(n))
               for n in names.expand(attack_names))


def planned_units(attack: EvalAttack) -> int:
    """The progress units a batch plans under ``attack``: a forward and a backward each step (a transfer attack's
    are the substitute's, not counted), then the prediction's forward; :func:`confusion` counts them as they run."""
    steps = attack.pgd.steps * attack.pgd.restarts if attack.pgd is not None and not attack.transfer else 0
    return steps * (FORWARD + BACKWARD) + FORWARD


def attack_names(attacks: str | Sequence[str]) -> list[str]:
    """The names of ``--attacks clean,pgd20`` or of a Python list, checked (:func:`check_attack_names`)."""
    wanted = [a.strip() for a in (attacks.split(",") if isinstance(attacks, str) else attacks) if a.strip()]
    check_attack_names(wanted)
    return wanted


def check_attack_names(attack_names: Sequence[str]) -> None:
    """Raise a UserError when no attack is named, or for a name that neither parses nor names AutoAttack."""
    if not attack_names:
        raise UserError("no attack is named; name at least one, such as clean or pgd20")
    for name in names.expand(attack_names):
        if name == autoattack.NAME:
            continue
        try:
            parse_attack(name)
        except names.UnknownAttack:
            raise names.unknown_attack(name, autoattack=True) from None


def wants_substitute(attack_names: list[str]) -> bool:
    return any(names.is_transfer(n) for n in names.expand(attack_names))


# where fastfair eval and fastfair.evaluate take the substitute model, as their messages name it
EVAL_SUBSTITUTE = "--substitute (fastfair.evaluate: substitute=)"


def check_substitute(attack_names: list[str], substitute_given: bool, given_as: str = EVAL_SUBSTITUTE) -> None:
    """A ``transfer:`` attack needs a substitute model, and a substitute without one would do nothing; ``NAME/N``
    needs one process."""
    transfer = [n for n in names.expand(attack_names) if names.is_transfer(n)]
    if transfer and not substitute_given:
        raise UserError(f"{transfer[0]} makes its examples on a substitute model: give one with {given_as} (a run "
                        "folder or a checkpoint of the same data set)")
    if substitute_given and not transfer:
        raise UserError(f"{given_as} is used only by transfer: attacks (e.g. transfer:pgd20); add one to the attacks "
                        f"or leave {given_as} out")
    capped = any(parse_attack(n).per_class for n in names.expand(attack_names) if n != autoattack.NAME)
    if capped and distributed.current().enabled:
        raise UserError("NAME/N (the first N images of each class) runs on one process, not under torchrun, whose "
                        "ranks each see every world-th image")


def check_eps(eps, attack_names: list[str], num_classes: int | None, given_as: str) -> float | list[float]:
    """An eps given for one evaluation (``fastfair eval --eps``, ``fastfair.evaluate(eps=)``), checked before any
    attack runs: within [0, 1] as eval.eps is, one radius or one per class (of ``num_classes``, once the model is
    known), read by some attack, and one radius where AutoAttack runs. Returns it as the config would hold it."""
    try:
        value = rules.check("eval.eps", list(eps) if isinstance(eps, tuple) else eps, float, rules.IMAGE_RANGE,
                            per_class=True)
    except UserError as err:
        raise UserError(f"{given_as}: {err}") from None
    if isinstance(value, list) and num_classes is not None and len(value) != num_classes:
        raise UserError(f"{given_as}: {len(value)} radii for a model of {num_classes} classes; give one number, or "
                        f"one per class ({num_classes})")
    expanded = names.expand(attack_names)
    if not any(n == autoattack.NAME or _has_radius(parse_attack(n)) for n in expanded):
        raise UserError(f"{given_as} does nothing for {', '.join(attack_names)}: clean and corrupt: attacks have no "
                        "radius; add an attack such as pgd20, or leave it out")
    if isinstance(value, list) and autoattack.NAME in expanded:
        raise UserError(f"{given_as}: AutoAttack takes one radius for every class; give one number, or evaluate "
                        "aa apart from the per-class attacks")
    return value


def _has_radius(attack: EvalAttack) -> bool:
    return attack.pgd is not None or (attack.search is not None and not isinstance(attack.search, Corrupt))


def weights_sha256(model) -> str:
    """SHA-256 of every tensor of the model's state dict, by name."""
    return state_sha256(model.state_dict())


def aa_backend_for(attack_names: list[str], backend: str) -> str:
    """The AutoAttack backend to run (``auto`` resolved when AutoAttack is asked for, so a missing package fails
    before any work); an unknown backend is a UserError."""
    if backend not in ("auto", *autoattack.BACKENDS):
        raise UserError(f"the AutoAttack backend must be one of auto, {', '.join(autoattack.BACKENDS)}; got "
                        f"{backend!r}")
    if autoattack.NAME in names.expand(attack_names) and backend == "auto":
        return autoattack.default_backend()
    return backend


def evaluate(model, loader, attack_names: list[str], *, eps, alpha, classes: list[str], cw_kappa: float = 50.0,
             amp_dtype=None, progress=None, state_prefix=None, aa_backend: str = "auto", seed: int = 0,
             log=None, clip_start: bool = True, substitute=None) -> dict[str, dict]:
    """{attack: {per_class, summary, confusion, per_image, entropy, gradient_masked}} with accuracies in percent, each
    image's correctness (:mod:`fastfair.evaluation.per_image`; a result's intervals come from it, added where it is
    kept: :func:`per_image.with_intervals`), the mean prediction entropy in nats (not for AutoAttack, whose final
    predictions are its own) and, for an attack that takes input gradients, how many images had a non-finite one
    (:data:`measures.MASKED`).

    ``aa`` (AutoAttack, always fp32) adds its record under ``autoattack`` and keeps its per-sample
    flags in ``<state_prefix>.aa.npz`` to resume; ``tpgdK@grid`` runs Tian et al.'s 1/T grid.
    ``seed`` seeds every random start (recorded in each entry). ``transfer:`` attacks are made on
    ``substitute``; a ``NAME/N`` entry records the ``images`` it saw. ``corrupt:all@S`` runs each corruption and
    adds their mean: the sum of their confusions (so its per-class accuracy is the mean of theirs), its ``members``.
    """
    dev = next(model.parameters()).device
    c = len(classes)
    eps_c, alpha_c = per_class(eps, c, dev, "eval.eps"), per_class(alpha, c, dev, "eval.alpha")
    _check_corruptions(attack_names, loader)
    if autoattack.NAME in names.expand(attack_names):  # before the attacks listed ahead of it run
        autoattack.check_classes(c)
    out = {}
    for name in names.expand(attack_names):
        extra = {}
        if name == autoattack.NAME:
            state = f"{state_prefix}.aa.npz" if state_prefix else None
            conf, extra["autoattack"], correct = autoattack.evaluate_split(
                model, loader, eps=autoattack.uniform_eps(eps_c), num_classes=c, state_path=state,
                backend=aa_backend, seed=seed, progress=progress, log=log, classes=classes)
            # its own steps are the package's: one input gradient at each clean image, checked before it ran
            extra[measures.MASKED] = int(distributed.all_reduce_sum(
                torch.tensor(extra["autoattack"].pop(measures.MASKED), device=dev)))
            labels = torch.cat([y for _, y in loader]).to(dev)
            correct = torch.from_numpy(correct).to(dev)
        else:
            attack = parse_attack(name, cw_kappa, clip_start)
            entropy = torch.zeros(c, device=dev)
            nonfinite = torch.zeros((), dtype=torch.long, device=dev)
            masked = torch.zeros((), dtype=torch.long, device=dev) if attack.differentiates else None
            scored = []
            conf = confusion(model, loader, attack, eps_c, alpha_c, c, amp_dtype, progress, seed, substitute, entropy,
                             nonfinite, scored, masked)
            labels = torch.cat([y for y, _ in scored]) if scored else torch.zeros(0, dtype=torch.long, device=dev)
            correct = torch.cat([k for _, k in scored]) if scored else torch.zeros(0, dtype=torch.bool, device=dev)
            entropy = distributed.all_reduce_sum(entropy)
            nonfinite = distributed.all_reduce_sum(nonfinite)
            if attack.per_class:
                extra["images"] = int(conf.sum())
            if masked is not None:  # read once per attack: the steps summed it on the device
                extra[measures.MASKED] = int(distributed.all_reduce_sum(masked))
        conf = distributed.all_reduce_sum(conf.to(eps_c.device)).cpu()  # torchrun: each rank saw its shard
        if name != autoattack.NAME:  # AutoAttack checks its own passes (autoattack.evaluate_split)
            measures.check_finite(int(nonfinite), int(conf.sum()), name)
        if name != autoattack.NAME:  # the mean prediction entropy over the images, in nats (ME paper Fig. 7)
            extra["entropy"] = float(entropy.sum()) / max(1, int(conf.sum()))
        entry = {"per_class": measures.json_values(measures.per_class_accuracy(conf.numpy())),
                 "summary": measures.summary_of_confusion(conf.numpy()), "confusion": conf.tolist(), "seed": seed,
                 per_image.FIELD: per_image.pack(_in_split_order(correct), _in_split_order(labels)), **extra}
        out[name] = entry
    names.add_best(out, attack_names)
    for name in filter(names.is_corruption_group, attack_names):
        group = names.members(name)
        conf = sum(torch.tensor(out[m]["confusion"]) for m in group)
        entry = {"per_class": measures.json_values(measures.per_class_accuracy(conf.numpy())),
                 "summary": measures.summary_of_confusion(conf.numpy()), "confusion": conf.tolist(), "seed": seed,
                 "entropy": sum(out[m]["entropy"] for m in group) / len(group),  # each saw the same images
                 **({"images": out[group[0]]["images"]} if "images" in out[group[0]] else {}), "members": group}
        out[name] = entry
    return out


def _in_split_order(local: torch.Tensor) -> np.ndarray:
    """A per-image tensor of this rank's images as a numpy array over the whole split: under torchrun each rank holds
    every world-th image (:func:`distributed.shard`), put back in place and summed over the ranks."""
    ctx = distributed.current()
    if not ctx.enabled:
        return local.long().cpu().numpy()
    n = int(distributed.all_reduce_sum(torch.tensor(len(local), device=local.device)))
    whole = torch.zeros(n, dtype=torch.long, device=local.device)
    whole[ctx.rank::ctx.world] = local.long()
    return distributed.all_reduce_sum(whole).cpu().numpy()


def _check_corruptions(attack_names: list[str], loader) -> None:
    """A corruption the images cannot take (brightness and saturate on one channel) fails before any attack runs."""
    wanted = [parse_attack(n).search for n in names.expand(attack_names) if n != autoattack.NAME]
    wanted = [w.corruption for w in wanted if isinstance(w, corruptions.Corrupt)]
    if wanted:
        channels = next(iter(loader))[0].shape[1]
        for name in wanted:
            corruptions.check_channels(name, channels)


# ---- fingerprints: which weights, data and settings a result belongs to ----------------------

def _sha256(chunks) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def fingerprint(model, split: tuple[torch.Tensor, torch.Tensor], settings: dict) -> dict[str, str]:
    """SHA-256 of the weights (every tensor of the state dict), of the split (every image and label, in
    order) and of the settings that change a number (eps, alpha, CW kappa, precision, seed)."""
    return {"weights": weights_sha256(model),
            "data": _sha256(t.cpu().contiguous().numpy().tobytes() for t in split),
            "settings": _sha256([json.dumps(settings, sort_keys=True).encode()])}


def check_per_class(per_class: int | None, split: str) -> None:
    """``eval --per-class N``: N >= 1, and only for the test split (validation keeps data.val_per_class)."""
    if per_class is None:
        return
    if per_class < 1:
        raise UserError(f"--per-class takes the number of test images per class, 1 or more; got {per_class} (leave "
                        "it out to evaluate on the run's own test set)")
    if split != "test":
        raise UserError(f"--per-class caps the test split; --split {split} evaluates the run's validation images "
                        "as they are (data.val_per_class)")


def evaluate_checkpoint(path, *, attacks: list[str], split: str = "test", data_dir: str | None = None,
                        device: str = "auto", batch_size: int | None = None, amp: bool = False,
                        quiet: bool = False, aa_backend: str = "auto", seed: int | None = None,
                        per_class: int | None = None, substitute: str | None = None, eps=None) -> dict:
    """Evaluate a checkpoint file per class; writes ``RUN/eval/<checkpoint>-<split>.json`` and prints a table.

    ``seed`` defaults to the checkpoint's ``eval.seed``; ``per_class`` evaluates the first N test images of each
    class instead of the run's test set (its ``data.test_per_class``, all images unless a quick run); ``eps``
    (``--eps``: one radius or one per class) replaces the run's eval.eps."""
    path = Path(path)
    ck, cfg, dev, model, bundle, data = build.from_checkpoint(path, split=split, device_name=device, data_dir=data_dir,
                                                              batch_size=batch_size, test_per_class=per_class)
    own = load_saved_text(ck["config"]).data.test_per_class  # the run's test set
    if per_class is None and own and split == "test" and not quiet:
        print(f"testing on the first {own} images of each class, as the run did (its --quick-test, "
              "data.test_per_class); --per-class N sets another number")
    return evaluate_loaded(path, model, cfg, dev, bundle, data, attacks=attacks, split=split, amp=amp, quiet=quiet,
                           aa_backend=aa_backend, seed=seed, record={"epoch": ck["epoch"], **EPOCH_NUMBERING},
                           title=f"{path.stem} (epoch {ck['epoch']})",
                           own_test_per_class=own, substitute=substitute, eps=eps)


def evaluate_loaded(path: Path, model, cfg, dev, bundle, data, *, attacks: list[str], split: str, amp: bool,
                    quiet: bool, aa_backend: str, seed: int | None, record: dict, title: str,
                    own_test_per_class: int = 0, substitute: str | None = None, eps=None) -> dict:
    """Evaluate a loaded model (from ``path``) per class; writes the JSON beside ``path``'s run and prints a
    table. ``record`` adds what the result must say about where the model came from. A test set capped to
    other than ``own_test_per_class`` images a class (``--per-class``) gets its own file. ``transfer:`` attacks
    run on ``substitute`` (a run folder or checkpoint; default the config's ``eval.substitute``). ``eps`` (``--eps``:
    one radius or one per class) replaces the config's eval.eps."""
    if eps is not None:  # known to fit once the model's classes are: before any attack runs
        cfg.eval.eps = check_eps(eps, attacks, len(bundle.classes), "--eps")
    seed = cfg.eval.seed if seed is None else seed
    loader = build.eval_loader(cfg, distributed.shard(data), dev, build.channels_last(cfg, dev))
    quiet = quiet or not distributed.current().is_main
    check_attack_names(attacks)
    aa_backend = aa_backend_for(attacks, aa_backend)
    if not substitute and wants_substitute(attacks):
        substitute = cfg.eval.substitute or None
    check_substitute(attacks, bool(substitute))
    sub_model = None
    if substitute:
        sub_model, sub_path = build.substitute_model(substitute, dev, model, next(iter(loader))[0])
        record = {**record, "substitute": str(sub_path)}
    run = RunDir.of_checkpoint(path)
    cap = cfg.data.test_per_class if split == "test" else 0  # first N test images of each class; 0: all
    out = run.eval_file(path, split, cap if cap != own_test_per_class else 0)
    # before any attack: AutoAttack's resume file goes here before the JSON, and a run on a read-only disk says so
    check_writable(out.parent, f"copy the run to a writable disk and evaluate the copy ({path} is not written)")
    settings = settings_of(eps=cfg.eval.eps, alpha=cfg.eval.alpha, cw_kappa=cfg.eval.cw_kappa, amp=amp, seed=seed,
                           clip_start=cfg.eval.clip_start, test_per_class=cap, substitute=sub_model)
    fp = fingerprint(model, data, settings)
    prog = Progress(enabled=not quiet)
    with prog.task(f"eval {','.join(attacks)} on {split}", len(loader) * progress_units(attacks, len(bundle.classes)),
                   unit="pass") as advance:
        t0 = time.perf_counter()
        results = evaluate(model, loader, attacks, eps=cfg.eval.eps, alpha=cfg.eval.alpha, classes=bundle.classes,
                           cw_kappa=cfg.eval.cw_kappa, amp_dtype=torch.bfloat16 if amp else None, progress=advance,
                           state_prefix=out.with_suffix(""), aa_backend=aa_backend, seed=seed, log=prog.print,
                           clip_start=cfg.eval.clip_start, substitute=sub_model)
        seconds = time.perf_counter() - t0
    results = per_image.with_intervals(results)
    note = data_subset_note(cfg.data.dataset, cfg.data.train_per_class, cfg.data.test_per_class)  # "": all data
    dropped = list(cfg.data.drop_classes)  # named beside every table, so a dropped class's row is not read as a result
    record = {"checkpoint": str(path), **record, "split": split, "classes": bundle.classes,
              "images": len(data[1]), "subset": note, **({"dropped_classes": dropped} if dropped else {}),
              **absent_record(results, bundle.classes), **settings, "fingerprint": fp, "intervals": per_image.METHOD}
    kept = None
    if distributed.current().is_main:
        kept = write_record(record, results, out, lambda tag: run.previous_eval_file(path, split, tag))
    record["path"] = str(out)
    if advance.done and seconds > 0:  # passes times their images a second here, for the closing lines' estimates
        record["image_passes_per_s"] = advance.done * len(data[1]) / len(loader) / seconds
    if not quiet:
        print(f"\n{title} on {split}, eps {display.eps_text(cfg.eval.eps)}, seed {seed}, "
              f"{note + ', ' if note else ''}per-class accuracy (%):\n")
        display.print_table(*measures.table_rows(results, bundle.classes))
        for line in per_image.table_notes(results):
            print(line)
        if record.get("absent_classes"):
            print(measures.absent_note(record["absent_classes"]))
        if dropped:
            print(dropped_note(dropped, bundle.classes))
        if kept:
            print(f"\nan earlier result of other weights, data or settings was moved to {kept}")
    return record


def absent_record(results: dict[str, dict], classes: list[str]) -> dict:
    """``{"absent_classes": [names]}`` of the classes without images in the evaluated data ({} for none): their
    cells are null and the summaries leave them out (:mod:`fastfair.evaluation.measures`)."""
    absent = measures.table_absent(results, classes)
    return {"absent_classes": absent} if absent else {}


def settings_of(*, eps, alpha, cw_kappa: float, amp: bool, seed: int, clip_start: bool = True,
                test_per_class: int = 0, substitute=None) -> dict:
    """The settings that change a number, as recorded in a result and hashed into its fingerprint; a
    ``substitute`` model (of transfer attacks) by the SHA-256 of its weights."""
    return {"eps": eps, "alpha": alpha, "cw_kappa": cw_kappa, "precision": "bf16" if amp else "fp32", "seed": seed,
            # named only when off or set, so results of the default keep their fingerprint
            **({} if clip_start else {"clip_start": False}),
            **({"test_per_class": test_per_class} if test_per_class else {}),
            **({"substitute_weights": weights_sha256(substitute)} if substitute is not None else {})}


def write_record(record: dict, results: dict, out: Path, previous) -> Path | None:
    """Write ``record`` with ``results`` to ``out``, keeping an earlier file's other attacks when its fingerprint
    is ``record['fingerprint']``; returns where an unrelated earlier file was moved (``previous(tag)``), or None."""
    earlier, kept = _earlier_results(out, record["fingerprint"], previous)
    record["results"] = {**earlier, **results}
    write_json_atomic(record, out)
    return kept


def _earlier_results(path: Path, fp: dict, previous) -> tuple[dict, Path | None]:
    """(results to keep, where an unrelated earlier file went). An earlier file of the same weights, data
    and settings keeps its other attacks (so ``eval --attacks aa`` after training adds AA to PGD/CW);
    any other earlier file, or one without a checksum (an older fastfair's: its numbers are not signed into the
    new one), is kept at ``previous(tag)``, tagged by its content's hash, rather than merged or overwritten."""
    if not path.is_file():
        return {}, None
    text = path.read_bytes()
    old = read_json(path, "delete it and evaluate again")
    if old.get("fingerprint") == fp and not isinstance(old, Unchecked):
        return old.get("results", {}), None
    previous = previous(hashlib.sha256(text).hexdigest()[:12])
    write_bytes_atomic(text, previous)  # a copy: the earlier file stays in place until the new one replaces it whole
    return {}, previous
