#!/usr/bin/env bash
# One device call on a lent GPU machine: install the wheels of .whl/ (benchmarks/device/gpu_wheels.sh) into
# /tmp/site (scratch on the lent machine, gone with it), then run benchmarks/device/gpu.py with its results in
# $OUT (gpu.json, gpu.md, sections.log, gpu.log).
#
#     run tool: command "bash benchmarks/device/gpu_run.sh", carry [".whl"], timeout_s 330
#
# Arguments go to gpu.py; a rerun of some sections:
#
#     bash benchmarks/device/gpu_run.sh --sections ddp --budget 200
#
# gpu.py keeps to its --budget (240 s): with the install about 5 minutes, so that with the machine's start a
# rerun still fits in a 15-minute device allowance.
set -uo pipefail
cd "$(dirname "$0")/../.."
if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "no wheels in .whl/: run 'bash benchmarks/device/gpu_wheels.sh' here and carry .whl" >&2
    exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 3
# The package is used from the working tree, not installed.
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 YOLO_OFFLINE=1 WANDB_MODE=offline
OUT="${OUT:-$(mktemp -d)}"

# The flight recorder's dump (into $OUT/flight_recorder) and expandable segments, as the launch scripts set them.
FLIGHT_RECORDER_DIR="$OUT/flight_recorder"
source scripts/nccl_env.sh
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,utilization.gpu --format=csv || true
python3 benchmarks/device/gpu.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"
