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

# NCCL ends a timed-out collective itself: its watchdog tears the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING's
# default), Python never sees an exception and HangWatchdog's report is not attached to it. What says where each
# rank was is the flight recorder: its last collectives, dumped per rank at the timeout to
# $OUT/flight_recorder/nccl_trace_rank_<rank> (docs/troubleshooting.md reads them). Values you set win.
export TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}"
export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}"
export TORCH_FR_DUMP_TEMP_FILE="${TORCH_FR_DUMP_TEMP_FILE:-$OUT/flight_recorder/nccl_trace_rank_}"
export TORCH_NCCL_TRACE_BUFFER_SIZE="${TORCH_NCCL_TRACE_BUFFER_SIZE:-$TORCH_FR_BUFFER_SIZE}"  # older torch's names
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$TORCH_FR_DUMP_TEMP_FILE}"
mkdir -p "$(dirname "$TORCH_FR_DUMP_TEMP_FILE")"
# Rect validation batches change shape: expandable segments grow one allocation instead of caching blocks per
# size (PyTorch's CUDA notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": "a job changing
# allocation sizes frequently, such as having a changing batch size").
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,utilization.gpu --format=csv || true
python3 benchmarks/device/gpu.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu.log"
