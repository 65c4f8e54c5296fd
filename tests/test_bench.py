"""bench/ helpers against hand-computed values: FLOP counts, peaks, timing, saving, the reference data path."""
import json

import pytest
import torch
from torch import nn

from bench import bench_mfu, bench_training, common, reference_loop
from bench.investigations import check_bf16_robustness
from fastfair.data import DATASETS
from fastfair.models import MODELS

C, D = 10, 12  # classes; features of the test model: 3 channels pooled to 2x2


@pytest.fixture(autouse=True, scope="module")
def _registries_as_shipped():
    """What this module registers (its test model, bench's synthetic data sets) is unregistered after it: a later test
    in the same worker reads the registries as shipped (test_known compares them with fastfair/known.json)."""
    before = set(MODELS), set(DATASETS)
    yield
    for registry, names in zip((MODELS, DATASETS), before):
        for name in set(registry) - names:
            registry.unregister(name)


@pytest.fixture(scope="module")
def linear_model():
    """A model whose FLOPs are easy to count by hand: pool to (3, 2, 2), flatten, one linear head."""
    if "bench-test-linear" not in MODELS:
        MODELS.register("bench-test-linear", "tests only")(
            lambda in_channels, norm, width: (nn.Sequential(nn.AdaptiveAvgPool2d(2), nn.Flatten()), 4 * in_channels))
    return "bench-test-linear"


def trainer(tmp_path, model, method, k):
    ds = common.register_synthetic(16, 0, (3, 8, 8))
    over = {"data.batch_size": 4, "train.device": "cpu", "attack.steps": k, **bench_training.START}
    return common.make_trainer(method, model, ds, over, tmp_path / method)


@pytest.mark.parametrize("method, k, fastfair, reference", [
    # F = 2 D C = 240 per image (one addmm). fastfair PGD-k: k x (forward + input grad) with frozen
    # weights, then forward + weight grad (x' needs no grad): 480 k + 480. The reference also takes
    # the weight grad in each attack step: 720 k + 480.
    ("pgd-at", 3, 480 * 3 + 480, 720 * 3 + 480),
    # TRADES: one natural forward for the attack target, k x 480, then two forwards + two weight
    # grads: 240 + 480 k + 960. The reference (TRADES code) recomputes the natural forward in every
    # attack step (240 + 240 + 240 per step), forwards x three times in the loss and takes weight
    # grads through all three (its KL target is not detached): 720 k + 720 + 720.
    ("trades", 3, 240 + 480 * 3 + 960, 720 * 3 + 720 + 720),
])
def test_step_flops_match_hand_count(tmp_path, linear_model, method, k, fastfair, reference):
    flops = bench_mfu.step_flops(trainer(tmp_path, linear_model, method, k), method)
    assert flops == {"forward": 2 * D * C, "fastfair": fastfair, "reference": reference}


def test_peak_table_matches_device_names():
    assert bench_mfu.peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert bench_mfu.peak_tflops("NVIDIA H100 PCIe") == 756.5
    assert bench_mfu.peak_tflops("NVIDIA H200") == 989.4
    assert bench_mfu.peak_tflops("Tesla T4") is None


def test_missing_config_keys_and_gpu_only_rungs_are_skipped_with_reasons():
    rung = bench_training.Rung("x", "x", "fastfair", {"train.no_such_key": True}, gpu_only="needs CUDA")
    assert bench_training.skip_reason(rung, torch.device("cpu")) == \
        "fastfair has no config key train.no_such_key yet; needs CUDA"
    assert bench_training.skip_reason(bench_training.RUNGS[3], torch.device("cpu")) is None  # channels_last
    assert all(common.has_key(k) for k in bench_training.START)
    assert not common.has_key("train.no_such_key") and not common.has_key("nosection.x")


def test_time_steps_runs_warmup_then_repeated_windows_on_consecutive_batches():
    seen = []
    common.time_steps(lambda x, y: seen.append((x, y)), [(0, 0), (1, 1)], steps=2, warmup=1, dev=torch.device("cpu"),
                      repeats=3)
    assert seen == [(0, 0), (1, 1), (0, 0), (1, 1), (0, 0), (1, 1), (0, 0)]  # 1 + 3 x 2, passes restart at the end


