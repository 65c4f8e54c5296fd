"""Benz et al.'s CIFAR architectures as kuangliu/pytorch-cifar defines them (``models/*.py``): each model
holding :func:`model_weights.fill`'s weights, in eval mode, on the first four fixed test images; its logits,
parameter count and state-dict key names (tests/test_models_benz.py loads them into fastfair's model)."""
import importlib.util

import torch

from model_weights import filled_state, key_shapes

REPO = "kuangliu/pytorch-cifar"
PINNED = "49b7aa97b0c12fe0d4054e670403a16b6b834ddd"
IMAGES = 4
# fastfair name -> (file, constructor, its arguments)
MODELS = {"lenet": ("lenet", "LeNet", ()), "vgg16": ("vgg", "VGG", ("VGG16",)), "vgg19": ("vgg", "VGG", ("VGG19",)),
          "resnet18": ("resnet", "ResNet18", ()), "resnet50-cifar": ("resnet", "ResNet50", ()),
          "densenet121": ("densenet", "DenseNet121", ()),
          "densenet169": ("densenet", "DenseNet169", ()), "googlenet": ("googlenet", "GoogLeNet", ())}


def load(path, file):
    """``models/FILE.py`` of the checkout at ``path``, imported under its own name (both repositories have a
    ``models`` folder, so the package name would find the other one's)."""
    spec = importlib.util.spec_from_file_location(f"reference_{path.name}_{file}", path / "models" / f"{file}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(net, x, meta):
    """(arrays, meta) of one reference model: logits on ``x`` with the filled weights, keys and shapes."""
    layout = key_shapes(net.state_dict())
    net.load_state_dict(filled_state(layout["keys"], layout["shapes"]))
    with torch.no_grad():
        logits = net.eval()(x)
    params = sum(p.numel() for p in net.parameters())
    return {"logits": logits.numpy(), **layout}, {**meta, "parameters": params, "images": len(x),
                                                   "weights": "tests/model_weights.py::fill of each key",
                                                   "mode": "eval", "result": "logits"}


def generate(path, inp):
    out = {}
    for name, (file, ctor, args) in MODELS.items():
        net = getattr(load(path, file), ctor)(*args)
        out[f"models_{name}"] = run(net, inp.x[:IMAGES], {"file": f"models/{file}.py", "function": ctor,
                                                          "settings": {"arguments": list(args)}})
    return out
