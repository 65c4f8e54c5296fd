"""train.cudagraphs and train.cpp_wrapper: what auto | on | off decide, the Inductor options they become, old
true / false configs, and the check of the first graphed steps with its fallback (fastfair/training/fallback.py).

No test here needs a GPU: the fallback is forced on a CPU with a "graphed" compiler that agrees, raises, runs
out of memory, raises after changing the state, or returns wrong values, against the plain (here: eager) step.
"""
import pytest
import torch
from torch._inductor import config as inductor_config

from fastfair import build, config
from fastfair.checks import check_config
from fastfair.errors import UserError
from fastfair.rundir import load_checkpoint
from fastfair.training import fallback
from fastfair.training.trainer import Trainer
from test_compiled_step import NoHostSync

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def cfg_with(*sets):
    return config.resolve("demo", {}, list(sets))


# ---- the decisions ---------------------------------------------------------------------------------------------

def test_auto_records_cuda_graphs_on_cuda_runs_that_compile_only():
    assert build.cudagraphs(cfg_with(), CUDA) == (True, "")  # train.compile auto: on for CUDA
    assert build.cudagraphs(cfg_with(), CPU) == (False, "")
    assert build.cudagraphs(cfg_with("train.compile=on"), CPU) == (False, "")
    assert build.cudagraphs(cfg_with("train.compile=off"), CUDA) == (False, "")
    assert build.cudagraphs(cfg_with("train.cudagraphs=off"), CUDA) == (False, "")
    assert build.cudagraphs(cfg_with("train.cudagraphs=on"), CUDA) == (True, "")


@pytest.mark.parametrize("sets, dev, says", [
    (["train.cudagraphs=on", "train.compile=off"], CUDA, "train.cudagraphs=on needs train.compile on"),
    (["train.cudagraphs=on"], CPU, "train.cudagraphs=on needs train.compile on"),  # compile auto: off on a CPU
    (["train.cudagraphs=on", "train.compile=on"], CPU, "needs a CUDA device"),
    (["train.cpp_wrapper=on", "train.compile=off"], CUDA, "train.cpp_wrapper=on needs train.compile on"),
])
def test_a_switch_that_would_do_nothing_is_an_error(sets, dev, says):
    with pytest.raises(UserError, match=says):
        build.cudagraphs(cfg_with(*sets), dev)


def test_the_cpp_wrapper_is_off_until_a_gpu_measures_it():
    assert not build.cpp_wrapper(cfg_with(), CUDA) and not build.cpp_wrapper(cfg_with("train.compile=on"), CPU)
    assert build.cpp_wrapper(cfg_with("train.cpp_wrapper=on"), CUDA)
    assert build.cpp_wrapper(cfg_with("train.cpp_wrapper=on", "train.compile=on"), CPU)  # Inductor's CPU wrapper


def test_graphs_beside_the_cpp_wrapper_where_this_torch_records_them(monkeypatch):
    """torch 2.11's Inductor records no CUDA graph of C++-wrapped code, 2.13's does (without graph partitions)."""
    assert build.graphs_under_cpp_wrapper() == (not torch.__version__.startswith("2.11."))  # the range's two ends
    both = cfg_with("train.cpp_wrapper=on", "train.cudagraphs=on")
    monkeypatch.setattr(build, "graphs_under_cpp_wrapper", lambda: False)
    with pytest.raises(UserError, match="records no CUDA graph of code with its C\\+\\+ wrapper; set one of them off"):
        build.cudagraphs(both, CUDA)
    on, note = build.cudagraphs(cfg_with("train.cpp_wrapper=on"), CUDA)  # auto gives way, and says so
    assert not on and note.startswith("train.cudagraphs=auto: off, because train.cpp_wrapper=on")
    monkeypatch.setattr(build, "graphs_under_cpp_wrapper", lambda: True)
    assert build.cudagraphs(both, CUDA) == (True, "")


