"""Settings the seed papers state, kept or keyed in their presets (issue 41, "Settings that differ from the paper"):
Tian et al. ICLR's released models and 75th epoch, its Tables 5-6 step, KDD Table 1's schedules, ME's checkpoint
rule, and the rows and numbers that were missing."""
import dataclasses
import hashlib
from pathlib import Path

import pytest

from fastfair import cli, config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.reproduce import command, runs, tables
from fastfair.preset_files import preset_names
from fastfair.reproduce.paper import load

from helpers import CIFAR_SUBSET, real_data

ROOT = Path(__file__).resolve().parents[1]
T2_TRAINED = ("tian-iclr-t2-madry", "tian-iclr-t2-trades", "tian-iclr-t2-mart", "tian-iclr-t2-standard")
T5 = ("tian-iclr-t5-madry", "tian-iclr-t5-he", "tian-iclr-t5-he-lis", "tian-iclr-t5-he-cmp")
# the URLs the authors' READMEs give for their CIFAR-10 WideResNet-34-10s (yaodongyu/TRADES, YisenWang/MART)
RELEASED = {"tian-iclr-t2-trades-released": "https://drive.google.com/file/d/10sHvaXhTNZGz618QmD5gSOAjO3rMzV33/view",
            "tian-iclr-t2-mart-released": "https://drive.google.com/open?id=1QjEwSskuq7yq86kRKNv6tkn9I16cEBjc"}


@pytest.mark.parametrize("preset", T2_TRAINED + T5)
def test_tian_iclr_rows_keep_the_75th_epoch_model(preset):
    """Sec. 3: 'a 75th epoch model is used', for all experiments unless otherwise stated."""
    cfg = config.resolve(preset)
    assert (cfg.train.select, cfg.train.select_epoch) == ("epoch", 75)
    assert load(preset).selection.startswith("the 75th epoch's model (Sec. 3")
    # Tables 5-6 attack with Sec. 3's PGD-20 step (App. G); App. E's 0.003 belongs to Table 2's models
    assert cfg.eval.alpha == (0.007 if "-t5-" in preset else 0.003)


def test_the_notes_say_which_epoch_a_shorter_scale_keeps():
    full, subset = ([n for n in command._notes(tables.get("tian-iclr-t5"), scale, {}) if "train.select = epoch" in n]
                    for scale in ("full", "subset"))
    assert len(full) == len(subset) == 4
    assert all("the model after epoch 75. " in n for n in full)
    # the epoch the subset scale's runs keep (runs.plan sets it from the same changes)
    kept = {runs.SCALES.get("subset").changes(config.flatten(config.resolve(p).to_dict()), {})["train.select_epoch"]
            for p in T5}
    assert len(kept) == 1 and min(kept) < 75
    assert all(f"the model after epoch 75 (epoch {min(kept)} at this scale)" in n for n in subset)


def test_table_2_evaluates_the_released_trades_and_mart_beside_the_retrained_ones():
    rows = {r.preset: r for r in tables.get("tian-iclr-t2").rows}
    for preset, url in RELEASED.items():
        trained = rows[preset.removesuffix("-released")]
        released = rows[preset]
        assert released.released.url.startswith(url) and released.released.sha256 == ""  # unknown, not invented
        assert released.released.normalize == "none" and config.resolve(preset).model.name == "wrn-34-10"
        assert released.numbers == trained.numbers and released.substitute == trained.substitute
        name = trained.row.removesuffix(" (re-trained)")
        assert (trained.row, released.row) == (f"{name} (re-trained)", f"{name} (released model)")
        # Sec. 3.3 re-trains the Madry row alone: no other preset says its row was "re-trained following Madry"
        text = (ROOT / "configs" / f"{trained.preset}.toml").read_text()
        assert "re-trained following Madry" not in text and f"row {preset}" in text
    assert all(rows[p].released is None for p in T2_TRAINED)


