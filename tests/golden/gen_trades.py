"""TRADES (yaodongyu/TRADES): the training attack, loss and weight gradient of ``trades.trades_loss``
on the first ``BATCH`` images (what is kept per step: record.py)."""
from record import BATCH, STEP_IMAGES, training_loss_record

REPO = "yaodongyu/TRADES"
PINNED = "6e8e11b7c281371c2f027ffadfbaea80361f09de"
FLOAT64 = []  # trades_loss casts nothing; its start noise is drawn in the default dtype
SETTINGS = {"epsilon": 0.031, "step_size": 0.007, "perturb_steps": 10, "beta": 6.0}  # train_trades_cifar10.py


def generate(path, inp):
    from trades import trades_loss

    # The last forward inputs are x, x_adv, x (loss_natural, then the KL term's two forwards).
    arrays = training_loss_record(trades_loss, inp, SETTINGS, x_adv_back=2)
    meta = {"file": "trades.py", "function": "trades_loss", "settings": SETTINGS, "batch": BATCH,
            "step_images": STEP_IMAGES,
            "step_iterates": "x_0 (the code's start x + 0.001 N(0, I)) .. x_K of the first step_images images"}
    return {"trades": (arrays, meta)}
