"""MART (YisenWang/MART): ``mart.mart_loss`` (training attack, loss, weight gradient) and the PGD-20
evaluation attack ``_pgd_whitebox`` of ``train_wideresnet.py``, on the first ``BATCH`` images (what is
kept per step, and why it is enough: record.py)."""
import types

import numpy as np

from record import BATCH, STEP_IMAGES, Outputs, load_function, script_namespace, steps_record, training_loss_record

REPO = "YisenWang/MART"
PINNED = "2d83e17b381dd2ee52223695e517bf6d5ff09c2c"
FLOAT64 = []  # mart_loss and _pgd_whitebox cast nothing that the float64 run does not cover
SETTINGS = {"epsilon": 0.031, "step_size": 0.007, "perturb_steps": 10, "beta": 6.0}  # train_wideresnet.py defaults

def eval_pgd(fn, x, y, model):
    """Run an authors' ``_pgd_whitebox`` as its script's ``eval_adv_test_whitebox`` does (model.eval())."""
    rec = Outputs(model)
    err, err_pgd = fn(rec, x, y)
    # forwards: clean x, the K iterates x_0 .. x_{K-1} (with gradient), then x_K for the decision
    wrong = rec.outputs[-1].argmax(1) != y
    assert int(wrong.sum()) == int(err_pgd), "the recorded decision is not the code's err_pgd"
    assert len(rec.grads) == len(rec.iterates) - 1
    return {**steps_record(rec.iterates, rec.grads), "start": rec.iterates[0].numpy(),
            "result": rec.iterates[-1].numpy(), "incorrect": wrong.numpy(), "err_pgd": np.asarray(float(err_pgd)),
            "clean_incorrect": (rec.outputs[0].argmax(1) != y).numpy()}


def generate(path, inp):
    from mart import mart_loss

    x, y = inp.x[:BATCH], inp.y[:BATCH]
    # after the K attack forwards: model(x_natural), then model(x_adv)
    arrays = training_loss_record(mart_loss, inp, SETTINGS, x_adv_back=1)
    meta = {"file": "mart.py", "function": "mart_loss", "settings": SETTINGS, "batch": BATCH,
            "step_images": STEP_IMAGES,
            "step_iterates": "x_0 (the code's start x + 0.001 N(0, I)) .. x_K of the first step_images images"}

    # train_wideresnet.py's own evaluation attack: 20 steps of eps/10 from an unclipped U(-eps, eps) start
    args = types.SimpleNamespace(epsilon=SETTINGS["epsilon"])
    fn = load_function(path / "train_wideresnet.py", "_pgd_whitebox", script_namespace(args=args))
    pgd = eval_pgd(fn, x, y, inp.model("eval"))
    pgd_meta = {"file": "train_wideresnet.py", "function": "_pgd_whitebox", "batch": BATCH,
                "step_images": STEP_IMAGES,
                "settings": {"epsilon": args.epsilon, "step_size": args.epsilon / 10.0, "num_steps": 20},
                "start": "x + U(-eps, eps), not clipped to [0, 1]", "result": "x_20",
                "incorrect": "per image, the prediction on x_20 differs from y (the code's err_pgd, unsummed)"}
    return {"mart": (arrays, meta), "mart_pgd20": (pgd, pgd_meta)}
