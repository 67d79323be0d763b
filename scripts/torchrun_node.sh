#!/usr/bin/env bash
# One node of a multi-node DDP fit, launched by torchrun. Run it on EVERY node with the same NNODES,
# MASTER_ADDR, MASTER_PORT and RUN_ID; arguments are passed to `yolo11-lightning fit`. The node count and
# GPUs per node come last so no config file overrides them; `--ckpt_path last` comes first so yours can.
#
#   node 0:  NNODES=2 NODE_RANK=0 MASTER_ADDR=10.1.0.11 scripts/torchrun_node.sh --config configs/quickstart.yaml
#   node 1:  NNODES=2 NODE_RANK=1 MASTER_ADDR=10.1.0.11 scripts/torchrun_node.sh --config configs/quickstart.yaml
#
# Environment (default):
#   NNODES (1)            nodes in the job                 GPUS_PER_NODE (8)   worker processes per node
#   NODE_RANK (0)         this node's rank (0 hosts the rendezvous store with the static backend)
#   MASTER_ADDR (127.0.0.1), MASTER_PORT (29500)           a node every node can reach, a free TCP port
#   RUN_ID (yolo11)       rendezvous id: unique per job when several jobs share MASTER_ADDR:MASTER_PORT
#   RDZV_BACKEND (c10d)   c10d: elastic rendezvous hosted on MASTER_ADDR (restarts re-rendezvous all nodes);
#                         static: fixed NODE_RANK, torch.distributed's MASTER_ADDR/MASTER_PORT
#   MAX_RESTARTS (3)      times torchrun restarts the workers after a failure; each restart resumes from the
#                         newest last.ckpt (`--ckpt_path last`, fresh start when there is none)
#   PYTHON (python)       the interpreter that has yolo11_lightning installed
set -euo pipefail

NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
GPUS_PER_NODE="${GPUS_PER_NODE:-8}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"
RUN_ID="${RUN_ID:-yolo11}"
RDZV_BACKEND="${RDZV_BACKEND:-c10d}"
MAX_RESTARTS="${MAX_RESTARTS:-3}"
PYTHON="${PYTHON:-python}"

# torchrun (torch >= 2.5) lets the workers share its rendezvous TCPStore; after a restart the new workers can
# read addresses the dead ones published and fail with "Connection refused" (pytorch/pytorch#135712).
# A store per attempt avoids that.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"

if [[ "$RDZV_BACKEND" == "static" ]]; then
  rendezvous=(--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --node-rank "$NODE_RANK")
else
  rendezvous=(--rdzv-backend "$RDZV_BACKEND" --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RUN_ID"
              --node-rank "$NODE_RANK")
fi

exec "$PYTHON" -m torch.distributed.run \
  --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" "${rendezvous[@]}" --max-restarts "$MAX_RESTARTS" \
  -m yolo11_lightning fit --ckpt_path last "$@" --trainer.num_nodes "$NNODES" --trainer.devices "$GPUS_PER_NODE"
