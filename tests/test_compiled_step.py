"""The compiled training step on a CPU (Inductor): what a CPU can prove about the GPU hot path.

The attack's K steps compile to one graph with the input gradients inside it; the compiled
step equals the eager one; changing per-class eps (CCM, every epoch) never recompiles; and a
step never waits for the host (no ``.item()``, no data-dependent shapes).

Graphs, graph breaks and recompiles are Dynamo's, whatever backend compiles its graphs: those tests compile with
``aot_eager`` (helpers.compile_cheaply), tens of CPU seconds cheaper a graph. Inductor compiles where its code is what
is compared with eager, each kind of step once, on the smallest step it compiles whole (TINY): PGD-AT's fp32 steps
with the Python and the C++ wrapper (test_compiled_step_tracks_eager_and_its_cpp_wrapper_equals_its_python_wrapper),
the CUDA defaults' layout and fused SGD with ME-TRADES in fp32 and PGD-AT in bf16
(test_cuda_defaults_together_on_a_cpu_track_fp32_eager).
"""
import pytest
import torch
from torch._dynamo.utils import counters
from torch._inductor.graph import GraphLowering
from torch.utils._python_dispatch import TorchDispatchMode

from bench import common
from helpers import compile_cheaply
from fastfair import build, config
from fastfair.attacks import pgd
from fastfair.methods import METHODS
from fastfair.rundir import save_atomic
from fastfair.training.trainer import Trainer
from fastfair.preset_files import preset_names
from fastfair.training import fallback, optim, trainer as trainer_module



def trainer(tmp_path, method, compile_, *sets, name=""):
    cfg = config.resolve("demo", {"method.name": method}, [
        f"train.compile={compile_}", "train.kernels=torch", "train.progress=false", "attack.steps=3",
        "data.batch_size=32", *sets])
    return Trainer(cfg, tmp_path / f"{method}-{compile_}{name}", quiet=True)


# The smallest whole step for Inductor: its compile time is what an Inductor test pays, and it grows with the
# graphs' ops (two attack steps: the descent's loop), not with the data; a width-2 CNN on four 8x8 images a batch
# runs each compiled kernel in microseconds
TINY = ("model.width=2", "data.batch_size=4", "attack.steps=2")


def buffers(model):
    return {k: v.clone() for k, v in model.named_buffers()}


@pytest.mark.slow
@pytest.mark.parametrize("method,sets", [
    ("pgd-at", ()), ("trades", ()),
    ("fat", ()),  # FAT's code: its early stop, omega N(0, I) step noise (drawn before the descent), eval mode
    ("fat", ("method.stop_rule=cfa", "method.omega=0", "method.tau=1", "attack.bn_mode=train"))],  # CFA's FAT
    ids=["pgd-at", "trades", "fat", "fat-cfa-rule"])
