"""Issue 58, item 5: an attack that stalls on NaN input gradients is flagged, not read as robustness.

The model of the issue, ``net(x) + 0 * sqrt(x)``: finite outputs, and at every zero pixel (half of the digits' pixels)
an input gradient of 0 * inf = NaN, along which no sign step moves, so PGD scores it higher than the same net. Every
gradient attack counts such images on the device (fastfair.attacks.pgd.flag_masked; AutoAttack, whose steps run in
its package: one input gradient at each clean image before it runs), and the count is said in eval's table (its
header and the note under it), the JSON entry, ``Result`` and the report. A normal model gets no flag, and the count
takes no host sync inside the attack's steps.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import fastfair
from fastfair.attacks import PGD, autoattack, parse_attack
from fastfair.data import DATASETS
from fastfair.evaluation import measures, per_image
from fastfair.evaluation.result import Result
from fastfair.reports import report

from evalreport_helpers import cheap_aa_backend
from test_compiled_step import NoHostSync

MASKED_HEADER = "pgd10 [gradient masked: "


class NaNPath(nn.Module):
    """``net(x) + 0 * sqrt(x)``, the issue's model: the same logits, NaN input gradients at zero pixels."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x) + 0 * torch.sqrt(x).flatten(1).sum(1, keepdim=True)


@pytest.fixture(scope="module")
def digits_and_net():
    """The built-in digits' test split and a small MLP trained on its training split (a second of CPU)."""
    b = DATASETS.get("digits").load(None)
    x_train, y_train = b.x_train.float() / 255, b.y_train
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for _ in range(20):
        for i in range(0, len(x_train), 64):
            opt.zero_grad()
            nn.functional.cross_entropy(net(x_train[i:i + 64]), y_train[i:i + 64]).backward()
            opt.step()
    return (b.x_test.float() / 255, b.y_test), net.eval()


def test_nan_gradients_are_flagged_in_the_result_its_json_and_its_table(tmp_path, digits_and_net):
    data, net = digits_and_net
    x = data[0]
    kw = dict(attacks=["clean", "pgd10", "nattack2"], eps=0.1, alpha=0.025, progress=False)
    plain = fastfair.evaluate(net, data, **kw)
    masked = fastfair.evaluate(NaNPath(net), data, out=tmp_path / "masked.json", **kw)
    # the stall the issue saw: the same logits, a higher PGD score; every image holds a zero pixel
    assert masked.avg("clean") == plain.avg("clean")
    assert masked.avg("pgd10") > plain.avg("pgd10") + 3
    flagged = int((x == 0).flatten(1).any(1).sum())
    assert flagged == len(x) == 360
    assert masked.gradient_masked("pgd10") == flagged
    assert plain.gradient_masked("pgd10") == 0  # a normal model: counted, and none
    assert masked.gradient_masked("clean") is None and masked.gradient_masked("nattack2") is None  # no gradients
    # the JSON keeps it; Result, its table (eval prints the same rows and notes) and its repr say it
    back = Result.load(tmp_path / "masked.json")
    assert back.record["results"]["pgd10"][measures.MASKED] == flagged
    header, _ = measures.table_rows(back.record["results"], back.classes)
    assert header[2] == f"{MASKED_HEADER}{flagged}]"
    note = f"pgd10: gradient masked on {flagged} of 360 images: their input gradient held NaN or inf"
    assert any(line.startswith(note) for line in per_image.table_notes(back.record["results"]))
    assert MASKED_HEADER in str(back) and note in str(back) and "gradient masked on 360 images" in repr(back)
    assert "gradient masked" not in str(plain) + repr(plain)
    # the report's per-class table and the notes under it, for one seed and summed over two
    for recs in ([back.record], [back.record, back.record]):
        table = {n: report.group_entry(recs, n) for n in back.attacks}
        shown = measures.markdown_table(table, back.classes)
        assert f"| {MASKED_HEADER}{flagged * len(recs)}] |" in shown
        assert any(line.startswith(note) for line in report.group_notes(recs, back.attacks))


def test_the_count_takes_no_host_sync_in_the_steps(digits_and_net):
    """The flags are set on the device step by step: the attack's steps run under a tracer that fails on any host
    read; the flags equal a check of every step's gradient made outside it."""
    data, net = digits_and_net
    x, y = data[0][:40].clone(), data[1][:40]
    x[:20] = x[:20].clamp_min(0.2)  # no pixel reaches 0 within eps 0.1: these 20 images have finite gradients
    eps = torch.full((10,), 0.1)
    flags = torch.zeros(len(x), dtype=torch.bool)
    with NoHostSync():
        PGD(steps=3, restarts=2, init="uniform")(NaNPath(net), x, y, eps, eps / 4, masked=flags)
    assert flags.tolist() == [False] * 20 + [True] * 20
    with NoHostSync():  # the eval attack passes them on the same way (cw20: the margin objective)
        parse_attack("cw20")(NaNPath(net), x, y, eps, eps / 4, masked=(cw := torch.zeros(len(x), dtype=torch.bool)))
    assert cw.tolist() == flags.tolist()


def test_autoattack_checks_the_input_gradient_before_it_runs(monkeypatch, digits_and_net):
    """AutoAttack's steps run inside its package: the count comes from one input gradient at each clean image, said
    in the record as what it is."""
    monkeypatch.setitem(autoattack.BACKENDS._items, "cheap", (cheap_aa_backend, "test stand-in"))
    data, net = digits_and_net
    x, y = data[0][:30].clone(), data[1][:30]
    x[:10] = x[:10].clamp_min(0.01)
    kw = dict(attacks=["aa"], eps=0.1, aa_backend="cheap", progress=False)
    masked = fastfair.evaluate(NaNPath(net), (x, y), **kw)
    assert masked.gradient_masked("aa") == 20
    assert masked.record["results"]["aa"]["autoattack"]["gradient_check"] == autoattack.GRADIENT_CHECK
    assert fastfair.evaluate(net, (x, y), **kw).gradient_masked("aa") == 0
