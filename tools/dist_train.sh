#!/usr/bin/env bash
# Distributed training with torchrun, one process per GPU (gloo on a machine without one).
set -euo pipefail
USAGE="usage: bash tools/dist_train.sh CONFIG GPUS [tools/train.py options]
  CONFIG  config file; GPUS  processes (GPUs) on this node, a positive integer
  one node: torchrun picks a free rendezvous port itself (set PORT to choose one)
  several nodes: NNODES=N NODE_RANK=I MASTER_ADDR=HOST PORT=P on every node
  PYTHON: the interpreter (default: python)"
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/_dist_common.sh"
check_positional CONFIG "${1:-}"
check_positional GPUS "${2:-}"
CONFIG=$1
GPUS=$2
check_config "$CONFIG"
check_gpus "$GPUS"
set_rendezvous
# torchrun under a relay (stdlib only, run by path): SIGTERM / SIGUSR1 to this
# process group reach every rank, and the job exits with the ranks' code (0 after a
# PreemptionHook save); see mmdet3d_scaling/parallel/signal_relay.py
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
exec "${PYTHON:-python}" "$HERE/../mmdet3d_scaling/parallel/signal_relay.py" "${RDZV_ARGS[@]}" \
  --nproc_per_node="$GPUS" \
  "$HERE/train.py" "$CONFIG" --launcher pytorch "${@:3}"
