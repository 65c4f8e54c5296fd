"""Carmon et al.'s C&W L-inf attack (yaircarmon/semisup-adv ``attack_cw.py::cw``, built on foolbox 1.x), the
implementation Tian et al. say their CW-inf follows: the L-inf distance of the closest adversarial example it
finds for each image, with the script's settings except ``max_iterations`` (100 instead of 1000, so the
reference runs in minutes; the rounds' early stop then checks every 10 iterations instead of every 100).

Needs ``pip install foolbox==1.8.0`` (the last 1.x release) beside the checkout; foolbox 1.8 imports the
``collections`` aliases Python 3.10 removed, which this generator restores for the run.
"""
import collections
import collections.abc
import importlib.util

import numpy as np
import torch


REPO = "yaircarmon/semisup-adv"
PINNED = "3f05b280cfa207ec035f27542c8c8b4b2a4e71b2"
# attack_cw.py works in numpy on the model's dtype (foolbox 1.8's PyTorchModel passes arrays through
# torch.from_numpy unchanged; its Adam state is np.zeros, float64): it casts nothing the float64 run does not cover
FLOAT64 = []
SETTINGS = {"binary_search_steps": 5, "max_iterations": 100, "learning_rate": 5e-3, "initial_const": 1e-2,
            "tau_decrease_factor": 0.9}  # attack_evaluation.py's defaults, but max_iterations (1000 there)


def generate(path, inp):
    for name in ("Iterable", "Mapping", "Sequence", "Callable"):
        setattr(collections, name, getattr(collections.abc, name))
    spec = importlib.util.spec_from_file_location("attack_cw", path / "attack_cw.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.HAVE_FOOLBOX, "gen_cwinf.py needs foolbox 1.x: pip install foolbox==1.8.0"
    import foolbox
    model = inp.model("eval")
    x, y = inp.x, inp.y  # all 64: about 25 the model gets right
    np.random.seed(0)
    with torch.no_grad():
        correct = model(x).argmax(1) == y
    distances = np.asarray(module.cw(model, x, y, **SETTINGS), dtype=np.float64)
    meta = {"file": "attack_cw.py", "function": "cw", "settings": SETTINGS,
            "foolbox": foolbox.__version__,
            "result": "per image, the L-inf distance of the closest misclassified point the attack queried "
                      "(0 for an image the model already gets wrong)"}
    return {"cwinf": ({"distance": distances, "correct": correct.numpy()}, meta)}