def test_compile_options_are_this_torch_s_inductor_keys_and_the_compiler_passes_them(monkeypatch):
    for wrapper in (False, True):
        for graphs in (False, True):
            options = build.compile_options(wrapper, graphs)
            with inductor_config.patch(options):  # an unknown key raises here
                for key, value in options.items():
                    *section, name = key.split(".")
                    assert getattr(getattr(inductor_config, section[0]) if section else inductor_config, name) == value
    assert build.compile_options(True, True) == {"cpp_wrapper": True, "triton.cudagraphs": True,
                                                  "triton.cudagraph_or_error": True, "graph_partition": False}
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: seen.append(kwargs) or fn)
    build.compiler(cfg_with("train.cpp_wrapper=on"), CUDA, graphs=True)(abs)
    build.compiler(cfg_with(), CUDA)(abs)
    assert seen == [{"options": build.compile_options(True, True)}, {"options": None}]
    assert build.compiler(cfg_with(), CPU) is None


@pytest.mark.parametrize("old, new", [(True, "on"), (False, "off")])
def test_old_true_false_configs_and_checkpoints_still_load(old, new):
    saved = cfg_with().to_toml().replace('cudagraphs = "auto"', f"cudagraphs = {str(old).lower()}")
    assert f"cudagraphs = {str(old).lower()}" in saved  # a config.toml / checkpoint config of before issue 42
    assert config.load_saved_text(saved).train.cudagraphs == new
    assert cfg_with(f"train.cudagraphs={str(old).lower()}").train.cudagraphs == new  # --set as it was typed


@pytest.mark.parametrize("key", ["train.cudagraphs", "train.cpp_wrapper"])
def test_other_values_are_refused_before_any_work(key):
    with pytest.raises(UserError, match=f"{key}='yes' is not one of auto, off, on"):
        check_config(cfg_with(f"{key}=yes"))


# ---- the check and its fallback ----------------------------------------------------------------------------------

SMALL = ["train.compile=on", "train.kernels=torch", "train.progress=false", "attack.steps=2", "data.batch_size=32",
         "train.amp=off", "data.train_per_class=30"]


def make(tmp_path, monkeypatch, fast=None, name="run", *sets):
    """The demo's PGD-AT, its "compiled" step plain eager code; with ``fast``, CUDA graphs forced on and ``fast`` the
    graphed compiler (what the check runs against the plain step)."""
    monkeypatch.setattr(build, "compiler", lambda cfg, dev, graphs=False: fast if graphs else (lambda fn: fn))
    monkeypatch.setattr(build, "cudagraphs", lambda cfg, dev: (fast is not None, ""))
    cfg = config.resolve("demo", {"method.name": "pgd-at"}, SMALL + list(sets))
    return Trainer(cfg, tmp_path / name, quiet=True)


def counting(calls):
    """A fast way that computes what the plain one does, counting its calls."""
    def compile_(fn):
        def run(*args, **kwargs):
            calls.append(fn)
            return fn(*args, **kwargs)
        return run
    return compile_


def raising(err, after_running=False):
    def compile_(fn):
        def run(*args, **kwargs):
            if after_running:  # the attack's train-mode BN statistics and the loss's forward have moved by now
                fn(*args, **kwargs)
            raise err
        return run
    return compile_


def wrong(fn):
    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        return tuple(o * 1.5 for o in out) if isinstance(out, tuple) else out * 1.5
    return run


def steps(t, batches):
    t.model.train()
    torch.manual_seed(2)
    for x, y in batches:
        t.train_step(x, y)


def state(t) -> dict:
    return {"model": t.model.state_dict(), "opt": t.opt.state_dict()["state"], "class": t.state.state_dict(),
            "rng": torch.get_rng_state()}


def assert_same(a: dict, b: dict):
    la, lb = fallback.leaves(a), fallback.leaves(b)
    assert la.keys() == lb.keys()
    for k in la:
        assert torch.equal(la[k], lb[k]) if isinstance(la[k], torch.Tensor) else la[k] == lb[k], k


def said(t) -> list[str]:
    log = t.run.train_log
    return [line for line in (log.read_text().splitlines() if log.is_file() else []) if "train.cudagraphs:" in line]


@pytest.fixture
def plain(tmp_path, monkeypatch):
    """(the steps' batches, the state four plain steps leave)."""
    t = make(tmp_path, monkeypatch, name="plain")
    batches = [b for _, b in zip(range(4), t.train_loader)]
    steps(t, batches)
    assert not said(t)
    return batches, state(t)