def test_a_released_row_is_pending_until_its_file_is_placed(tmp_path, capsys):
    real_data()
    table, models = tables.get("tian-iclr-t2"), tmp_path / "models"
    planned = {p.row.preset: p for p in runs.plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path / "out", {},
                                                  str(models))}
    path = models / "released" / "TRADES" / "model_cifar_wrn.pt"
    said = planned["tian-iclr-t2-trades-released"].missing
    assert RELEASED["tian-iclr-t2-trades-released"] in said and str(path.resolve()) in said
    assert planned["tian-iclr-t2-trades"].missing == ""
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the authors' weights")
    planned = {p.row.preset: p for p in runs.plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path / "out", {},
                                                  str(models))}
    assert planned["tian-iclr-t2-trades-released"].missing == ""
    assert "mart_wrn-34-10.pt" in planned["tian-iclr-t2-mart-released"].missing  # the other file is still pending
    assert cli.main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.count("the authors' released model, evaluated, not trained: download https://drive.google.com") == 6


def test_the_placed_file_is_evaluated_and_its_sha256_printed_or_checked(tmp_path, monkeypatch):
    real_data()
    models = tmp_path / "models"
    path = models / "released" / "MART" / "mart_wrn-34-10.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"the authors' weights")
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    planned = [p for p in runs.plan(tables.get("tian-iclr-t2"), 1, "subset", str(CIFAR_SUBSET), tmp_path / "out", {},
                                    str(models)) if p.row.preset == "tian-iclr-t2-mart-released"][0]
    calls = []

    def evaluated(file, **kw):
        calls.append((file, kw))
        return {"results": {}, "source": {"sha256": sha}}

    monkeypatch.setattr(command, "evaluate_foreign", evaluated)
    said, records, run_lines, failed = [], {}, [], []
    command._evaluate_released(planned, tmp_path / "out", str(models), "cpu", records, {}, run_lines, failed,
                               said.append)
    assert not failed and records["tian-iclr-t2-mart-released"]
    file, kw = calls[0]
    assert file == path and (kw["model"], kw["normalize"], kw["eps"], kw["alpha"]) == ("wrn-34-10", "none", 0.031,
                                                                                     0.003)
    assert kw["run_dir"] == planned.run_dir(tmp_path / "out") and kw["substitute"].endswith("tian-iclr-t2-standard-s0")
    assert any(f"SHA-256 {sha}" in line and 'add sha256 = "' in line for line in said)
    # a recorded SHA-256 the placed file does not have: the row fails with one line, nothing is evaluated
    other = dataclasses.replace(planned, row=dataclasses.replace(
        planned.row, released=dataclasses.replace(planned.row.released, sha256="0" * 64)))
    command._evaluate_released(other, tmp_path / "out", str(models), "cpu", records, {}, run_lines, failed, said.append)
    assert len(calls) == 1 and len(failed) == 1 and f"has SHA-256 {sha}, not the {'0' * 64}" in failed[0]


def _code_rate(epoch: int, lr: float = 0.1) -> float:
    """The TRADES, MART and AT_HE codes' adjust_learning_rate(optimizer, epoch), epochs from 1: x0.1 from 75, x0.01
    from 90, x0.001 from 100."""
    return lr * (0.001 if epoch >= 100 else 0.01 if epoch >= 90 else 0.1 if epoch >= 75 else 1.0)


