#!/usr/bin/env bash
# On the lent GPU, as the device `run` command (carry: .whl .devdata), after `bash bench/lease/gpu_prepare.sh`
# here:
#     set -o pipefail; bash bench/lease/gpu_lease.sh 2>&1 | tee $OUT/lease.log          (timeout_s 590)
# installs fastfair and the wheels the image lacks, runs the parts of the GPU suite that fit this command's
# time (MAX_S, default 540 s: the GPU plan, docs/performance.md) and packs every result into
# $OUT/gpu-suite.tar.gz. Extra arguments go to the suite (--only PART..., --redo). Run it again to go on.
set -uo pipefail
cd "$(dirname "$0")/../.."  # the repository root
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site || exit 1
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 bench/lease/gpu_suite.py --max-s "${MAX_S:-540}" --pack "${OUT:-/tmp/gpu-suite-out}" "$@"