def test_compiled_attack_is_one_graph_equal_to_eager(tmp_path, monkeypatch, method, sets):
    """PGD-AT attacks in train-mode BN (its statistics move K times), TRADES in eval mode with the KL
    objective, FAT with each early-stop rule (and FAT's step noise, which must come from the same draws).
    Through AOTAutograd without Inductor: the graph, its guards and the traced BN updates and masks are what this
    checks; Inductor's attack code is compared with eager inside whole steps (PGD-AT's train-mode BN:
    test_compiled_step_tracks_eager_and_its_cpp_wrapper_equals_its_python_wrapper; ME-TRADES' KL:
    test_cuda_defaults_together_on_a_cpu_track_fp32_eager)."""
    compile_cheaply(monkeypatch)
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = trainer(tmp_path, method, "off", *sets), trainer(tmp_path, method, "on", *sets)
    assert compiled.attack_net is compiled.model  # the model is traced inside the compiled descent
    x, y = next(iter(eager.train_loader))
    before = buffers(compiled.model)
    out = []
    for t in (eager, compiled):
        t.model.train()
        torch.manual_seed(1)
        out.append((t.method.perturb(t.attack_net, x, y, t.state), buffers(t.model)))
    (adv_e, bn_e), (adv_c, bn_c) = out
    # the random start is drawn eagerly, so only the sign of a ~0 gradient may differ (TRADES'
    # KL starts at ~0: a few pixels)
    assert (adv_e == adv_c).float().mean() > 0.99
    assert (adv_c - x).abs().max() <= eager.cfg.attack.eps + 1e-6
    for k in bn_e:
        torch.testing.assert_close(bn_c[k], bn_e[k], rtol=1e-5, atol=1e-6)
    if eager.cfg.attack.bn_mode == "train":  # the K train-mode forwards did move the BN statistics
        assert any(not torch.equal(bn_c[k], before[k]) for k in before if "running_mean" in k)
    assert counters["graph_break"] == {}, dict(counters["graph_break"])
    graphs = counters["stats"]["unique_graphs"]
    assert graphs == 1  # the descent: forwards, input gradients, steps and projection in one graph
    compiled.state.set("eps", torch.linspace(0.05, 0.15, compiled.state.num_classes))  # CCM-style change
    compiled.method.perturb(compiled.attack_net, x, y, compiled.state)
    assert counters["stats"]["unique_graphs"] == graphs


def test_the_descent_is_one_graph_on_this_torch():
    """Every supported torch (2.11 and 2.13 in CI) captures the descent as one graph: the probe the trainer reads."""
    assert pgd.descent_capture() is None
    assert pgd.can_compile_descent()


def test_the_probe_sees_a_graph_break():
    def broken(*args, **kwargs):
        torch._dynamo.graph_break()
        return pgd.descend(*args, **kwargs)

    before = {k: dict(v) for k, v in counters.items()}
    assert pgd.descent_capture(broken) == "1 graphs, 1 graph breaks"
    assert {k: dict(v) for k, v in counters.items()} == before  # Dynamo's counters left as they were


def test_a_descent_that_is_not_one_graph_runs_eagerly_around_the_compiled_model(tmp_path, monkeypatch):
    """Where the probe finds more than one graph, the trainer says so once in train.log and compiles the model alone."""
    monkeypatch.setattr(trainer_module, "can_compile_descent", lambda: False)
    monkeypatch.setattr(trainer_module, "descent_capture", lambda: "3 graphs, 1 graph breaks")
    t = trainer(tmp_path, "pgd-at", "on")
    assert t.attack_net is t.net and t.net is not t.model  # the eager descent around the compiled model
    assert t.method.attack.descend is pgd.descend
    lines = t.run.train_log.read_text().splitlines()
    said = [line for line in lines if "does not capture the attack as one graph (3 graphs, 1 graph breaks)" in line]
    assert len(said) == 1, lines
    off = trainer(tmp_path, "pgd-at", "on", "train.compile_attack=false", name="-no-attack")
    log = off.run.train_log
    assert not log.is_file() or "does not capture" not in log.read_text()  # nothing to say when the user chose it


@pytest.mark.parametrize("compiled_descent", [True, False])
def test_kernels_auto_lets_inductor_fuse_where_the_attack_is_one_graph(tmp_path, monkeypatch, compiled_descent):
    """--kernels auto on CUDA: the reference loss rows and PGD step (Inductor fuses them; a fused kernel added
    launches inside the compiled step) with the fused random start where the attack is one graph, the fused
    kernels where its loop runs eagerly; the reference on a CPU; a named backend is kept."""
    cfg = config.resolve("demo", {}, ["train.kernels=auto"])
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert build.kernels(cfg, cuda, compiled_descent) == ("inductor" if compiled_descent else "triton")
    assert build.kernels(cfg, cpu, compiled_descent) == "torch"
    for name in ("torch", "triton", "inductor"):
        assert build.kernels(config.resolve("demo", {}, [f"train.kernels={name}"]), cuda, compiled_descent) == name
    from fastfair import kernels, ops
    from fastfair.ops import losses, steps
    inductor = ops.backend("inductor")
    assert (inductor.row_loss, inductor.pgd_step, inductor.random_start) == \
        (losses.row_loss, steps.pgd_step, kernels.random_start)
    # the trainer hands build.kernels what it found: is the attack compiled as one graph?
    seen = []
    monkeypatch.setattr(trainer_module, "can_compile_descent", lambda: compiled_descent)
    monkeypatch.setattr(trainer_module, "descent_capture", lambda: "2 graphs, 1 graph breaks")
    monkeypatch.setattr(build, "kernels", lambda cfg, dev, compiled=False: seen.append(compiled) or "torch")
    trainer(tmp_path, "pgd-at", "on")
    assert seen == [compiled_descent]


