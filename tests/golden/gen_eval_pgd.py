"""TRADES's PGD-20 evaluation (yaodongyu/TRADES): ``pgd_attack_cifar10.py::_pgd_whitebox``, step by
step, with the per-image decision it counts (see gen_mart.py for what is kept, and why it is enough)."""
import types

from gen_mart import eval_pgd
from record import BATCH, STEP_IMAGES, load_function, script_namespace

REPO = "yaodongyu/TRADES"
PINNED = "6e8e11b7c281371c2f027ffadfbaea80361f09de"
FLOAT64 = []  # its torch.FloatTensor start noise stays a float32 draw, added to float64 x in float64
SETTINGS = {"epsilon": 0.031, "num_steps": 20, "step_size": 0.003, "random": True}  # the script's defaults


def generate(path, inp):
    args = types.SimpleNamespace(**SETTINGS)
    fn = load_function(path / "pgd_attack_cifar10.py", "_pgd_whitebox", script_namespace(args=args))
    meta = {"file": "pgd_attack_cifar10.py", "function": "_pgd_whitebox", "settings": SETTINGS, "batch": BATCH,
            "step_images": STEP_IMAGES, "start": "x + U(-eps, eps), not clipped to [0, 1]", "result": "x_20",
            "incorrect": "per image, the prediction on x_20 differs from y (the code's err_pgd, unsummed)"}
    return {"eval_pgd": (eval_pgd(fn, inp.x[:BATCH], inp.y[:BATCH], inp.model("eval")), meta)}
