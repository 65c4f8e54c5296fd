"""--per-gpu auto (fastfair/scaleout/per_gpu.py): the rule on given figures, the grid's dry run as a user types it,
and bad values."""
import pytest

from bench.common import switch
from fastfair import cli, config, gpu_figures
from fastfair.errors import UserError
from fastfair.reproduce.command import reproduce
from fastfair.scaleout import per_gpu
from fastfair.scaleout.per_gpu import Gpu, choose

H200 = Gpu("NVIDIA H200", 139.8)
H100 = Gpu("NVIDIA H100 80GB HBM3", 79.2)


def row(method="pgd-at", model="resnet18", batch=128, launches=2436, outside=16, gpu_ms=10.0, memory=2.0,
        bn_mode="train", objective="ce"):
    return {"method": method, "model": model, "batch": batch, "bn_mode": bn_mode, "objective": objective,
            "launches": launches, "launches_outside": outside, "memory_gib": memory,
            "s_gpu": {f: gpu_ms / 1e3 for f in gpu_figures.FAMILIES}}


def figures(predicted=(), training=(), concurrency=()) -> gpu_figures.Figures:
    return gpu_figures.Figures(19.2, "given", "given", tuple(predicted), tuple(training), tuple(concurrency), ())


def run(method="pgd-at", model="resnet18", batch=128, graphs=False, dataset="cifar10"):
    cfg = config.resolve(flags={"method.name": method, "model.name": model, "data.dataset": dataset})
    return config.apply(cfg, {"data.batch_size": batch, "train.cudagraphs": switch("train.cudagraphs", graphs)},
                        "the test")


def test_a_host_bound_step_fills_the_gpu_with_ceil_host_over_gpu_runs():
    fig = figures([row()])  # 2436 launches x 19.2 us = 46.8 ms of host time for 10 ms of GPU work
    choice = choose([run()], [H200], cores=32, fig=fig)
    assert choice.k == 5
    assert "46.8 ms of launches per step for 10.0 ms of GPU work (PREDICTED)" in choice.why
    assert choice.line().startswith("--per-gpu auto: 5 runs per GPU: pgd-at resnet18 batch 128 without CUDA graphs")


def test_a_graphed_step_issues_only_its_outside_launches_so_one_run_fills_the_gpu():
    choice = choose([run(graphs=True)], [H200], cores=32, fig=figures([row()]))
    assert choice.k == 1 and "0.3 ms of launches" in choice.why


def test_memory_and_host_cores_bound_k():
    fig = figures([row(memory=40.0)])
    assert choose([run()], [H100], cores=32, fig=fig).k == 1  # 80% of 79.2 GiB holds one 40 GiB run
    assert choose([run()], [H200], cores=32, fig=fig).k == 2
    assert "lets 2 fit in 80% of 140 GiB" in choose([run()], [H200], cores=32, fig=fig).why
    capped = choose([run()], [H200, H200], cores=8, fig=figures([row()]))  # 8 cores, 2 runs each, two GPUs
    assert capped.k == 2 and "8 host cores allow 2" in capped.why


def test_memory_follows_the_batch_through_the_counted_sizes():
    fig = figures([row(batch=128, memory=2.0), row(batch=512, memory=5.0, gpu_ms=40.0)])
    assert gpu_figures.predicted_memory_gib(fig, "pgd-at", "resnet18", 256) == pytest.approx(3.0)
    # batch 1024 predicts 9 GiB; 80% of 20 GiB holds one
    assert choose([run(batch=1024)], [Gpu("small", 20.0)], cores=32, fig=fig).k == 1


def test_a_measured_concurrency_curve_wins_over_the_prediction():
    curve = [{"device": "NVIDIA H200", "time_utc": "2027-01-01T00:00:00Z", "method": "pgd-at", "model": "resnet18",
              "batch": 128, "graphs": False, "cpp_wrapper": False, "k": k, "images_per_s": v}
             for k, v in ((1, 2700.0), (2, 5000.0), (4, 9000.0), (8, 9200.0))]
    fig = figures([row()], concurrency=curve)
    choice = choose([run()], [H200], cores=32, fig=fig)
    assert choice.k == 4 and "measured on an NVIDIA H200" in choice.why and "K=8 9,200" in choice.why
    other = choose([run()], [H100], cores=32, fig=fig)  # another GPU model: the prediction, ceil(46.8 / 10)
    assert other.k == 5 and "PREDICTED" in other.why


