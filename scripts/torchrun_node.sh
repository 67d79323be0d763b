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
#   SOCKET_IFNAME (auto)  network interface for gloo/NCCL traffic (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME,
#                         unless those are set); auto: the interface of the route to MASTER_ADDR, or on the
#                         node that holds MASTER_ADDR the interface with that address. Logged at start-up.
#   RDZV_TIMEOUT (600)    seconds the nodes wait for each other to join the rendezvous
#   STORE_TIMEOUT (60)    seconds a rendezvous store operation (the first connection included) may take:
#                         a MASTER_ADDR:MASTER_PORT nobody answers fails after this long
#   AGENT_GRACE (RDZV_TIMEOUT + 2 x STORE_TIMEOUT + 30)  seconds torchrun may go on without a live worker
#                         before this script ends it (also when its exited workers stay unreaped for
#                         STORE_TIMEOUT): a node cut off from MASTER_ADDR leaves torchrun blocked in a store
#                         call with no timeout, after its workers have ended
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
RDZV_TIMEOUT="${RDZV_TIMEOUT:-600}"
STORE_TIMEOUT="${STORE_TIMEOUT:-60}"
AGENT_GRACE="${AGENT_GRACE:-$((RDZV_TIMEOUT + 2 * STORE_TIMEOUT + 30))}"

log() { echo "torchrun_node.sh (node $NODE_RANK): $*" >&2; }

# The interface the other nodes reach this one on. Left to themselves, gloo binds to whatever this host's
# name resolves to and NCCL to the first interface it likes; either can be `lo` or `docker0`, which the
# other nodes cannot reach.
master_ip="$(getent ahostsv4 "$MASTER_ADDR" 2>/dev/null | awk 'NR == 1 {print $1}')" || true
master_ip="${master_ip:-$MASTER_ADDR}"
if ((NNODES > 1)) && [[ "$master_ip" == 127.* ]]; then
  log "WARNING: MASTER_ADDR $MASTER_ADDR is $master_ip on this node, a loopback address the other nodes cannot reach (an /etc/hosts entry like '127.0.1.1 $(hostname)'?): give node 0's address on the network the nodes share"
fi
if [[ -z "${SOCKET_IFNAME:-}" ]] && command -v ip >/dev/null; then
  route="$(ip -o route get "$master_ip" 2>/dev/null)" || route=""
  if [[ "$route" == local* ]]; then  # MASTER_ADDR is this node: the interface that holds the address
    SOCKET_IFNAME="$(ip -o addr show to "$master_ip" 2>/dev/null | awk 'NR == 1 {print $2}')"
    how="the interface holding MASTER_ADDR $MASTER_ADDR ($master_ip)"
  else
    SOCKET_IFNAME="$(sed -n 's/.* dev \([^ ]*\).*/\1/p' <<<"$route")"
    how="the route to MASTER_ADDR $MASTER_ADDR ($master_ip)"
  fi
else
  how="SOCKET_IFNAME"
fi
if [[ -n "${SOCKET_IFNAME:-}" ]]; then
  export GLOO_SOCKET_IFNAME="${GLOO_SOCKET_IFNAME:-$SOCKET_IFNAME}"
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-$SOCKET_IFNAME}"
  log "network interface $SOCKET_IFNAME (from $how): GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME NCCL_SOCKET_IFNAME=$NCCL_SOCKET_IFNAME"
  # The address the workers of node 0 publish for the others (torchrun's default is this host's FQDN).
  local_ip="$(ip -o -4 addr show dev "$SOCKET_IFNAME" 2>/dev/null | awk 'NR == 1 {sub(/\/.*/, "", $4); print $4}')" || true
else
  log "no route to MASTER_ADDR $MASTER_ADDR found: gloo/NCCL choose the interface (set SOCKET_IFNAME)"
fi

# torchrun (torch >= 2.5) lets the workers share its rendezvous TCPStore; after a restart the new workers can
# read addresses the dead ones published and fail with "Connection refused" (pytorch/pytorch#135712).
# A store per attempt avoids that.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"

# The flight recorder's dump (into $PWD/flight_recorder) and expandable segments, as every launch script sets them.
source "$(dirname "${BASH_SOURCE[0]}")/nccl_env.sh"

if [[ "$RDZV_BACKEND" == "static" ]]; then
  rendezvous=(--master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" --node-rank "$NODE_RANK")
else
  rendezvous=(--rdzv-backend "$RDZV_BACKEND" --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$RUN_ID"
              --node-rank "$NODE_RANK" --rdzv-conf "join_timeout=$RDZV_TIMEOUT,read_timeout=$STORE_TIMEOUT")
fi
if [[ -n "${local_ip:-}" ]]; then
  rendezvous+=(--local-addr "$local_ip")
fi

"$PYTHON" -m torch.distributed.run \
  --nnodes "$NNODES" --nproc-per-node "$GPUS_PER_NODE" "${rendezvous[@]}" --max-restarts "$MAX_RESTARTS" \
  -m yolo11_lightning fit --ckpt_path last "$@" --trainer.num_nodes "$NNODES" --trainer.devices "$GPUS_PER_NODE" &
agent=$!
trap 'kill -TERM "$agent" 2>/dev/null' TERM INT HUP  # torchrun passes it on to the workers

# torchrun's own store calls can block for good once MASTER_ADDR is unreachable, and a blocked torchrun no
# longer even reaps its exited workers. Each worker ends itself (the collective timeout, HangWatchdog), so a
# torchrun whose workers all exited but stay unreaped for STORE_TIMEOUT seconds, or that has had no worker
# for AGENT_GRACE seconds, is stuck: end it, and with it this node.
idle_since=$SECONDS
unreaped_since=""
stuck=""
while kill -0 "$agent" 2>/dev/null; do
  states="$(ps -o stat= --ppid "$agent" 2>/dev/null)" || states=""
  if [[ -n "$states" ]] && grep -qv '^ *Z' <<<"$states"; then  # a live worker
    idle_since=$SECONDS
    unreaped_since=""
  elif [[ -n "$states" ]]; then  # only exited workers, which a working torchrun reaps within a second
    unreaped_since="${unreaped_since:-$SECONDS}"
    ((SECONDS - unreaped_since < STORE_TIMEOUT)) || stuck="its exited workers stayed unreaped for $((SECONDS - unreaped_since)) s"
  elif ((SECONDS - idle_since >= AGENT_GRACE)); then
    stuck="it has had no live worker for $((SECONDS - idle_since)) s (AGENT_GRACE=$AGENT_GRACE)"
  fi
  if [[ -n "$stuck" ]]; then
    log "torchrun is blocked: $stuck; it cannot reach the rendezvous store at $MASTER_ADDR:$MASTER_PORT. Ending it."
    kill -TERM "$agent" 2>/dev/null
    sleep 5
    kill -KILL "$agent" 2>/dev/null || true
    wait "$agent" 2>/dev/null || true
    exit 1
  fi
  sleep 1 &
  wait $! || true
done
wait "$agent"