def test_an_agreeing_fast_way_leaves_exactly_what_an_unchecked_run_would(tmp_path, monkeypatch, plain):
    """Three checked steps and one unchecked: one optimiser step each (no double step), the random-number state
    where the plain run left it, nothing said; after the check a step makes no host sync, a new batch shape is
    checked again."""
    batches, want = plain
    calls = []
    t = make(tmp_path, monkeypatch, counting(calls))
    steps(t, batches)
    assert_same(state(t), want)
    assert not said(t) and t.ways.fast_on
    assert len(calls) == 4 * 2  # the descent and the loss each step: the check's fast steps and the last one
    assert t._step.checked == {(tuple(batches[0][0].shape), batches[0][0].dtype): fallback.CHECKS}
    x, y = batches[0]
    with NoHostSync():
        t.train_step(x, y)
    t.train_step(x[:16], y[:16])
    assert t._step.checked[(tuple(x[:16].shape), x.dtype)] == 1


@pytest.mark.parametrize("fast, says", [
    (raising(RuntimeError("CUDA graph capture failed")), "failed: RuntimeError: CUDA graph capture failed"),
    (raising(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")),
     "ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)"),
    (raising(RuntimeError("replay failed"), after_running=True), "failed: RuntimeError: replay failed"),
    (wrong, "disagreed with the plain step: "),
], ids=["raises", "out-of-memory", "raises-after-changing-the-state", "wrong-values"])
def test_a_failing_fast_way_falls_back_once_and_the_run_goes_on_as_the_plain_run(tmp_path, monkeypatch, plain,
                                                                                   fast, says):
    batches, want = plain
    calls = []

    def watched(fn):
        compiled = fast(fn)
        return lambda *a, **k: calls.append(fn) or compiled(*a, **k)

    t = make(tmp_path, monkeypatch, watched)
    steps(t, batches)
    assert_same(state(t), want)  # the plain step's result kept, the failed fast step's changes undone
    (line,) = said(t)
    assert says in line and "this run goes on with the compiled step without them" in line, line
    assert not t.ways.fast_on and 1 <= len(calls) <= 2  # the first step's fast way only: never again


def test_a_resumed_checked_run_equals_an_uninterrupted_one(tmp_path, monkeypatch):
    """Each process checks its own first steps (the resumed one at its epoch 2), and the check changes nothing."""
    sets = ["train.epochs=2", "train.lr_milestones=[]", "train.val_attack=fgsm", "eval.attacks=['clean']"]
    straight = make(tmp_path, monkeypatch, counting([]), "straight", *sets)
    straight.fit()
    first = make(tmp_path, monkeypatch, counting([]), "resumed", *sets)
    first.run_epoch(0)
    cfg = config.load_saved_text((tmp_path / "resumed" / "config.toml").read_text())
    resumed = Trainer(cfg, tmp_path / "resumed", resume=True, quiet=True)
    assert resumed.start_epoch == 1
    resumed.fit()
    assert resumed._step.checked and not said(resumed)
    a, b = (load_checkpoint(tmp_path / run / "checkpoints" / "last.pt") for run in ("straight", "resumed"))
    assert_same({k: a[k] for k in ("model", "optimizer", "class_state")},
                {k: b[k] for k in ("model", "optimizer", "class_state")})


def test_disagreement_is_relative_to_what_the_step_changed():
    before = {"w": torch.zeros(4), "m": {}}
    plain = {"w": torch.ones(4), "m": {"buf": torch.full((2,), 2.0)}}  # the momentum buffer appears at step 1
    close = {"w": torch.ones(4) * 1.2, "m": {"buf": torch.full((2,), 2.0)}}
    assert fallback.disagreement(before, plain, close, 0.25) is None
    far = {"w": torch.ones(4) * 1.3, "m": {"buf": torch.full((2,), 2.0)}}
    assert "w is 0.3 of its change apart (tolerance 0.25)" in fallback.disagreement(before, plain, far, 0.25)
    broken = {"w": torch.ones(4), "m": {"buf": torch.tensor([2.0, float("nan")])}}
    assert "m.buf is nan" in fallback.disagreement(before, plain, broken, 0.25)
    unchanged = {"w": torch.zeros(4), "m": {"buf": torch.full((2,), 2.0)}}
    moved = {"w": torch.full((4,), 1e-3), "m": {"buf": torch.full((2,), 2.0)}}  # the plain step left w as it was
    assert "w is inf" in fallback.disagreement(before, unchanged, moved, 0.25)