def test_a_method_without_figures_borrows_a_step_like_its_own_and_says_so():
    fig = figures([row(), row(method="trades", launches=1499, gpu_ms=9.0, bn_mode="eval", objective="kl")])
    choice = choose([run(method="me-trades")], [H200], cores=32, fig=fig)  # TRADES's attack: BN eval, KL
    assert choice.k == 4 and "counted as trades (its attack: BN eval, kl)" in choice.why
    nearest = choose([run(batch=200)], [H200], cores=32, fig=fig)
    assert "counted at batch 128" in nearest.why


def test_without_figures_another_image_size_or_a_gpu_auto_is_one():
    fig = figures([row()])
    assert choose([run(model="wrn-28-10")], [H200], cores=32, fig=fig).k == 1
    assert "no figures for pgd-at on wrn-28-10" in choose([run(model="wrn-28-10")], [H200], cores=32, fig=fig).why
    assert choose([run(dataset="mnist")], [H200], cores=32, fig=fig).k == 1
    cpu = choose([run()], [], cores=32, fig=fig)
    assert cpu.k == 1 and cpu.line() == ("--per-gpu auto: 1 run at a time: no GPU, and each run's PyTorch threads "
                                         "already use every core")
    both = choose([run(), run(graphs=True)], [H200], cores=32, fig=fig)  # the grid's most constrained step
    assert both.k == 1


def test_the_shipped_figures_cover_the_counted_models():
    fig = gpu_figures.shipped()
    assert {(r["model"], r["batch"]) for r in fig.predicted} >= {("resnet18", 128), ("wrn-34-10", 512)}
    assert choose([run()], [H200], cores=16, fig=fig).k > 1  # the H200's host-bound default before CUDA graphs


@pytest.mark.parametrize("value", ["0", "-1", "x", "2.5", ""])
def test_bad_values_are_one_user_error(value):
    with pytest.raises(UserError, match="--per-gpu takes a number of runs per GPU .* or auto"):
        per_gpu.parse(value)
    assert per_gpu.parse("auto") == "auto" and per_gpu.parse(" 3 ") == 3 and per_gpu.parse(2) == 2


def test_the_python_api_checks_what_the_cli_checks():
    with pytest.raises(UserError, match="--per-gpu takes"):
        reproduce("me-t2", per_gpu=0)


GRID = '[set]\n"method.name" = "me-trades"\n"model.name" = "resnet18"\n"data.dataset" = "cifar10"\n' \
       '[[axes]]\nkey = "train.seed"\nvalues = [0, 1]\n'


def test_the_grid_dry_run_shows_k_and_why(tmp_path, capsys, monkeypatch):
    (tmp_path / "g.toml").write_text(GRID)
    monkeypatch.setattr(gpu_figures, "shipped", lambda: figures([row(method="me-trades", bn_mode="eval",
                                                                         objective="kl", launches=1499, gpu_ms=9.0)]))
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    monkeypatch.setattr(per_gpu, "visible", lambda gpus: [H200] * len(gpus))
    monkeypatch.setattr(per_gpu, "host_cores", lambda: 16)
    argv = ["grid", str(tmp_path / "g.toml"), "--out", str(tmp_path / "out"), "--dry-run"]
    assert cli.main(argv + ["--set", "train.cudagraphs=false"]) == 0
    out = capsys.readouterr().out
    assert ("--per-gpu auto: 4 runs per GPU: me-trades resnet18 batch 128 without CUDA graphs issues 28.8 ms of "
            "launches per step for 9.0 ms of GPU work (PREDICTED); 2.0 GiB a run (predicted) lets 55 fit in 80% of "
            "140 GiB; 16 host cores allow 8") in out
    assert cli.main(argv + ["--per-gpu", "2"]) == 0
    assert "--per-gpu auto" not in capsys.readouterr().out  # a number is taken as it is
    assert cli.main(argv + ["--per-gpu", "two"]) == 2
    assert capsys.readouterr().err.strip() == ("fastfair: error: --per-gpu takes a number of runs per GPU (1, 2, ...) "
                                               "or auto; got 'two'")
    assert not (tmp_path / "out").exists()
