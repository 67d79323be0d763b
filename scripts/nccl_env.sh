# Sourced by the launch scripts (scripts/torchrun_node.sh, benchmarks/device/gpu_run.sh; scripts/slurm_ddp.sbatch
# holds a copy, since sbatch runs a copy of its script away from this folder) before they start the ranks.
# FLIGHT_RECORDER_DIR (default $PWD/flight_recorder): the folder of the per-rank dumps below.
#
# NCCL ends a timed-out collective itself: its watchdog tears the process down (TORCH_NCCL_ASYNC_ERROR_HANDLING's
# default), Python never sees an exception and HangWatchdog's report is not attached to it. What says where each
# rank was is the flight recorder: its last collectives, dumped per rank at the timeout to
# $FLIGHT_RECORDER_DIR/nccl_trace_rank_<rank> (docs/troubleshooting.md reads them). Values you set win.
export TORCH_NCCL_DUMP_ON_TIMEOUT="${TORCH_NCCL_DUMP_ON_TIMEOUT:-1}"
export TORCH_FR_BUFFER_SIZE="${TORCH_FR_BUFFER_SIZE:-2000}"
export TORCH_FR_DUMP_TEMP_FILE="${TORCH_FR_DUMP_TEMP_FILE:-${FLIGHT_RECORDER_DIR:-$PWD/flight_recorder}/nccl_trace_rank_}"
export TORCH_NCCL_TRACE_BUFFER_SIZE="${TORCH_NCCL_TRACE_BUFFER_SIZE:-$TORCH_FR_BUFFER_SIZE}"  # older torch's names
export TORCH_NCCL_DEBUG_INFO_TEMP_FILE="${TORCH_NCCL_DEBUG_INFO_TEMP_FILE:-$TORCH_FR_DUMP_TEMP_FILE}"
mkdir -p "$(dirname "$TORCH_FR_DUMP_TEMP_FILE")"
# Rect validation batches change shape: expandable segments grow one allocation instead of caching blocks per
# size (PyTorch's CUDA notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF": "a job changing
# allocation sizes frequently, such as having a changing batch size").
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
