"""bench/speed_report.py and the rule it shares with the package (fastfair/gpu_defaults.py): the shipped figures, the
speed table and the README's speed section agree with bench/results; synthetic GPU results give every outcome of
the CUDA defaults."""
import json
import shutil

import pytest

from bench import common, speed_report
from fastfair import gpu_defaults, gpu_figures


def test_the_shipped_figures_the_table_and_the_readme_agree_with_bench_results():
    assert speed_report.stale() == [], "run: python bench/speed_report.py --write"


def test_a_new_result_makes_every_generated_file_stale(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(common.RESULTS, results)
    write_training(results, "NVIDIA H100 80GB HBM3", "2027-01-02T00:00:00Z", [fastfair_row(True, False, 9000.0)])
    assert set(speed_report.stale(results)) == {speed_report.FIGURES, speed_report.TABLE, speed_report.README}
    assert "| NVIDIA H100 80GB HBM3, 2027-01-02, 2.13.0 | pgd-at resnet18, batch 128 | fastfair, CUDA graphs, " \
           "Python wrapper | 9,000 | 5.6 |" in speed_report.outputs(results)[speed_report.TABLE]
    # the README's headline is the fastest measured fastfair step: the new H100 row
    assert "on an NVIDIA H100 80GB HBM3 (2027-01-02, torch 2.13.0, fastfair, CUDA graphs, Python wrapper): 5.6 s per " \
           "50k-image epoch" in speed_report.outputs(results)[speed_report.README]


def test_the_headline_says_when_no_gpu_measured_a_step():
    fig = speed_report.figures(speed_report.common.RESULTS)
    assert speed_report.headline({**fig, "training": []}).startswith("- No GPU has measured a training step yet.\n")


def test_the_readme_needs_its_markers():
    with pytest.raises(SystemExit, match="no speed-table markers"):
        speed_report.readme_with("table", "# README without the section\n")


# ---- synthetic GPU results --------------------------------------------------------------------------

def write_training(results, device, when, rows, name="plan"):
    head = {"device": device, "device_type": "cuda", "torch": "2.13.0+cu130", "time_utc": when}
    path = results / f"training-{name}-{common.slug(device)}-{when[:10]}.json"
    path.write_text(json.dumps({"bench": "training", "smoke": False, "header": head, "rows": rows}))


def fastfair_row(graphs, wrapper, img_s, batch=128, **extra):
    return {"method": "pgd-at", "model": "resnet18", "batch": batch, "rung": "fastfair", "graphs": graphs,
            "cpp_wrapper": wrapper, "images_per_s": img_s, **extra}


def write_graphs_test(results, outcome):
    suite = results / "gpu-suite"
    suite.mkdir(parents=True, exist_ok=True)
    (suite / "gpu-tests.json").write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3",
                                                       "time_utc": "2027-01-03T00:00:00Z", "status": "ok"}))
    body = {"passed": "", "failed": "<failure message='apart'/>", "skipped": "<skipped/>"}[outcome]
    (suite / "gpu-tests-junit.xml").write_text(
        f'<testsuite><testcase classname="tests.test_compiled_step" name="{speed_report.GRAPHS_TEST}[pgd-at]" '
        f'time="3">{body}</testcase><testcase name="test_other"/></testsuite>')


def defaults(results):
    fig = gpu_figures.from_dict(speed_report.figures(results))
    graphs = gpu_defaults.cudagraphs(fig)
    return graphs, gpu_defaults.cpp_wrapper(fig, graphs.on)


H100, DAY1, DAY2 = "NVIDIA H100 80GB HBM3", "2027-01-01T00:00:00Z", "2027-01-02T00:00:00Z"


def test_before_any_measurement_graphs_rest_on_the_prediction_and_the_wrapper_is_off(tmp_path):
    graphs, wrapper = defaults(tmp_path)
    assert (graphs.on, graphs.measured, wrapper.on, wrapper.measured) == (True, False, False, False)
    assert "not measured on a GPU yet" in wrapper.why
    shutil.copy(speed_report.codegen_file(common.RESULTS), tmp_path)
    graphs, _ = defaults(tmp_path)
    assert graphs.why.startswith("PREDICTED, no GPU measured them yet: pgd-at resnet18 batch 128 issues 2,436")


@pytest.mark.parametrize("with_graphs, without, on", [(9000.0, 3000.0, True),  # faster: on
                                                       (2950.0, 3000.0, True),  # within the noise: stays on
                                                       (2500.0, 3000.0, False),  # slower: off
                                                       (None, 3000.0, False)])  # failed with graphs: off
