#!/usr/bin/env bash
# Before a GPU lease, here: what the GPU image lacks, into the git-ignored folders that the
# device `run` call carries (.whl: wheels; .devdata: the real CIFAR-10 subset). See bench/gpu_suite.py.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .devdata
# Pure-Python packages fastfair imports that the image (torch 2.11, Python 3.12) does not have.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl tomli_w torchattacks pyautoattack
cp -n ../shared/data/cifar10-subset.npz .devdata/
du -sh .whl .devdata