@pytest.mark.slow
def test_compiled_step_tracks_eager_and_its_cpp_wrapper_equals_its_python_wrapper(tmp_path, monkeypatch):
    """Two whole PGD-AT steps (attack in train-mode BN, loss, backward, SGD) in fp32 from the same weights, batches
    and seeds, three ways: eager, compiled by Inductor with its Python wrapper, and with its C++ wrapper
    (train.cpp_wrapper=on, on a CPU). Each compiled run has one graph per region -- the attack, the loss (its forward
    and backward are one Dynamo graph), the model alone (validation's) -- and no graph break. The Python wrapper's
    steps track eager: weights, BN statistics, counters and validation logits within summation-order rounding. The
    C++ wrapper (Inductor writes one for the attack, the loss's forward and backward, and the model) leaves bit for
    bit the Python wrapper's weights, BN statistics, momentum, counters and validation logits: it calls the same
    kernels in the same order. ME-TRADES' compiled step is compared with eager under the CUDA layout and optimiser
    (test_cuda_defaults_together_on_a_cpu_track_fp32_eager)."""
    lowered = []
    codegen = GraphLowering.codegen_with_cpp_wrapper
    monkeypatch.setattr(GraphLowering, "codegen_with_cpp_wrapper",
                        lambda self, *a, **k: lowered.append(self) or codegen(self, *a, **k))
    # fp32: the comparison with eager is about compiling; bf16 autocast (auto on a CPU with native bf16) rounds
    # differently in the fused and the eager kernels (test_cuda_defaults_together_on_a_cpu_track_fp32_eager bounds it)
    sets = (*TINY, "attack.init=uniform", "train.amp=off")
    start, batches, runs = None, None, {}
    # config.patch, not monkeypatch.setattr: pytest 9.2 undoes a patch of an attribute missing from the module's
    # __dict__ with delattr, and a torch config module answers delattr by hiding the setting from every later compile
    with torch._inductor.config.patch(force_disable_caches=True):  # a cached graph is not lowered again
        for compile_, wrapper in (("off", "off"), ("on", "off"), ("on", "on")):
            torch._dynamo.reset()
            counters.clear()
            t = trainer(tmp_path, "pgd-at", compile_, *sets, f"train.cpp_wrapper={wrapper}", name=f"-cpp-{wrapper}")
            if start is None:
                start = {k: v.clone() for k, v in t.model.state_dict().items()}
                batches = [b for _, b in zip(range(2), t.train_loader)]
            t.model.load_state_dict(start)
            t.model.train()
            torch.manual_seed(2)
            for x, y in batches:
                t.train_step(x, y)
            t.model.eval()
            with torch.no_grad():
                logits = t.net(batches[0][0])
            assert counters["graph_break"] == {}, dict(counters["graph_break"])
            # the attack's descent, the loss, the model
            assert counters["stats"]["unique_graphs"] == (3 if compile_ == "on" else 0)
            runs[compile_, wrapper] = t, logits, len(lowered)
    (eager, logits_eager, _), (python, logits_py, before), (cpp, logits_cpp, after) = runs.values()
    for (k, a), b in zip(eager.model.state_dict().items(), python.model.state_dict().values()):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-4, msg=lambda m, k=k: f"{k}: {m}")
    torch.testing.assert_close(logits_py, logits_eager, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(python.state.loss_sum, eager.state.loss_sum, rtol=1e-4, atol=1e-5)
    assert torch.equal(python.state.correct, eager.state.correct)
    assert before == 0 and after == 4  # C++ wrappers: the attack, the loss's forward and backward, the model
    for (k, a), b in zip(python.model.state_dict().items(), cpp.model.state_dict().values()):
        assert torch.equal(a, b), k
    for a, b in zip(python.opt.state_dict()["state"].values(), cpp.opt.state_dict()["state"].values()):
        assert torch.equal(a["momentum_buffer"], b["momentum_buffer"])
    assert torch.equal(python.state.loss_sum, cpp.state.loss_sum)
    assert torch.equal(python.state.correct, cpp.state.correct)
    assert torch.equal(logits_py, logits_cpp)


@pytest.mark.slow
@pytest.mark.parametrize("method,amp,tolerance,sizes", [("me-trades", "off", 1e-4, TINY), ("pgd-at", "bf16", 0.25, ())],
                         ids=["me-trades-fp32", "pgd-at-bf16"])
def test_cuda_defaults_together_on_a_cpu_track_fp32_eager(tmp_path, monkeypatch, method, amp, tolerance, sizes):
    """The CUDA defaults' other paths on a CPU, together: channels_last, fused SGD (CUDA's choice in
    optim.implementation; torch runs it on CPU too), the compiled step with the compiled attack, and bf16
    autocast or not; three steps from the same weights and seeds against the fp32 eager step (foreach SGD).
    Each method once and each precision once (an Inductor compile each; PGD-AT's fp32 compiled step without the
    CUDA layout and optimiser is test_compiled_step_tracks_eager_and_its_cpp_wrapper_equals_its_python_wrapper's):
    ME-TRADES' KL attack and loss with its entropy term at the tight fp32 bound, PGD-AT's train-mode BN under bf16.

    Measure: per parameter tensor, |w_fast - w_eager| / |w_eager - w_start| (L2 norms), the error
    relative to the three steps' update. Without bf16 the paths compute the same fp32 sums in other
    orders: 1e-4 (measured below 5e-6; 2.3e-6 on TINY). With bf16, 0.25 (measured 0.13 on torch 2.13): bf16 keeps
    8 significant bits, so input gradients carry ~1% noise, the attack's sign steps flip wherever a
    pixel's gradient lies within that noise of 0 (those pixels move 2 alpha apart), and the training
    gradients follow. A path that broke (no update, a wrong layout, an unscaled step) is off by the
    whole update (1.0) or more. The bf16 bound holds for the demo's model and batch (width 32, 32 images), where
    bf16 is compared: on TINY a BN bias of its two channels measured 0.26, the update of so few pixels and weights
    that one flipped sign step weighs more. fp32 compares on TINY: the compile, what this test pays, is the same.
    """
    # TRADES' own start, x + 0.001 N(0, I), is where the KL's input gradient is ~0 and its sign rounding noise that
    # differs between any two implementations: a uniform start keeps the comparison about the step
    sets = [*sizes, "attack.init=uniform"]
    eager = trainer(tmp_path, method, "off", *sets, "train.amp=off", "model.channels_last=off")
    assert eager.opt.defaults["foreach"]
    monkeypatch.setattr(optim, "implementation", lambda dev: {"fused": True})
    fast = trainer(tmp_path, method, "on", *sets, f"train.amp={amp}", "model.channels_last=on", name=f"-{amp}")
    assert fast.amp == (torch.bfloat16 if amp == "bf16" else None) and fast.cl and fast.opt.defaults["fused"]
    assert fast.attack_net is fast.model  # the compiled descent (one graph on every supported torch)
    fast.model.load_state_dict(eager.model.state_dict())
    start = {k: v.clone() for k, v in eager.model.state_dict().items()}
    batches = [b for _, b in zip(range(3), eager.train_loader)]
    for t in (eager, fast):
        t.model.train()
        torch.manual_seed(2)
        for x, y in batches:
            if t is fast:  # what its loader hands out
                x = x.contiguous(memory_format=torch.channels_last)
            t.train_step(x, y)
    error = {}
    for k, a in eager.model.named_parameters():
        update = (a - start[k]).norm()
        assert update > 0, k
        error[k] = float((dict(fast.model.named_parameters())[k] - a).norm() / update)
    assert max(error.values()) <= tolerance, sorted(error.items(), key=lambda kv: -kv[1])[:4]
    torch.testing.assert_close(fast.state.loss_sum, eager.state.loss_sum, rtol=tolerance, atol=tolerance)


@pytest.mark.slow
def test_ccm_changes_eps_every_epoch_without_recompiling(tmp_path, monkeypatch):
    """CFA's CCM rewrites eps_k after every epoch; the compiled step and validation keep their graphs (Dynamo's
    guards: no Inductor needed)."""
    compile_cheaply(monkeypatch)
    torch._dynamo.reset()
    counters.clear()
    t = trainer(tmp_path, "pgd-at", "on", "ccm.enabled=true", "ccm.begin=0", "train.epochs=4",
                "train.val_attack=pgd2", "data.classes=[0,1,2,3]")
    eps = []
    for epoch in range(4):
        t.run_epoch(epoch)
        eps.append(t.state["eps"].clone())
        if epoch == 0:
            warm = counters["stats"]["unique_graphs"]
    assert all(not torch.equal(a, b) for a, b in zip(eps, eps[1:])), eps  # CCM moved eps every epoch
    assert counters["stats"]["unique_graphs"] == warm, "a later epoch compiled a new graph"
    assert counters["graph_break"] == {}, dict(counters["graph_break"])


class NoHostSync(TorchDispatchMode):
    """Fails on any op that makes the host wait for the device: a scalar read, a data-dependent
    shape, or a copy from a device to the host."""

    SYNCING = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_dim",
               "aten::_unique2", "aten::is_nonzero", "aten::equal", "aten::item"}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in self.SYNCING:
            raise AssertionError(f"host sync in the training step: {name}")
        if name in ("aten::_to_copy", "aten::copy_"):
            src = args[1] if name == "aten::copy_" else args[0]
            dst = args[0].device if name == "aten::copy_" else kwargs.get("device") or src.device
            if src.device.type != "cpu" and torch.device(dst).type == "cpu":
                raise AssertionError(f"device-to-host copy in the training step: {name}")
        return func(*args, **kwargs)