@pytest.mark.parametrize("preset, epochs, weight_decay", [
    ("tian-kdd-t1-trades", 76, 2e-4),  # yaodongyu/TRADES train_trades_cifar10.py defaults
    ("tian-kdd-t1-mart", 90, 7e-4),  # YisenWang/MART train_wideresnet.py defaults
    ("tian-kdd-t1-he", 77, 5e-4),  # ShawnXYang/AT_HE train_adv_cifar10.py defaults, its README's --wd 5e-4 for PGD-HE
])
def test_kdd_table_1_trains_each_defense_with_its_own_code_s_schedule(preset, epochs, weight_decay):
    from fastfair.training import optim

    cfg = config.resolve(preset)
    t = cfg.train
    assert (t.epochs, t.weight_decay, t.lr, t.momentum, cfg.data.batch_size) == (epochs, weight_decay, 0.1, 0.9, 128)
    rate = optim.schedule(t)
    assert [rate(e - 1, 0.5) for e in range(1, epochs + 1)] == pytest.approx([_code_rate(e) for e in
                                                                            range(1, epochs + 1)])
    assert t.select == "last" and load(preset).follows == "code"  # the codes keep every epoch and choose none


def test_kdd_table_1_says_which_setup_its_other_rows_run():
    madry, standard = config.resolve("tian-kdd-t1-madry"), config.resolve("tian-kdd-t1-standard")
    for cfg in (madry, standard):  # the paper's App. A.1 setup, each with its reason in the preset
        assert (cfg.train.epochs, cfg.train.lr_milestones, cfg.train.weight_decay) == (100, [75, 90], 2e-4)
    assert (madry.train.select, madry.train.select_epoch) == ("epoch", 75)
    text = (ROOT / "configs" / "tian-kdd-t1-madry.toml").read_text()
    assert "Sec. 4.3 says 'following the original papers'; this row\n# keeps the paper's own setup instead" in text
    for preset in ("tian-kdd-t1-trades", "tian-kdd-t1-mart", "tian-kdd-t1-he"):
        assert "(128, as the TRADES and MART code)" not in (ROOT / "configs" / f"{preset}.toml").read_text()


ME_ROWS = [r for t in ("me-t2", "me-t3") for r in tables.get(t).rows]


def test_me_presets_say_both_changes_of_the_checkpoint_rule_and_record_the_paper_s():
    for row in ME_ROWS:
        text = (ROOT / "configs" / f"{row.preset}.toml").read_text()
        assert "fastfair changes both the split and the attack: it picks by PGD-10" in text, row.preset
        assert row.paper_selection == {"train.select_split": "test", "train.val_attack": "pgd20"}
        cfg = config.resolve(row.preset)
        assert (cfg.train.select, cfg.train.val_attack, cfg.train.select_split) == ("pgd", "pgd10", "val")
    notes = "\n".join(command._notes(tables.get("me-t2"), "full", {}))
    assert notes.count("train.select = pgd by pgd10 on a validation split of 100 training images a class") == 8
    assert "TEST set" not in notes


def test_the_paper_s_rule_selects_on_the_test_set_and_the_report_says_so(tmp_path):
    real_data()
    table = tables.get("me-t3")
    planned = runs.plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path / "out", {}, paper_selection=True)
    assert all(p.sets["train.select_split"] == "test" and p.sets["train.val_attack"] == "pgd20" for p in planned)
    # the subset scale's validation size goes with the split it sizes: no run warns that it does nothing
    assert not any("data.val_per_class" in p.sets for p in planned)
    assert not [w for p in planned for w in check_config(config.resolve(p.row.preset, None, p.sets))
                if "val_per_class" in w]
    usual = runs.plan(table, 1, "subset", str(CIFAR_SUBSET), tmp_path / "out", {})
    assert not any("train.select_split" in p.sets for p in usual) and all("data.val_per_class" in p.sets for p in usual)
    notes = command._notes(table, "subset", {}, paper_selection=True)
    assert sum("by pgd20 on the TEST set (train.select_split = test): the checkpoint was selected on the test images "
               "it is evaluated on" in n for n in notes) == 4
    # a table whose paper has no other rule: the flag would do nothing
    with pytest.raises(UserError, match="--paper-selection: no row of tian-iclr-t5"):
        command.reproduce("tian-iclr-t5", scale="subset", data_dir=str(CIFAR_SUBSET), out=str(tmp_path / "t5"),
                          paper_selection=True)


