"""The CLI as a user types it (real data): in this process through ``cli.main`` where what the command says and
writes is the subject, in a process of its own where the process is (Ctrl-C sent to it, what it imports at start)."""
import importlib
import json
import re
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from fastfair import cli, stopping
from fastfair.methods import keys_markdown
from fastfair.rundir import RunDir
from helpers import cifar_subset_npz, fastfair, needs_extra

ROOT = Path(__file__).resolve().parents[1]


def test_listings_name_their_papers():
    methods = fastfair("methods").stdout
    for name in ("standard", "pgd-at", "trades", "me-at", "me-trades"):
        assert name in methods
    assert "ME paper" in methods and "Madry" in methods
    assert "train.select" in methods and "CFA's choice" in methods  # the selection policies
    assert "resnet18" in fastfair("models").stdout
    assert "digits" in fastfair("datasets").stdout
    presets = fastfair("presets").stdout
    assert "Table 2" in presets and "fastfair reproduce --list" in presets  # where whole tables are listed
    grids = presets[presets.index("grids (fastfair grid NAME"):]  # the shipped grids, each with what it sweeps
    assert "dafa-code-lambda" in grids and "trix-code-components" in grids and "lambda in {0, 0.5, 1, 1.5, 2}" in grids


def test_methods_markdown_prints_the_keys_document():
    done = fastfair("methods", "--markdown")
    assert done.returncode == 0 and done.stdout == keys_markdown()
    assert (ROOT / "docs" / "keys.md").read_text() == done.stdout  # the command the docs name regenerates them


def test_a_quick_run_says_so_on_the_terminal_and_in_its_log(tmp_path):
    done = fastfair("train", "--config", "demo", "--method", "pgd-at", "--quick", "5", "--epochs", "1", "--out",
                    str(tmp_path / "q"),
                    "--set", "data.batch_size=25", "--set", "model.width=4", "--set", "attack.steps=1",
                    "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean']")
    assert done.returncode == 0, done.stderr
    note = "quick run: trained on the first 5/class"
    assert note in done.stdout and note in RunDir(tmp_path / "q").train_log.read_text()
    # flags beat the preset, and the run's first line says which of its keys they changed
    said = ("preset demo: method.name me-trades -> pgd-at (from --method), data.batch_size 64 -> 25 (from --set), "
            "train.epochs 15 -> 1 (from --epochs), eval.attacks ['clean', 'pgd20', 'cw20'] -> ['clean'] (from --set)")
    assert done.stdout.splitlines()[0] == said == RunDir(tmp_path / "q").train_log.read_text().splitlines()[0]


