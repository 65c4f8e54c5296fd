#!/usr/bin/env bash
# Before a GPU lease, here: what the GPU image lacks, into the git-ignored folders that the
# device `run` call carries (.whl: wheels; .devdata: the real CIFAR-10 subset). See bench/gpu_suite.py.
#     bash bench/gpu_prepare.sh        # for every part but aa
#     bash bench/gpu_prepare.sh aa     # for the aa part: the official AutoAttack wheel (42 MB) in place
#                                      # of the subset (17 MB), which together pass a call's 64 MiB
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .devdata
# Pure-Python packages fastfair imports that the image (torch 2.11, Python 3.12) does not have.
wheels=(tomli_w torchattacks)
if [[ "${1:-}" == aa ]]; then
    wheels+=(pyautoattack)
    rm -f .devdata/cifar10-subset.npz
else
    rm -f .whl/pyautoattack-*.whl
    cp -n ../shared/data/cifar10-subset.npz .devdata/
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl "${wheels[@]}"
du -sh .whl .devdata