def test_the_sync_tracer_catches_a_scalar_read():
    with pytest.raises(AssertionError, match="_local_scalar_dense"), NoHostSync():
        float(torch.ones(2).sum())


def _step_kinds() -> list[str]:
    """One preset per distinct (method, enabled options, head), and the demo for each method no preset uses."""
    seen = {}
    for name in preset_names():
        cfg = config.resolve(name)
        seen.setdefault((cfg.method.name, tuple(cfg.enabled_options()), cfg.model.head), name)
    covered = {method for method, _, _ in seen}
    return sorted(seen.values()) + [f"demo:{m}" for m in sorted(set(METHODS) - covered)]


@pytest.mark.parametrize("kind", _step_kinds())
def test_no_step_waits_for_the_host(tmp_path, kind):
    """Each method and option, on the demo data and model: no host sync in a training step."""
    small = ["data.dataset=digits", "data.data_dir=", "data.classes=[]", "data.val_per_class=5", "data.batch_size=32",
             "model.name=tiny-cnn", "model.width=0", "attack.steps=2", "train.compile=off", "train.kernels=torch",
             "train.progress=false", "train.device=cpu", "train.epochs=100",  # the demo's 15 < DAFA's warm-up
             "train.select_begin=0",  # CFA code presets select from epoch 100 of their 200
             "eval.attacks=['clean']",  # no step evaluates; a transfer attack would need the substitute's run
             # the ImageNet presets' resolution phases, which only the folder loader reads
             "data.phase_epochs=[]", "data.phase_image_sizes=[]", "data.phase_batch_sizes=[]"]
    preset, _, method = kind.partition(":")
    # one step is what FGSM-RS is (the demo run as fgsm-rs, or an fgsm-rs preset)
    small += ["attack.steps=1"] if (method or config.resolve(preset).method.name) == "fgsm-rs" else []
    cfg = config.resolve(preset, {"method.name": method} if method else {}, small)
    if cfg.train.init_from or cfg.method.name.startswith("frl"):  # FRL fine-tunes a model: any of its shape will do
        start = Trainer(config.resolve("demo", {"method.name": "pgd-at"}, small), tmp_path / "start", quiet=True)
        save_atomic({"model": start.model.state_dict()}, tmp_path / "start.pt")
        cfg = config.resolve(preset, {"method.name": method} if method else {},
                             small + [f"train.init_from={tmp_path / 'start.pt'}"])
    if cfg.method.name == "absld":  # a distillation teacher: a checkpoint of the demo's model will do
        start = Trainer(config.resolve("demo", {"method.name": "pgd-at"}, small), tmp_path / "start", quiet=True)
        save_atomic(start._state(0), tmp_path / "teacher.pt")
        cfg = config.resolve(preset, {"method.name": method} if method else {},
                             small + [f"method.teacher={tmp_path / 'teacher.pt'}"])
    t = Trainer(cfg, tmp_path / "run", quiet=True)
    t.method.begin_epoch(t.model, 60)  # schedules past their warm-up (CCM/CCR begin, FAT's tau milestones)
    x, y = next(iter(t.train_loader))
    t.model.train()
    t.train_step(x, y)
    with NoHostSync():
        t.train_step(x, y)