def test_graphs_follow_the_measurement(tmp_path, with_graphs, without, on):
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, with_graphs, note="failed: RuntimeError"),
                                          fastfair_row(False, False, without)])
    graphs, _ = defaults(tmp_path)
    assert (graphs.on, graphs.measured) == (on, True)
    assert "on an NVIDIA H100 80GB HBM3 (2027-01-01)" in graphs.why


def test_graphs_that_fell_back_in_the_runs_own_check_count_as_failing(tmp_path):
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, 3000.0, graphs_fell_back=True,
                                                       note="failed with CUDA graphs, fell back: ..."),
                                          fastfair_row(False, False, 3000.0)])
    graphs, _ = defaults(tmp_path)
    assert (graphs.on, graphs.measured) == (False, True) and "3,000 img/s after falling back with" in graphs.why


@pytest.mark.parametrize("note", ["refused: train.cudagraphs=on and train.cpp_wrapper=on: ...",
                                  "not compiled within 240 s (stopped)", "skipped: CUDA graphs need CUDA"])
def test_a_configuration_that_did_not_run_measured_nothing(tmp_path, note):
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, None, note=note),
                                          fastfair_row(False, False, 3000.0)])
    graphs, _ = defaults(tmp_path)
    assert (graphs.on, graphs.measured) == (True, False)


def test_the_latest_measurement_of_a_configuration_counts(tmp_path):
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, 2000.0), fastfair_row(False, False, 3000.0)])
    assert not defaults(tmp_path)[0].on
    write_training(tmp_path, H100, DAY2, [fastfair_row(True, False, 9000.0)])  # graphs measured again, faster
    assert defaults(tmp_path)[0].on


@pytest.mark.parametrize("outcome, on", [("failed", False), ("passed", True), ("skipped", True)])
def test_a_failed_graphs_test_turns_graphs_off(tmp_path, outcome, on):
    write_graphs_test(tmp_path, outcome)
    graphs, _ = defaults(tmp_path)
    assert graphs.on == on and (outcome != "failed" or "the GPU test of CUDA graphs failed" in graphs.why)


def test_the_wrapper_goes_on_only_once_faster_in_every_configuration_measured_both_ways(tmp_path):
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, 9000.0), fastfair_row(False, False, 3000.0),
                                          fastfair_row(True, True, 9500.0)])
    graphs, wrapper = defaults(tmp_path)
    assert graphs.on and (wrapper.on, wrapper.measured) == (True, True)
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, 20000.0, batch=512),
                                          fastfair_row(True, True, 19000.0, batch=512)], name="b512")
    _, wrapper = defaults(tmp_path)
    assert (wrapper.on, wrapper.measured) == (False, True) and "batch 512" in wrapper.why


def test_a_wrapper_measured_only_without_graphs_says_nothing_about_the_default_with_them(tmp_path):
    write_training(tmp_path, H100, DAY1, [fastfair_row(False, True, 5000.0), fastfair_row(False, False, 3000.0)])
    graphs, wrapper = defaults(tmp_path)
    assert graphs.on and not graphs.measured
    assert (wrapper.on, wrapper.measured) == (False, False) and "with CUDA graphs" in wrapper.why
    assert gpu_defaults.cpp_wrapper(gpu_figures.from_dict(speed_report.figures(tmp_path)), False).on


def test_train_auto_switches_follow_the_figures_the_package_ships(tmp_path, monkeypatch):
    import torch

    from fastfair import build, config

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    cfg = config.resolve(flags={"method.name": "pgd-at", "model.name": "resnet18"})
    assert build.auto_cudagraphs(cuda) and not build.auto_cpp_wrapper(cuda)  # today's figures: the prediction
    write_training(tmp_path, H100, DAY1, [fastfair_row(True, False, 2000.0), fastfair_row(False, False, 3000.0),
                                          fastfair_row(False, True, 4000.0)])
    monkeypatch.setattr(gpu_figures, "shipped", lambda: gpu_figures.from_dict(speed_report.figures(tmp_path)))
    assert not build.auto_cudagraphs(cuda) and build.cudagraphs(cfg, cuda) == (False, "")  # measured slower: off
    assert build.auto_cpp_wrapper(cuda) and build.cpp_wrapper(cfg, cuda)  # faster without graphs, as they now are
    assert not build.auto_cudagraphs(cpu) and not build.auto_cpp_wrapper(cpu)
