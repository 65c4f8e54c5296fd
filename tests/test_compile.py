"""A compiled training step matches eager, without graph breaks or recompiles, for four methods' losses.

Through Dynamo and AOTAutograd without Inductor (helpers.compile_cheaply): the graphs, breaks, recompiles and the
traced attack, loss and backward are what this checks, a few CPU seconds a method where Inductor took 20 to 90.
Inductor's code for these losses' ops is compared with eager in test_compiled_step.py: PGD-AT's whole steps, and
ME-TRADES' (TRADES' KL attack and loss, with its entropy term) under the CUDA defaults."""
import pytest
import torch
from torch._dynamo.utils import counters

from fastfair import config
from fastfair.training.trainer import Trainer
from helpers import compile_cheaply


def trainer(tmp_path, method, compile_):
    small = [f"train.compile={compile_}", "train.kernels=torch", "train.progress=false", "attack.steps=2",
             "data.batch_size=32"]
    if method == "absld":  # a distillation teacher: the demo model as it starts
        teacher = tmp_path / "teacher.pt"
        if not teacher.is_file():
            start = Trainer(config.resolve("demo", {"method.name": "pgd-at"}, small), tmp_path / "start", quiet=True)
            torch.save(start._state(0), teacher)
        small.append(f"method.teacher={teacher}")
    return Trainer(config.resolve("demo", {"method.name": method}, small), tmp_path / f"{method}-{compile_}",
                   quiet=True)


def loss_and_grads(t, x, x_adv, y):
    t.model.train()
    loss, logits = t.loss_fn(t.model, x, x_adv, y, t.state)
    grads = torch.autograd.grad(loss, list(t.model.parameters()))
    return loss, logits, grads


@pytest.mark.slow
@pytest.mark.parametrize("method", ["trades", "me-trades", "absld", "bat"])
def test_compiled_step_matches_eager_without_graph_breaks(tmp_path, monkeypatch, method):
    compile_cheaply(monkeypatch)
    torch._dynamo.reset()
    counters.clear()
    eager, compiled = trainer(tmp_path, method, "off"), trainer(tmp_path, method, "on")
    x, y = next(iter(eager.train_loader))

    # the attack: sign(grad) may flip where the gradient is ~0, so compare most pixels, not all
    advs = []
    for t in (eager, compiled):
        torch.manual_seed(0)
        advs.append(t.method.perturb(t.attack_net, x, y, t.state))
    assert (advs[0] == advs[1]).float().mean() > 0.99

    # the update from the same adversarial batch: loss, logits and every weight gradient
    if method == "bat":  # and the same last clean examples, which its loss reads beside the batch
        compiled.method.x_last_clean = eager.method.x_last_clean
    (l_e, z_e, g_e), (l_c, z_c, g_c) = (loss_and_grads(t, x, advs[0], y) for t in (eager, compiled))
    torch.testing.assert_close(l_c, l_e, rtol=1e-4, atol=1e-5)
    for a, b in ([(z_e, z_c)] if torch.is_tensor(z_e) else zip(z_e.values(), z_c.values())):  # absld: adv and nat
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
    for a, b in zip(g_e, g_c):
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-5)

    # whole steps: no graph breaks, and no recompiles once the first step has warmed up
    compiled.train_step(x, y)
    warm = counters["stats"]["unique_graphs"]
    for step in range(2):
        compiled.train_step(x, y)
    assert counters["graph_break"] == {}, dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == warm
