"""The few lines ``fastfair train`` and ``fastfair eval`` end with: where the result is, its headline numbers
(clean and robust mean of the per-class accuracies, the least robust class by name) and the commands a user
types next. Plain text, so ``train.log`` holds the same lines as the terminal."""
from __future__ import annotations

from pathlib import Path

from fastfair import display
from fastfair.attacks import autoattack, names
from fastfair.config import load_run
from fastfair.data.subsets import dropped_note
from fastfair.evaluation import measures, per_image
from fastfair.rundir import RunDir

AA_QUICK = 20  # images per class suggested for a first AutoAttack look on a CPU


def robust_attack(results: dict[str, dict]) -> str | None:
    """The strongest evaluated attack: the lowest mean per-class accuracy among the non-clean ones (a natural
    corruption, ``corrupt:``, is no attack)."""
    robust = [n for n in results if n != "clean" and not n.startswith(names.CORRUPT)]
    return min(robust, key=lambda n: results[n]["summary"]["avg"]) if robust else None


def headline(record: dict) -> str:
    """``clean 95.2 % [94.8, 95.6], pgd20 60.1 % [59.1, 61.0] (mean of per-class accuracies); under pgd20 worst
    class: cat 21.3 % [18.1, 23.9]``, each with its 95 % interval (:mod:`fastfair.evaluation.per_image`), and an
    attack's masked gradients beside its number (:data:`fastfair.evaluation.measures.MASKED`)."""
    results, classes = record["results"], record["classes"]
    attack = robust_attack(results)
    shown = {n: per_image.with_intervals({n: results[n]})[n] for n in ("clean", attack) if n in results}
    numbers = ", ".join(f"{n} {e['summary']['avg']:.1f} %{measures.interval_text(e['summary_interval']['avg'])}"
                        + (f" (gradient masked on {e[measures.MASKED]} images)" if e.get(measures.MASKED) else "")
                        for n, e in shown.items())
    entry = shown[attack or "clean"]
    worst = entry["summary"]
    return (f"{numbers} (mean of per-class accuracies); under {attack or 'clean'} "
            f"{display.worst_class_text(classes[worst['worst_class']], worst['worst'])}"
            f"{measures.interval_text(entry['summary_interval']['worst'])}")


def _what(record: dict) -> str:
    """``best_pgd, epoch 12; test, 360 images; eps 8/255, seed 0``, with the cap of ``eval --per-class``."""
    cap = record.get("test_per_class", 0)
    images = f"{record['images']} images" + (f" (the first {cap} of each class, in file order)" if cap else "")
    epoch = f", epoch {record['epoch']}" if record.get("epoch") is not None else ""
    return (f"{Path(record['checkpoint']).stem}{epoch}; {record['split']}, {images}; "
            f"eps {display.eps_text(record['eps'])}, seed {record['seed']}")


def lines(record: dict, averaged: dict | None = None, figure: Path | None = None) -> list[str]:
    """The closing lines of an evaluation (and of the averaged model's, when training averaged one)."""
    run = RunDir.of_checkpoint(record["checkpoint"])
    is_run = run.config.is_file()  # else a model file fastfair did not write: no run folder to report on
    out = [f"{'run' if is_run else 'model'}: {run.path if is_run else record['checkpoint']} ({_what(record)})",
           f"  {headline(record)}", f"  written: {record['path']}"]
    if record.get("dropped_classes"):  # its worst class is most likely a dropped one
        out.insert(2, f"  {dropped_note(record['dropped_classes'], record['classes'])}")
    if averaged:
        out += [f"averaged model ({Path(averaged['checkpoint']).stem}): {headline(averaged)}",
                f"  written: {averaged['path']}"]
    if figure:
        out.append(f"figure: {figure}")
    if not is_run:
        return out
    target = str(run.path)
    stem, select = Path(record["checkpoint"]).stem, load_run(run.path).train.select
    if stem != run.selected_checkpoint(select).stem:
        target += f" --checkpoint {stem}"
    # a report needs a robust evaluation (report.choose_attack): suggested once there is one, so it works as printed
    robust = any(name != "clean" for name in record["results"])
    commands = [(f"fastfair report {run.path}", "per-class figures and tables (Markdown, LaTeX)")] if robust else []
    if autoattack.NAME not in record["results"]:
        commands += _autoattack_commands(target, record)
    if robust:
        commands.append((f"fastfair report {run.path} OTHER_RUN", "compare with another run"))
    width = max(len(c) for c, _ in commands)
    return out + ["next:"] + [f"  {c:<{width}}  # {why}" for c, why in commands]


def _autoattack_commands(target: str, record: dict) -> list[tuple[str, str]]:
    """AutoAttack on the same images; on a whole test set, a capped first look too (AutoAttack is slow on a CPU), each
    with its time at this evaluation's pace where it was measured."""
    aa = f"fastfair eval {target} --attacks aa"
    if record["split"] != "test":
        return [(f"{aa} --split {record['split']}", "AutoAttack on the same images" + _cost(record, record["images"]))]
    cap = record.get("test_per_class", 0)
    if cap:
        return [(f"{aa} --per-class {cap}", f"AutoAttack on the same {cap} images a class" +
                 _cost(record, record["images"]))]
    first = min(record["images"], AA_QUICK * len(record["classes"]))
    return [(f"{aa} --per-class {AA_QUICK}", f"standard AutoAttack on {AA_QUICK} images a class, a first look" +
             _cost(record, first)),
            (aa, "standard AutoAttack on the whole test set" + _cost(record, record["images"]))]


def _cost(record: dict, images: int) -> str:
    """``: about 3 min here`` (or ``under a minute``, ``about 2.5 h``): AutoAttack's planned work on ``images``
    (:func:`autoattack.image_passes`; its points the share the model classifies correctly) at the pace this evaluation
    measured; '' where none was measured."""
    if not record.get("image_passes_per_s"):
        return ""
    share = record["results"].get("clean", {}).get("summary", {}).get("overall", 100.0) / 100
    work = autoattack.image_passes(images, round(images * share), len(record["classes"]))
    seconds = work / record["image_passes_per_s"]
    if seconds < 60:
        return ": under a minute here"
    return f": about {seconds / 60:.0f} min here" if seconds < 90 * 60 else f": about {seconds / 3600:.1f} h here"
