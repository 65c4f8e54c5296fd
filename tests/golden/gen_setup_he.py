"""ShawnXYang/AT_HE (Pang et al.'s PGD-HE): the HE scale s and margin m that CIFAR-10/train_adv_cifar10.py runs with
under the README's PGD-AT + HE command (its argparse statements, run with the command's flags). tian-iclr-t5-he
follows the code in these two alone (Tian et al. give no s, m); the rest of its setup is Tian et al.'s."""
import ast
import re
import shlex

import numpy as np

from conformance_setup import parse_args

REPO = "ShawnXYang/AT_HE"
PINNED = "dad6a41bb170bba94f9818e7ba891163143c3e10"


def generate(path, inp):
    readme = (path / "CIFAR-10" / "README.md").read_text()
    cmd = re.search(r"python train_adv_cifar10\.py (--loss=pgd_he[^\n]*)", readme).group(1)
    flags = shlex.split(cmd)
    tree = ast.parse((path / "CIFAR-10" / "train_adv_cifar10.py").read_text())
    args = parse_args(tree.body, flags)
    print(f"AT_HE: {flags} -> s {args.s}, m {args.m}")
    sources = {"he": {"file": "CIFAR-10/train_adv_cifar10.py", "function": "argparse (README's PGD-AT + HE flags)"}}
    meta = {"file": "CIFAR-10/train_adv_cifar10.py", "function": "-", "sources": sources, "flags": flags,
            "he": {"s": float(args.s), "m": float(args.m)}}
    return {"setup_he": ({"s": np.float64(args.s), "m": np.float64(args.m)}, meta)}