def test_select_split_test_scores_on_the_test_set_and_trains_on_every_image():
    from fastfair import build

    on_test = config.resolve("demo", {"train.select_split": "test"})
    bundle, sp = build.splits(on_test)
    assert torch_equal(sp["val"], sp["test"]) and len(sp["train"][1]) == len(bundle.y_train)
    _, held = build.splits(config.resolve("demo"))
    assert len(held["val"][1]) == 10 * config.resolve("demo").data.val_per_class
    assert check_config(config.resolve("demo", {"train.select_split": "test", "data.val_per_class": 5})) == [
        "data.val_per_class = 5 does nothing with train.select_split=test: no validation split is held out, every "
        "training image is trained on"]
    with pytest.raises(UserError, match="train.select_split=test scores checkpoints on the test set, and "
                                        "data.loader=ffcv"):
        check_config(config.resolve("demo", {"train.select_split": "test", "data.loader": "ffcv"}))


def torch_equal(a, b) -> bool:
    import torch

    return all(torch.equal(x, y) for x, y in zip(a, b))


# CFA Table 1 as the paper prints it (Best avg / worst, clean and AA; Last avg / worst, clean and AA), copied line by
# line from its text: the presets' Best numbers and their `last` numbers must be these cells
CFA_TABLE_1 = """\
AT | 82.3 / 63.9 | 46.7 / 20.1 | 84.1 / 65.1 | 43.0 / 15.5 |
AT + EMA | 81.9 / 61.6 | 49.6 / 21.3 | 84.8 / 67.7 | 44.3 / 18.1 |
AT + CFA | 80.8 / 64.6 | 50.1 / 24.4 | 83.6 / 68.7 | 47.7 / 20.5 |
TRADES | 82.3 / 67.8 | 48.3 / 21.7 | 83.9 / 66.9 | 46.9 / 18.5 |
TRADES + EMA | 81.2 / 65.0 | 49.7 / 24.2 | 84.5 / 67.9 | 48.3 / 20.7 |
TRADES + CFA | 80.4 / 66.2 | 50.1 / 26.5 | 83.0 / 68.1 | 49.3 / 21.5 |
FAT | 84.6 / 69.2 | 45.7 / 17.2 | 85.4 / 70.8 | 42.1 / 14.8 |
FAT + EMA | 85.2 / 66.7 | 48.6 / 18.3 | 85.7 / 71.2 | 43.2 / 15.7 |
FAT + CFA | 82.1 / 64.7 | 49.6 / 20.9 | 84.3 / 69.4 | 45.1 / 16.7 |
FRL | 82.8 / 71.4 | 45.9 / 25.4 | 82.8 / 72.9 | 44.7 / 23.1 |
FRL + EMA | 83.6 / 69.5 | 46.1 / 25.6 | 81.9 / 74.2 | 44.9 / 24.5 |"""


def test_cfa_table_1_records_its_last_columns_cell_for_cell():
    printed = {}
    for line in CFA_TABLE_1.splitlines():
        name, *cells = [c.strip() for c in line.strip(" |").split("|")]
        printed[name] = [tuple(float(v) for v in c.split(" / ")) for c in cells]
    rows = [r for r in tables.get("cfa-t1").rows]
    assert {r.row for r in rows} == set(printed) and len(rows) == 18  # -paper and -code rows hold the same numbers
    for r in rows:
        best_clean, best_aa, last_clean, last_aa = printed[r.row]
        assert (r.numbers["clean"].avg, r.numbers["clean"].worst) == best_clean
        assert (r.numbers["aa"].avg, r.numbers["aa"].worst) == best_aa
        assert set(r.last) == {"clean", "aa"}, r.preset
        assert (r.last["clean"].avg, r.last["clean"].worst) == last_clean
        assert (r.last["aa"].avg, r.last["aa"].worst) == last_aa
    assert sum(len(printed[name][2:]) * 2 for name in printed) == 44


