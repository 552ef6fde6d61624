#!/usr/bin/env bash
# Distributed testing with torchrun, one process per GPU (gloo on a machine without one).
set -euo pipefail
USAGE="usage: bash tools/dist_test.sh CONFIG CHECKPOINT GPUS [tools/test.py options]
  CONFIG  config file; CHECKPOINT  checkpoint file; GPUS  processes (GPUs) on this node
  one node: torchrun picks a free rendezvous port itself (set PORT to choose one)
  several nodes: NNODES=N NODE_RANK=I MASTER_ADDR=HOST PORT=P on every node
  PYTHON: the interpreter (default: python)"
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/_dist_common.sh"
check_positional CONFIG "${1:-}"
check_positional CHECKPOINT "${2:-}"
check_positional GPUS "${3:-}"
CONFIG=$1
CHECKPOINT=$2
GPUS=$3
check_config "$CONFIG"
case "$CHECKPOINT" in
  http://*|https://*) ;;
  *) [ -f "$CHECKPOINT" ] || die "checkpoint file '$CHECKPOINT' does not exist" ;;
esac
check_gpus "$GPUS"
set_rendezvous
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
exec "${PYTHON:-python}" -m torch.distributed.run "${RDZV_ARGS[@]}" \
  --nproc_per_node="$GPUS" \
  "$HERE/test.py" "$CONFIG" "$CHECKPOINT" --launcher pytorch "${@:4}"
