#!/usr/bin/env bash
# One device call on a lent GPU machine: install the wheels of .whl/ (benchmarks/gpu_wheels.sh) into
# /tmp/site, then run benchmarks/gpu.py with its results in $OUT (gpu.json, gpu.md, sections.log, gpu.log).
#
#     run tool: command "bash benchmarks/gpu_run.sh", carry [".whl"], timeout_s 540
#
# Arguments go to gpu.py (for a rerun of some sections: bash benchmarks/gpu_run.sh --sections ddp --budget 200).
# gpu.py keeps to its --budget (460 s): with the install, about 8 minutes in all.
set -uo pipefail
cd "$(dirname "$0")/.."
if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "no wheels in .whl/: run 'bash benchmarks/gpu_wheels.sh' here and carry .whl" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 3
# The package is used from the working tree, not installed.
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 WANDB_MODE=offline
OUT="${OUT:-$(mktemp -d)}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,utilization.gpu --format=csv || true
python3 benchmarks/gpu.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"