def test_the_last_epoch_s_numbers_are_compared_with_the_last_checkpoint_s_evaluation(tmp_path, monkeypatch):
    """A row with `last` numbers evaluates its runs' last.pt (last_avg.pt where it averages) once, in its own table
    only, and compares them beside the selected checkpoint's."""
    evaluated = []

    def fake_eval(path, **kw):
        evaluated.append(path)
        run = Path(path).parents[1]
        (run / "eval").mkdir(exist_ok=True)
        (run / "eval" / f"{Path(path).stem}-test.json").write_text('{"classes": ["a", "b"], "results": {}}')

    monkeypatch.setattr(command, "evaluate_checkpoint", fake_eval)
    run = tmp_path / "runs" / "cfa-t1-at-ema-paper-s0"
    (run / "checkpoints").mkdir(parents=True)
    monkeypatch.setattr(command, "read_state", lambda d: {"status": "done"})
    monkeypatch.setattr(config, "load_saved_text", lambda text, where: config.resolve("cfa-t1-at-ema-paper"))
    monkeypatch.setattr(command.RunDir, "read_config", lambda self: "")
    row = load("cfa-t1-at-ema-paper")
    planned = runs.PlannedRun(row, 0, run.name, {}, ("clean", "aa"), True, {})
    job = type("Job", (), {"run_dir": str(run)})()
    said = []
    for _ in range(2):  # the second time reads the first's result
        lasts = command._last_records([planned], [job], tables.get("cfa-t1"), "cpu", said.append)
    assert evaluated == [run / "checkpoints" / "last_avg.pt"] and len(lasts["cfa-t1-at-ema-paper"]) == 1
    assert command._last_records([planned], [job], tables.get("cfa-t3"), "cpu", said.append) == {}  # also_in: not


def test_me_missing_rows_and_numbers_are_recorded():
    trades_ls = load("me-table4-trades-ls")
    assert trades_ls.table == "4" and "me-table4-trades-ls" in {r.preset for r in tables.get("me-t4").rows}
    assert config.resolve("me-table4-trades-ls").method.smoothing == 0.1  # Table 1's alpha
    assert [trades_ls.numbers[a].worst for a in ("clean", "pgd20", "cw20", "aa")] == [64.4, 25.7, 22.4, 20.8]
    fig5 = load("me-fig5-binary-cat-dog-trades")  # the text: 23.4 natural and 44.0 PGD-10 error
    assert (fig5.numbers["clean"].avg, fig5.numbers["pgd10"].avg) == (100 - 23.4, 100 - 44.0)
    assert "pgd10" in config.resolve("me-fig5-binary-cat-dog-trades").eval.attacks


def test_every_row_whose_paper_chose_on_the_test_set_records_that_rule():
    """A row claiming the paper's test-set rule while fastfair selects on a validation split runs the paper's with
    --paper-selection (issue 50, 2.3: ME's Fig. 3, 5 and 8 rows claimed it without recording it)."""
    for preset in preset_names():
        row = load(preset)
        if row and "on the test set" in row.selection and config.resolve(preset).train.select_split == "val":
            assert row.paper_selection == {"train.select_split": "test", "train.val_attack": "pgd20"}, preset


@pytest.mark.parametrize("target", ["me-f3", "me-f5", "me-f8"])
def test_me_figures_run_the_paper_s_checkpoint_rule_without_an_idle_key(target, tmp_path):
    real_data()
    planned = runs.plan(tables.get(target), 1, "subset", str(CIFAR_SUBSET), tmp_path, {}, paper_selection=True)
    chose = [p for p in planned if p.row.selection.startswith("best PGD-20 robustness on the test set")]
    assert chose and all(p.sets["train.select_split"] == "test" and p.sets["train.val_attack"] == "pgd20"
                         for p in chose)
    # nothing is held out under the paper's rule, so no preset may hold a validation size that would do nothing
    assert not [w for p in planned for w in check_config(config.resolve(p.row.preset, None, p.sets))]