@pytest.mark.parametrize("argv, said", [
    (["train", "--config", "demo", "--set", "train.lr", "0.1"], "--set takes KEY=VALUE as one word (no space around "
                                                                 "=); type: --set train.lr=0.1"),
    (["train", "--set", "train.lr", "=", "0.1", "--epochs", "2"], "type: --set train.lr=0.1"),
    (["eval", "runs/x", "--attacks", "clean,", "pgd20"], "--attacks takes one comma-separated word (no space after a "
                                                         "comma); type: --attacks clean,pgd20"),
    (["eval", "runs/x", "--attacks", "clean", ",pgd20,", "cw20", "--quiet"], "type: --attacks clean,pgd20,cw20"),
    (["eval", "runs/x", "runs/y"], "Got unexpected extra argument(s) (runs/y) (see: fastfair eval --help)"),
])
def test_a_value_split_by_a_space_is_one_line_saying_what_to_type(argv, said, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: ") and err[0].endswith(said), err


def test_unknown_method_lists_the_known_ones(tmp_path):
    r = fastfair("train", "--method", "me-trade", "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert "unknown method 'me-trade'" in r.stderr and "me-trades" in r.stderr and "Traceback" not in r.stderr


def test_missing_data_names_the_flag_and_the_download(tmp_path):
    r = fastfair("train", "--method", "pgd-at", "--dataset", "cifar10", "--data-dir", str(tmp_path / "none"),
                 "--out", str(tmp_path / "x"))
    assert r.returncode == 2
    assert "--data-dir" in r.stderr and "cifar-10-python.tar.gz" in r.stderr and "Traceback" not in r.stderr


def test_eval_of_a_folder_that_is_not_a_run_names_the_fix(tmp_path):
    r = fastfair("eval", str(tmp_path), "--quiet")
    assert r.returncode == 2 and "not a run directory (no config.toml)" in r.stderr and "Traceback" not in r.stderr
    r = fastfair("eval", str(tmp_path / "missing.pt"), "--quiet")
    assert r.returncode == 2 and "no checkpoint at" in r.stderr and "Traceback" not in r.stderr


def test_bad_set_key_suggests_the_right_one(tmp_path):
    r = fastfair("train", "--method", "trades", "--set", "train.learning_rate=0.1", "--out", str(tmp_path / "x"))
    assert r.returncode == 2 and "unknown config key 'train.learning_rate'" in r.stderr


@pytest.mark.slow
def test_me_trades_end_to_end_on_real_cifar10(tmp_path):
    npz = cifar_subset_npz(tmp_path, n_train=600, n_test=200)
    out = tmp_path / "run"
    r = fastfair("train", "--method", "me-trades", "--dataset", "npz", "--data-dir", str(npz), "--model", "tiny-cnn",
                 "--epochs", "2", "--out", str(out), "--set", "model.width=8",  # the plumbing, not the learning
                 "--set", "data.val_per_class=10", "--set", "data.batch_size=50",
                 "--set", "attack.steps=3", "--set", "train.lr_milestones=[1]",
                 "--set", "eval.attacks=['clean','pgd5']")
    assert r.returncode == 0, r.stderr
    for cls in ("airplane", "cat", "truck"):
        assert re.search(rf"^{cls} +│", r.stdout, re.M)  # a row of the rendered table
    assert re.search(r"^worst class +│", r.stdout, re.M) and "MCD" in r.stdout and "**" not in r.stdout
    assert re.search(r"under pgd5 worst class: [a-z]+ \d+\.\d %", r.stdout)  # the closing summary names it
    result = json.loads((out / "eval" / "best_pgd-test.json").read_text())
    pgd = result["results"]["pgd5"]
    assert len(pgd["per_class"]) == 10 and pgd["summary"]["avg"] <= result["results"]["clean"]["summary"]["avg"]
    # eval on the run directory as a user would, on the validation split
    r = fastfair("eval", str(out), "--attacks", "clean,fgsm", "--split", "val", "--quiet")
    assert r.returncode == 0, r.stderr
    assert (out / "eval" / "best_pgd-val.json").is_file()


def test_help_and_presets_answer_without_importing_torch():
    probe = ("import sys; from fastfair import cli; code = cli.main(sys.argv[1:]); "
             "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]; "
             "sys.exit(code)")
    for args, shown in ((["--help"], "presets"), (["presets"], "me-table2-me-trades-l27"),
                        (["train", "--help"], "--resume"), (["eval", "--help"], "--normalize")):
        r = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        assert r.returncode == 0 and shown in r.stdout, (args, r.stderr)


def test_usage_mistakes_are_one_error_line():
    for args, match in ((["train", "--epochs", "two"], "train.epochs takes an integer; got 'two'"),
                        (["train", "--bogus"], "--bogus"), (["eval"], "Missing argument"),
                        (["trian"], "No such command 'trian'")):
        r = fastfair(*args)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("fastfair: error: "), (args, r.stderr)
        assert match in lines[0]


@pytest.mark.parametrize("argv, module, function, says", [
    (["eval", "m.pt"], "fastfair.evaluation.per_class", "evaluate_checkpoint", "this evaluation wrote no result"),
    (["diagnose", "m.pt"], "fastfair.evaluation.diagnose", "diagnose_checkpoint", "no diagnostics were written"),
    (["grid", "g.toml"], "fastfair.scaleout.grid", "run_grid", "the grid's runs stopped with it"),
    (["reproduce", "cfa-t1"], "fastfair.reproduce.command", "reproduce", "the table's runs stopped with it"),
    (["tune", "--methods", "trades"], "fastfair.tuning.study", "tune", "the study's runs stopped with it"),
])
def test_ctrl_c_in_a_long_command_is_one_line_saying_how_to_go_on(argv, module, function, says, monkeypatch,
                                                                   capsys, tmp_path):
    def pressed(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.pt").touch()  # there: a checkpoint that is not is refused before the command's work begins
    monkeypatch.setattr(importlib.import_module(module), function, pressed)
    assert cli.main(argv) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: interrupted; ") and says in err[0], err
    assert "run the same command again" in err[0]


@pytest.mark.slow
def test_ctrl_c_stops_training_in_one_line_and_the_run_resumes(tmp_path, capsys):
    """Ctrl-C as a shell's foreground job gets it (SIGINT to the process, Python's own handler for it, neither
    ignored nor blocked, whatever the test worker inherited), sent from a thread once epoch 1 is written, while
    ``fastfair train`` runs in this process (tests/test_signals.py sends its signals to real processes)."""
    out = tmp_path / "run"
    train = ["train", "--config", "demo", "--epochs", "50", "--out", str(out), "--quiet", "--quick", "10",
             "--quick-test", "2", "--set", "model.width=4", "--set", "attack.steps=1", "--set",
             "train.val_attack=fgsm", "--set", "eval.attacks=['clean']"]
    metrics, done, pressed = out / "metrics.jsonl", threading.Event(), []

    def press():
        deadline = time.time() + 300
        while not (metrics.is_file() and metrics.read_text().endswith("\n")):  # epoch 1 is written
            if done.wait(0.05) or time.time() > deadline:
                return
        pressed.append(True)
        os.kill(os.getpid(), signal.SIGINT)

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    presser = threading.Thread(target=press, daemon=True)
    presser.start()
    try:
        code = cli.main(train)
    finally:
        done.set()
        presser.join()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, handler)
    err = capsys.readouterr().err
    assert pressed, f"epoch 1 was not written within 300 s; stderr: {err[-2000:]}"
    assert code == 130, err
    saved = len(RunDir(out).read_metrics())
    # at the next step boundary: the epochs saved, and the steps of the next where it stopped inside one (after
    # stopping.NOTICE where that boundary took over a second to come: the checkpoint's write on a loaded machine)
    *notice, line = err.strip().splitlines()
    assert notice in ([], [stopping.NOTICE]), err
    said = rf"interrupted in epoch {saved + 1} of 50 \(({saved}|{saved} epochs? and \d+ of \d+ steps) saved\)"
    assert re.fullmatch(rf"fastfair: {said}; continue with: fastfair train --out {re.escape(str(out))} --resume",
                        line), line
    assert RunDir(out).locked_by() == "" and RunDir(out).lock_file.read_text() == ""  # released, not stale
    assert not list(out.rglob("*.tmp"))
    r = fastfair(*train[:train.index("--epochs")], "--epochs", str(saved + 1), *train[train.index("--out"):],
                 "--resume")
    assert r.returncode == 0 and "taking over" not in r.stderr, r.stderr
    assert [m["epoch"] for m in RunDir(out).read_metrics()] == list(range(1, saved + 2))  # 1-based


# ---- issue 28 item 8: what a small run says ------------------------------------------------------
TINY = ["--epochs", "1", "--model", "tiny-cnn", "--set", "model.width=4", "--set", "attack.steps=1",
        "--set", "train.val_attack=fgsm", "--set", "eval.attacks=['clean']", "--set", "data.batch_size=16",
        "--set", "data.val_per_class=2", "--set", "train.lr_milestones=[]", "--set", "train.progress=false"]


def _cifar_like(path: Path) -> Path:
    """10 classes of random 3x32x32 uint8 images (10 train, 3 test each) and no class_names array."""
    rng = np.random.default_rng(0)
    np.savez(path, x_train=rng.integers(0, 256, (100, 3, 32, 32), dtype=np.uint8), y_train=np.arange(100) % 10,
             x_test=rng.integers(0, 256, (30, 3, 32, 32), dtype=np.uint8), y_test=np.arange(30) % 10)
    return path


def test_a_cifar10_npz_without_class_names_is_named_and_the_val_line_says_its_size(tmp_path, capsys):
    data = _cifar_like(tmp_path / "cifar10-part.npz")
    assert cli.main(["train", "--dataset", "npz", "--data-dir", str(data), "--out", str(tmp_path / "run"),
                     "--method", "pgd-at", *TINY]) == 0
    out = capsys.readouterr().out
    assert "airplane" in out and "truck" in out and "class 0" not in out  # CIFAR-10's names, as reproduce gives them
    log = RunDir(tmp_path / "run").train_log.read_text()
    assert re.search(r"epoch +1 .* val 2/class: clean [\d.]+  fgsm [\d.]+ \(worst [\d.]+\)", log), log
    # another data set's name, or a file named after none, keeps the neutral names
    for name in ("cifar100-part.npz", "data.npz"):
        np.savez(tmp_path / name, **np.load(data))
        assert cli.main(["train", "--dataset", "npz", "--data-dir", str(tmp_path / name), "--out",
                         str(tmp_path / name[:-4]), "--method", "pgd-at", *TINY]) == 0
        out = capsys.readouterr().out
        assert "class 0" in out and "airplane" not in out, name


@pytest.mark.parametrize("flag, says", [
    ("--quick", r"data.train_per_class=8 \(--quick 8\) keeps every image: the training split of cifar10-part has at "
                r"most 8 images per class; for a quick run pass fewer than 8, for the whole split leave --quick out"),
    ("--quick-test", r"data.test_per_class=8 \(--quick-test/--per-class 8\) keeps every image: the test split "
                     r".* at most 3"),
])
def test_a_quick_cap_that_keeps_every_image_is_an_error_not_a_quick_run(flag, says, tmp_path, capsys):
    data = _cifar_like(tmp_path / "cifar10-part.npz")
    assert cli.main(["train", "--dataset", "npz", "--data-dir", str(data), "--out", str(tmp_path / "run"), flag, "8",
                     *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(says, err[0]), err
    assert not (tmp_path / "run").exists()


def test_ctrl_c_line_is_in_train_log_too(tmp_path, monkeypatch, capsys):
    from fastfair.training.trainer import Trainer

    def pressed(self):
        raise KeyboardInterrupt
    monkeypatch.setattr(Trainer, "fit", pressed)
    out = tmp_path / "run"
    assert cli.main(["train", "--config", "demo", "--out", str(out), *TINY]) == 130
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [f"fastfair: interrupted in epoch 1 of 1 (0 saved); continue with: fastfair train --out {out} "
                    "--resume"]
    assert RunDir(out).train_log.read_text().splitlines()[-1] == said[0]


def _help_words(capsys, argv) -> str:
    """The words of a command's help, its wrapped lines and box drawing undone."""
    assert cli.main(argv) == 0
    return " ".join(re.sub("[│╭╮╰╯─]", " ", capsys.readouterr().out).split())


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"], ["tune", "--help"],
                                  ["data", "features", "--help"]])
def test_a_flag_shows_no_type_in_help(argv, capsys):
    words = _help_words(capsys, argv)
    assert "--help -h Show this message" in words and "<bool>" not in words  # a flag takes no value
    assert "<int>" in words or argv == ["--help"]  # an option that takes one still says its type


def test_tune_help_reads_whole(capsys):
    words = _help_words(capsys, ["tune", "--help"])
    assert ("--workers <int> worker processes on this machine, per GPU of --gpus (on the CPU: in all), sharing the "
            "study's storage") in words
    assert "fastfair tune [OPTIONS] [STUDY]" in words and "[[STUDY]]" not in words


@pytest.mark.parametrize("methods, says", [
    ("tradez", "--methods: unknown method 'tradez'. Did you mean trades, me-trades? Known: absld,"),
    ("cfa", "--methods: unknown method 'cfa'. Did you mean --method trades --ccm --ccr --fawa (CFA-TRADES;"),
    ("trades,trades+cmm", "after '+' come train's fairness flags, each once (ccm, ccr, ema, fawa; ema or fawa), e.g. "
                          "trades+ccm+ccr+fawa. Did you mean ccm?"),
])
def test_a_typo_in_tune_methods_gets_a_did_you_mean(methods, says, tmp_path, capsys):
    needs_extra("tune")
    assert cli.main(["tune", "--methods", methods, "--out", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("fastfair: error: ") and says in err[0], err
    assert not (tmp_path / "study").exists()
