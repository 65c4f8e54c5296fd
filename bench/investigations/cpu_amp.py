"""bf16 autocast on a CPU, measured: should ``train.amp = auto`` pick it where no GPU is? (issue 28, item 9)

    python bench/investigations/cpu_amp.py          # speed of fp32 vs bf16 training steps, then the demo's numbers
                                                    # in both
    python bench/investigations/cpu_amp.py --smoke  # tiny sizes: checks the bench runs (CI)

Speed: for each model, one Trainer with ``train.amp = off`` and one with ``bf16`` live in one process and
their timed windows alternate (fp32, bf16, fp32, ...), so a change in machine load hits both alike; the
median window of each is reported. Accuracy: the offline demo (``--config demo``) trained and evaluated
in full with each setting for several seeds; the seed-to-seed spread of fp32 is the noise bf16 is judged
against. Evaluation is fp32 in both (``fastfair eval`` never autocasts).
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from bench import common  # noqa: E402

# (model, data set, width, batch, attack steps): the demo's own model and data, then the everyday CIFAR path
SPEED = (("tiny-cnn", "digits", None, 64, 10), ("preact-resnet18", "synthetic", 16, 64, 10))
SMOKE_SPEED = (("tiny-cnn", "digits", None, 16, 2),)


def step_seconds(model, dataset, width, batch, steps, *, windows, window_steps, warmup) -> dict:
    """Median seconds per training step of fp32 and bf16, their windows interleaved."""
    name = common.register_synthetic(4 * batch) if dataset == "synthetic" else dataset
    base = {"data.batch_size": batch, "train.device": "cpu", "attack.steps": steps, "train.compile": "off",
            "model.channels_last": "off", "train.kernels": "torch"}
    if width:
        base["model.width"] = width
    seconds = common.interleaved_trainers("pgd-at", model, name, {amp: {**base, "train.amp": amp}
                                                                  for amp in ("off", "bf16")},
                                          windows=windows, window_steps=window_steps, warmup=warmup)
    fp32, bf16 = (statistics.median(seconds[a]["wall"]) for a in ("off", "bf16"))
    return {"model": model, "data": dataset, "width": width, "batch": batch, "attack_steps": steps,
            "fp32_s_per_step": fp32, "bf16_s_per_step": bf16, "speedup": fp32 / bf16,
            "windows": windows, "steps_per_window": window_steps}


def demo_numbers(amp: str, seed: int, epochs: int | None) -> dict:
    """The demo trained with ``train.amp = amp``; its per-class evaluation's averages and worst classes."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "fastfair", "train", "--config", "demo", "--seed", str(seed), "--quiet",
               "--out", str(Path(tmp) / "run"), "--set", f"train.amp={amp}"] + (
                   ["--epochs", str(epochs)] if epochs else [])
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        out = {"amp": amp, "seed": seed}
        for path in sorted((Path(tmp) / "run" / "eval").glob("*.json")):
            rec = json.loads(path.read_text())
            for attack, res in rec["results"].items():
                out[f"{attack}_avg"] = res["summary"]["avg"]
                out[f"{attack}_worst"] = res["summary"]["worst"]
        return out


def main(argv=None) -> int:
    p = common.base_parser(__doc__)
    p.add_argument("--seeds", type=int, default=3, help="demo runs per setting")
    args = p.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    speed = [step_seconds(*c, windows=3 if args.smoke else 7, window_steps=2 if args.smoke else 5,
                          warmup=1 if args.smoke else 3) for c in (SMOKE_SPEED if args.smoke else SPEED)]
    seeds = 1 if args.smoke else args.seeds
    demo = [demo_numbers(amp, seed, 1 if args.smoke else None) for seed in range(seeds) for amp in ("off", "bf16")]
    rows = [{"part": "speed", **r} for r in speed] + [{"part": "demo", **r} for r in demo]
    metrics = sorted({k for r in demo for k in r if k.endswith(("_avg", "_worst"))})
    body = ["## Training step, fp32 vs bf16 autocast (PGD-AT, eager, NCHW; windows interleaved)", "",
            common.markdown_table(speed, [("model", "model"), ("data", "data"), ("width", "width"),
                                          ("batch", "batch"), ("attack_steps", "PGD steps"),
                                          ("fp32_s_per_step", "fp32 s/step"), ("bf16_s_per_step", "bf16 s/step"),
                                          ("speedup", "fp32 / bf16")]),
            "", "## The offline demo's numbers (%, evaluation in fp32), per seed", "",
            common.markdown_table(demo, [("amp", "train.amp"), ("seed", "seed")] + [(m, m) for m in metrics]), ""]
    summary = []
    for m in metrics:
        vals = {a: [r[m] for r in demo if r["amp"] == a] for a in ("off", "bf16")}
        summary.append({"metric": m, "fp32_mean": statistics.mean(vals["off"]),
                        "fp32_range": max(vals["off"]) - min(vals["off"]),
                        "bf16_mean": statistics.mean(vals["bf16"]),
                        "bf16_minus_fp32": statistics.mean(vals["bf16"]) - statistics.mean(vals["off"])})
    body += ["## Means over seeds: bf16 against fp32's seed-to-seed range", "",
             common.markdown_table(summary, [("metric", "metric"), ("fp32_mean", "fp32 mean"),
                                             ("fp32_range", "fp32 range over seeds"), ("bf16_mean", "bf16 mean"),
                                             ("bf16_minus_fp32", "bf16 - fp32")])]
    head = common.header(torch.device("cpu"))
    paths = common.save("cpu-amp", head=head, settings={"seeds": seeds, "threads": torch.get_num_threads()},
                        rows=rows + [{"part": "summary", **s} for s in summary], body="\n".join(body),
                        out_dir=args.out, smoke=args.smoke, tag=args.tag)
    print("\n".join(body))
    print("written:", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