def test_trix_targeting_forward_is_compiled_with_the_attack(tmp_path, monkeypatch):
    """TRIX's clean forward that picks the strong rows runs in a compiled graph beside the compiled attack:
    no convolution of a step runs outside one (each layer ran op by op before: about 90 launches a step). Dynamo's
    regions, whatever compiles them: no Inductor needed."""
    compile_cheaply(monkeypatch)
    t = trainer(tmp_path, "trix", "on", "method.warmup=1")
    x, y = next(iter(t.train_loader))
    t.model.train()
    t.train_step(x, y)  # compiles
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        t.train_step(x, y)
    ran = [e for e in prof.events() if e.name in ("aten::conv2d", "aten::convolution")]
    assert ran and not [e.name for e in ran if not common.in_compiled_graph(e)]


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


GPU_FP32 = ("train.device=cuda", "train.amp=off", "model.channels_last=off")


def attack_then_steps(t, batches):
    """The first batch's adversarial examples, then the weights after a step on each batch; same seed both times."""
    t.model.train()
    torch.manual_seed(2)
    x_adv = t.method.perturb(t.attack_net, *batches[0], t.state)
    torch.manual_seed(2)
    for x, y in batches:
        t.train_step(x, y)
    return x_adv, t.model.state_dict()


def assert_tracks(got, want):
    """At most 1 % of the attack's pixels apart (a sign step turns a gradient that is a rounding error
    into a whole step), and the weights after the steps within 3e-3 + 1 %. On the H200 (2026-11-26), 3 steps:
    the same maths compiled or not 1.4e-3 apart at most; two different random starts 5e-3 to 8e-3."""
    (x_got, w_got), (x_want, w_want) = got, want
    apart = ((x_got - x_want).abs() > 1e-4).float().mean().item()
    assert apart <= 0.01, f"{apart:.2%} of the adversarial pixels differ"
    for (k, a), b in zip(w_want.items(), w_got.values()):
        torch.testing.assert_close(b, a, rtol=1e-2, atol=3e-3, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("method", ["pgd-at", "me-trades"])
def test_gpu_compiled_triton_step_tracks_eager_triton_step(tmp_path, method):
    """On CUDA (fp32): the compiled step with the fused Triton kernels against the same kernels run eagerly.
    Both draw the method's own random start from Triton's Philox with the same seed (the eager PyTorch
    start draws from torch's generator: a different start, which is not what this compares)."""
    torch._dynamo.reset()
    counters.clear()
    eager = trainer(tmp_path, method, "off", *GPU_FP32, "train.kernels=triton")
    compiled = trainer(tmp_path, method, "on", *GPU_FP32, "train.kernels=triton", "train.cudagraphs=off")
    compiled.model.load_state_dict(eager.model.state_dict())
    batches = [b for _, b in zip(range(3), eager.train_loader)]
    assert_tracks(attack_then_steps(compiled, batches), attack_then_steps(eager, batches))
    assert counters["graph_break"] == {}, dict(counters["graph_break"])


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("method", ["pgd-at", "me-trades"])
def test_gpu_cuda_graphs_step_tracks_the_step_without(tmp_path, method):
    """On CUDA (fp32): the compiled step recorded as CUDA graphs (train.cudagraphs, on by default for CUDA runs that
    compile) against the same compiled step launched kernel by kernel, over more steps than the warm-up, recording
    and the fallback's check take, so unchecked replays are compared too; the check kept the graphs."""
    torch._dynamo.reset()
    plain = trainer(tmp_path, method, "on", *GPU_FP32, "train.cudagraphs=off")
    graphs = trainer(tmp_path, method, "on", *GPU_FP32, "train.cudagraphs=on", name="-graphs")
    graphs.model.load_state_dict(plain.model.state_dict())
    batches = [b for _, b in zip(range(5), plain.train_loader)]
    assert_tracks(attack_then_steps(graphs, batches), attack_then_steps(plain, batches))
    assert torch.isfinite(graphs.state.loss_sum)
    assert graphs.ways.fast_on and list(graphs._step.checked.values()) == [fallback.CHECKS]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("method", ["pgd-at", "mart"])
def test_gpu_triton_kernels_track_torch_ops_in_a_step(tmp_path, method):
    """On CUDA (fp32, eager): the fused loss and PGD-step kernels inside a training step against the PyTorch
    ops. No random start (the two draw from different generators); the CE objective's gradient at x
    is defined (TRADES's KL is flat there, so the first sign step would be rounding noise)."""
    torch_ops = trainer(tmp_path, method, "off", *GPU_FP32, "attack.init=none")
    fused = trainer(tmp_path, method, "off", *GPU_FP32, "attack.init=none", "train.kernels=triton", name="-triton")
    fused.model.load_state_dict(torch_ops.model.state_dict())
    batches = [b for _, b in zip(range(3), torch_ops.train_loader)]
    assert_tracks(attack_then_steps(fused, batches), attack_then_steps(torch_ops, batches))


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("method", ["pgd-at", "trades"])
def test_gpu_default_step_is_graph_break_free_and_stable(tmp_path, method):
    """fastfair's CUDA default (bf16, channels_last, compiled attack, --kernels auto, CUDA graphs checked against
    the step without them): no graph breaks, no new graphs after the first step, a finite loss, the graphs kept."""
    torch._dynamo.reset()
    counters.clear()
    t = trainer(tmp_path, method, "auto", "train.device=cuda", "train.kernels=auto", "train.amp=auto")
    x, y = next(iter(t.train_loader))
    t.model.train()
    t.train_step(x, y)
    warm = counters["stats"]["unique_graphs"]
    for _ in range(3):
        t.train_step(x, y)
    assert counters["graph_break"] == {}, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == warm
    assert torch.isfinite(t.state.loss_sum)
    assert t.ways.fast_on, t.run.train_log.read_text()  # the default: graphs, and the check kept them
