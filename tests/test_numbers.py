"""No silent wrong number (issue 49, items 1 and 2): classes absent from the evaluated images are left out of
every summary and named, rather than reported at 0 %; NaN or inf logits and images are refused before any number
is printed or written."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastfair
from evalreport_helpers import cheap_aa_backend
from fastfair import cli
from fastfair.attacks import autoattack
from fastfair.data import DeviceLoader
from fastfair.evaluation import measures, per_class
from fastfair.reproduce import paper, verdict, write
from helpers import run_without_some_classes

C = 10


class ReadsItsLabel(torch.nn.Module):
    """A 10-class model that reads an image's class from its first pixel (k / 10) and predicts it, except that it
    calls class 4 class 0: per class 100 % on 0-3, 0 % on 4."""

    def __init__(self, outputs: int = C):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.outputs = outputs

    def forward(self, x):
        k = (x[:, 0, 0, 0] * 10).round()
        k = torch.where(k == 4, torch.zeros_like(k), k)
        return -self.scale * (torch.arange(self.outputs, dtype=x.dtype) - k[:, None]) ** 2


def images_of(classes, per_class_count: int = 3, generator_seed: int = 0):
    """``per_class_count`` images of each class in ``classes``, each carrying its class in its first pixel."""
    g = torch.Generator().manual_seed(generator_seed)
    y = torch.tensor([k for k in classes for _ in range(per_class_count)])
    x = torch.rand(len(y), 3, 4, 4, generator=g)
    x[:, 0, 0, 0] = y / 10
    return x, y


def test_classes_absent_from_the_images_are_left_out_of_every_summary_and_named():
    """A 10-class model on images of classes 0-4: the mean, worst class, CV and MCD are of those five; classes
    5-9 are null, '-' in the table, named under it and in the record (they were 0 %: mean 40, CV 1600+)."""
    r = fastfair.evaluate(ReadsItsLabel(), images_of(range(5)), attacks=["clean"], progress=False)
    s = r.record["results"]["clean"]["summary"]
    want = {**{str(k): 100.0 for k in range(4)}, "4": 0.0, **{str(k): None for k in range(5, C)}}
    assert r.per_class("clean") == want
    assert r.absent_classes == ["5", "6", "7", "8", "9"] == r.record["absent_classes"]
    assert s["avg"] == pytest.approx(80.0) == s["overall"]  # five balanced classes: both averages agree
    assert (s["worst"], s["worst_class"], s["mcd"]) == (0.0, 4, 100.0)
    assert s["cv"] == pytest.approx(np.var([100, 100, 100, 100, 0]))
    assert s["worst20"] == 0.0 and s["worst10"] == 0.0  # ceil(0.2 * 5) = 1 class
    table = str(r)
    assert "| 7 | - |" in table and "shown as -): 5, 6, 7, 8, 9" in table
    assert "clean 80.00 (worst 0.00)" in repr(r)


def test_a_record_with_null_cells_reads_back_and_writes_valid_json(tmp_path):
    r = fastfair.evaluate(ReadsItsLabel(), images_of(range(5)), attacks=["clean"], progress=False,
                          out=tmp_path / "r.json")
    text = (tmp_path / "r.json").read_text()
    assert "NaN" not in text and json.loads(text)["results"]["clean"]["per_class"][9] is None
    back = fastfair.load_result(tmp_path / "r.json")
    assert back.per_class("clean") == r.per_class("clean") and back.absent_classes == r.absent_classes
    old = json.loads(text)
    del old["absent_classes"], old["content_sha256"]  # a record from before both keys still reads
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert fastfair.load_result(tmp_path / "old.json").absent_classes == []


def test_a_model_with_more_outputs_than_the_data_has_classes_is_refused():
    """12 logits for 10 classes: a prediction of class 11 for class 0 would land in cell (1, 1) of the confusion."""
    x, y = images_of(range(C))
    loader = DeviceLoader((x * 255).round().to(torch.uint8), y, 8, device="cpu", train=False)
    with pytest.raises(fastfair.UserError, match="returns 12 logits per image and the data has 10 classes"):
        per_class.evaluate(ReadsItsLabel(outputs=12), loader, ["clean"], eps=0.0, alpha=0.0,
                           classes=[str(k) for k in range(C)])


class NaNFor(torch.nn.Module):
    """ReadsItsLabel whose logits are NaN for images of the given classes."""

    def __init__(self, nan_classes):
        super().__init__()
        self.inner, self.nan_classes = ReadsItsLabel(), torch.tensor(nan_classes, dtype=torch.float32)

    def forward(self, x):
        logits = self.inner(x)
        bad = torch.isin((x[:, 0, 0, 0] * 10).round(), self.nan_classes)
        return torch.where(bad[:, None], torch.full_like(logits, float("nan")), logits)


def test_nan_logits_are_refused_with_the_count_before_any_number(tmp_path):
    """Before: argmax of a NaN row is class 0, so the model scored 10 % on the NaN images of class 0."""
    with pytest.raises(fastfair.UserError, match=r"NaN or inf logits for 6 of 30 images under clean; no result"):
        fastfair.evaluate(NaNFor([2, 7]), images_of(range(C)), attacks=["clean"], progress=False,
                          out=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_nan_logits_are_refused_by_autoattack(monkeypatch):
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (cheap_aa_backend, "test stand-in"))
    x, y = images_of(range(C))
    loader = DeviceLoader((x * 255).round().to(torch.uint8), y, 8, device="cpu", train=False)
    with pytest.raises(fastfair.UserError, match=r"NaN or inf logits for 3 of 30 images under AutoAttack"):
        autoattack.evaluate_split(NaNFor([5]), loader, eps=0.01, num_classes=C, backend="cheap")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_images_holding_nan_or_inf_are_refused_with_the_range_check(bad):
    """NaN compares False with both bounds, so the [0, 1] check passed it."""
    x, y = images_of(range(C))
    x[[4, 17], 1, 2, 3] = bad
    with pytest.raises(fastfair.UserError, match=r"2 of 30 images hold NaN or inf pixels \(first indices \[4, 17\]\)"):
        fastfair.evaluate(ReadsItsLabel(), (x, y), attacks=["clean"], progress=False)


def test_eval_and_report_of_a_test_set_without_some_classes_name_them(tmp_path, capsys):
    """The CLI route: a run whose test split holds classes 0-4 only; eval's table, the record and the report's
    Markdown and LaTeX tables leave 5-9 out and say so."""
    run = run_without_some_classes(tmp_path, range(5))
    capsys.readouterr()
    assert cli.main(["eval", str(run), "--attacks", "clean,fgsm", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "shown as -): class 5, class 6, class 7, class 8, class 9" in out
    (path,) = (run / "eval").glob("*-test.json")
    record = json.loads(path.read_text())
    assert record["absent_classes"] == [f"class {k}" for k in range(5, C)]
    cells = record["results"]["clean"]["per_class"]
    assert cells[5:] == [None] * 5
    assert record["results"]["clean"]["summary"]["avg"] == pytest.approx(np.mean(cells[:5]))
    assert cli.main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    md, tex = ((tmp_path / "report" / name).read_text() for name in ("report.md", "tables.tex"))
    assert "| class 9 | - |" in md and "shown as -): class 5, class 6" in md
    assert r"class 9 & - & - \\" in tex and "shown as -): class 5" in tex


def _record(per_class_cells):
    acc = np.asarray(per_class_cells, dtype=float)
    return {"results": {"pgd20": {"per_class": per_class_cells, "summary": measures.summary(acc)}}}


def test_reproduce_leaves_an_absent_class_out_of_its_tables_and_verdicts():
    classes = ["a", "b", "c"]
    recs = [_record([60.0, 20.0, None]), _record([62.0, 22.0, None])]
    table = write.protocol_table([("AT", "pgd-at", recs)], "pgd20", classes)
    assert "| 41.00 | 21.00 (b) | 400.00 | 40.00 | 61.0 | 21.0 | - |" in table and "shown as -): c" in table
    row = paper.PaperRow(preset="pgd-at", source="", table="", figure="", row="AT", follows="", selection="",
                         numbers={"pgd20": paper.Number(classes={"c": 30.0}, mcd=40.0)})
    recs += [_record([61.0, 21.3, None])]
    c, spread = verdict.compare_row(row, recs, True, classes)
    assert c.ours == [] and c.verdict == "no result"  # not "lower" from a 0 or a NaN
    assert spread.ours == pytest.approx([40.0, 40.0, 39.7]) and spread.verdict == "agrees"  # MCD of the present
