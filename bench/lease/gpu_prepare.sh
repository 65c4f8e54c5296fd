#!/usr/bin/env bash
# Before a GPU lease, here: what the GPU image lacks, into the git-ignored folders that the device `run` call
# carries (.whl: wheels; .devdata: the real CIFAR-10 subset). See bench/lease/gpu_suite.py and docs/performance.md.
#     bash bench/lease/gpu_prepare.sh        # the GPU plan (env, plan-training, gpu-tests, concurrency,
#                                            # aa-10k): synthetic data, and the official AutoAttack wheel (42 MB)
#                                            # for aa-10k
#     bash bench/lease/gpu_prepare.sh real   # the parts after the plan that train on real images (real-epoch,
#                                            # bf16): the subset (17 MB) in place of the AutoAttack wheel;
#                                            # together they would pass a call's 64 MiB
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
mkdir -p .whl .devdata
# Pure-Python packages fastfair imports that the image (torch 2.11, Python 3.12) does not have.
wheels=(tomli_w torchattacks)
if [[ "${1:-}" == real ]]; then
    rm -f .whl/pyautoattack-*.whl
    cp -n ../shared/data/cifar10-subset.npz .devdata/
else
    wheels+=(pyautoattack)
    rm -f .devdata/cifar10-subset.npz
fi
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 -d .whl "${wheels[@]}"
du -sh .whl .devdata
