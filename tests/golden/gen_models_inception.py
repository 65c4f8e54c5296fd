"""Inception-v3 for 32x32 inputs as weiaicunzai/pytorch-cifar100 defines it (``models/inceptionv3.py``), built for
ten classes; recorded as gen_models_kuangliu.py records the other architectures."""
from gen_models_kuangliu import IMAGES, load, run

REPO = "weiaicunzai/pytorch-cifar100"
PINNED = "11d8418f415b261e4ae3cb1ffe20d06ec95b98e4"


def generate(path, inp):
    net = load(path, "inceptionv3").InceptionV3(num_classes=10)
    return {"models_inception-v3": run(net, inp.x[:IMAGES], {"file": "models/inceptionv3.py",
                                                             "function": "InceptionV3",
                                                             "settings": {"num_classes": 10}})}
