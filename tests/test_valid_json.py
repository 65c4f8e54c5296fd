"""Every JSON file fastfair writes is valid JSON (issue 49): Python's ``json`` writes NaN and inf as bare ``NaN`` and
``Infinity``, which most readers refuse and which say nothing. fastfair's one JSON writer refuses them
(``allow_nan=False``), and a value that can be undefined is written as null by the code that knows why: a class
without images in the evaluated data (named in the record's ``absent_classes``), a rank correlation of constant
values (docs/reliability.md, "Numbers").
"""
from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest

from fastfair import cli
from fastfair.rundir import append_jsonl, read_json, write_json_atomic
from helpers import run_without_some_classes
from shared_runs import figures_unrendered

C = 10


def strict_json(text: str):
    """``json.loads`` as a strict reader (JavaScript's JSON.parse, Go, jq) reads: NaN and Infinity refused."""
    def refuse(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.mark.fault
def test_the_json_writers_refuse_nan_and_inf_and_write_null(tmp_path):
    for bad in (float("nan"), float("inf"), -float("inf")):
        with pytest.raises(ValueError, match=r"r.json: Out of range float values are not JSON compliant"):
            write_json_atomic({"cells": [1.0, bad]}, tmp_path / "r.json")
        with pytest.raises(ValueError, match=r"metrics.jsonl: Out of range float values are not JSON compliant"):
            append_jsonl({"epoch": 1, "loss": bad}, tmp_path / "metrics.jsonl")
    assert not (tmp_path / "r.json").exists() and not (tmp_path / "metrics.jsonl").exists()
    write_json_atomic({"cells": [1.0, None]}, tmp_path / "r.json")
    assert strict_json((tmp_path / "r.json").read_text())["cells"] == [1.0, None]
    assert read_json(tmp_path / "r.json") == {"cells": [1.0, None]}


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    """A run whose test split holds classes 0-4 only, diagnosed: (run, what diagnose printed)."""
    tmp = tmp_path_factory.mktemp("absent")
    run = run_without_some_classes(tmp, range(5))
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert cli.main(["diagnose", str(run), "--attack", "fgsm", "--tsne", "0", "--device", "cpu"]) == 0
    return run, printed.getvalue()


@pytest.mark.fault
def test_diagnose_writes_an_absent_class_as_null_and_names_it(diagnosed):
    """diagnose's record was NaN in every per-class cell of classes 5-9 (invalid JSON), their nearest class a
    made-up one, and the present classes' nearest neighbours could be absent ones (a cosine of 0 to a zero mean)."""
    run, printed = diagnosed
    assert "shown as -): class 5, class 6, class 7, class 8, class 9" in printed
    (path,) = (run / "diagnostics").glob("*.json")
    record = strict_json(path.read_text())
    assert record["absent_classes"] == [f"class {k}" for k in range(5, C)]
    for tag in ("clean", "adv"):
        for cells in (record["accuracy"][tag], record["cvc"][tag], record["entropy"][tag]["per_class"],
                      record["inter_class_similarity"][tag], record["nearest_class"][tag],
                      record["intra_class_variance"][tag], record["logit_similarity"][tag]["max"],
                      record["logit_similarity"][tag]["nearest"], record["logit_similarity"][tag]["mean"]):
            assert cells[5:] == [None] * 5 and None not in cells[:5], cells
        assert set(record["nearest_class"][tag][:5]) <= set(range(5))  # no absent class is anyone's neighbour
        assert set(record["logit_similarity"][tag]["nearest"][:5]) <= set(range(5))
        matrix = np.array(record["logit_similarity"][tag]["matrix"], dtype=float)  # null as NaN
        assert np.isnan(matrix[5:]).all() and np.isnan(matrix[:, 5:]).all() and not np.isnan(matrix[:5, :5]).any()
    assert record["confusion_percent"][5:] == [[None] * C] * 5


@pytest.mark.slow
def test_the_report_of_diagnostics_with_absent_classes_shows_dashes_and_names_them(diagnosed, tmp_path, monkeypatch):
    run, _ = diagnosed
    figures_unrendered(monkeypatch)  # what report.md says is the subject; test_report renders figures
    assert cli.main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| class 9 | - | - | - | - | - | - |" in md  # the diagnostics table's row of an absent class
    assert md.count("shown as -): class 5, class 6, class 7, class 8, class 9") >= 2