def test_save_writes_json_and_markdown(tmp_path):
    head = common.header(torch.device("cpu"))
    rows = [{"a": 1.5, "b": None}, {"a": 12345.0, "b": "x"}]
    body = common.markdown_table(rows, [("a", "A"), ("b", "B")])
    assert body == "| A | B |\n|---|---|\n| 1.5 | - |\n| 12,345 | x |"
    js, md = common.save("t", head=head, settings={"s": 1}, rows=rows, body=body, out_dir=tmp_path, smoke=True)
    assert (js.name, md.name) == ("t-smoke-cpu.json", "t-smoke-cpu.md")
    assert json.loads(js.read_text())["rows"] == rows
    text = md.read_text()
    assert "CPU smoke run" in text and head["torch"] in text and body in text


def test_reference_dataset_is_torchvision_to_tensor_without_augmentation():
    x = torch.randint(0, 256, (2, 3, 5, 4), dtype=torch.uint8)
    ds = reference_loop.TorchvisionStyleDataset(x, torch.tensor([3, 7]), padding=0, flip=False)
    img, label = ds[1]
    assert label == 7
    torch.testing.assert_close(img, x[1].float() / 255)


def test_bf16_verdict_uses_binomial_standard_error():
    rows = [{"train_amp": "off", "pgd20": 50.0, "test_images": 1000},
            {"train_amp": "bf16", "pgd20": 48.0, "test_images": 1000}]
    v = check_bf16_robustness.verdict(rows)
    assert v["difference"] == -2.0
    assert v["se_difference"] == pytest.approx(100 * (0.25 / 1000 + 0.2496 / 1000) ** 0.5)
    assert v["within_noise"]
    rows[1]["pgd20"] = 44.0
    assert not check_bf16_robustness.verdict(rows)["within_noise"]


def test_a_failing_rung_is_recorded_and_the_bench_goes_on(monkeypatch):
    def boom(*args, **kw):
        raise RuntimeError("Triton compilation failed\nlong details")

    monkeypatch.setattr(bench_training, "measure", boom)
    assert bench_training.run_one(bench_training.RUNGS[0], {}) == (
        None, "failed: RuntimeError: Triton compilation failed")


class FakePool:
    """bench/pool.Pool without processes: every spec compiles unless named in ``slow``; timings are canned."""
    slow: set = set()
    made: list = []

    def __init__(self, specs, args, dev):
        self.specs = {s.name: s for s in specs}
        self.warm_s = {n: 1.0 for n in self.specs}
        FakePool.made.append(sorted(self.specs))

    def warm(self, deadline_s):
        return {n: f"not compiled within {deadline_s:.0f} s (stopped)" if n in self.slow else "warm"
                for n in self.specs}

    def solo(self, name):
        return {"reference": 2.0, "fastfair": 1.0, "allocator_gib": 1.5, "process_gib": 2.0}

    def close(self):
        pass


def test_the_plan_times_each_configuration_beside_its_reference_and_a_rerun_times_only_what_is_left(tmp_path,
                                                                                                    monkeypatch):
    from bench import bench_matrix

    monkeypatch.setattr(bench_matrix, "Pool", FakePool)
    FakePool.made.clear()
    left = "trades tiny-cnn 16 fastfair, no CUDA graphs, Python wrapper (this device's defaults)"
    FakePool.slow = {left}
    argv = ["--smoke", "--device", "cpu", "--out", str(tmp_path)]
    assert bench_matrix.main(argv) == 3  # one configuration left
    rows = json.loads((tmp_path / "training-plan-smoke-cpu.json").read_text())["rows"]
    timed = [r for r in rows if r["loop"] == "fastfair" and r["images_per_s"]]
    assert len(timed) == 3 and all(r["x_reference"] == 2.0 and r["memory_gib"] == 2.0 for r in timed)
    assert [r["loop"] for r in rows].count("reference") == 3  # each beside its own reference
    assert any(r["note"] == "skipped: CUDA graphs need CUDA" for r in rows)
    assert any((r["note"] or "").startswith("not compiled within") for r in rows)
    FakePool.slow = set()
    assert bench_matrix.main(argv) == 0
    assert FakePool.made[-1] == [left]  # only the one left
    rows = json.loads((tmp_path / "training-plan-smoke-cpu.json").read_text())["rows"]
    assert len([r for r in rows if r["loop"] == "fastfair" and r["images_per_s"]]) == 4


def test_a_pool_stops_what_has_not_compiled_by_its_deadline(tmp_path):
    from argparse import Namespace

    from bench.pool import Pool, Spec

    args = Namespace(train_images=64, image_shape=[3, 8, 8], attack_steps=1, width=4, workers=0, warmup=1)
    pool = Pool([Spec("slow", "pgd-at", "tiny-cnn", 8, 1)], args, torch.device("cpu"))
    try:
        assert pool.warm(0.01) == {"slow": "not compiled within 0 s (stopped)"}
        assert not pool.procs["slow"].is_alive()
    finally:
        pool.close()
