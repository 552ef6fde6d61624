#!/usr/bin/env bash
# Slurm: one task per GPU; mmengine reads SLURM_* and sets up the process group
# (launcher slurm).
set -euo pipefail
USAGE="usage: [GPUS=16 GPUS_PER_NODE=8] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [tools/train.py options]
  GPUS (default 8) tasks in all, GPUS_PER_NODE (default 8), CPUS_PER_TASK (default 5),
  SRUN_ARGS: more srun options; MASTER_PORT: the rendezvous port (default: derived from
  the job id, so that two jobs on one node do not meet on one port); PYTHON"
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/_dist_common.sh"
check_positional PARTITION "${1:-}"
check_positional JOB_NAME "${2:-}"
check_positional CONFIG "${3:-}"
check_positional WORK_DIR "${4:-}"
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
check_config "$CONFIG"
positive_int GPUS "$GPUS"
positive_int GPUS_PER_NODE "$GPUS_PER_NODE"
positive_int CPUS_PER_TASK "$CPUS_PER_TASK"
command -v srun >/dev/null || die "srun not found: run this on a Slurm login node"
if [ -n "${MASTER_PORT:-}" ]; then
  positive_int MASTER_PORT "$MASTER_PORT"
fi
# The port is chosen inside the job step (same value on every task): MASTER_PORT if given,
# else 20000 + job id mod 20000; mmengine's default 29500 would be shared by every job.
PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}" \
srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" \
  --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 $SRUN_ARGS \
  bash -c 'export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}; exec "$@"' \
  slurm_train "${PYTHON:-python}" -u "$HERE/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
  --launcher slurm "${@:5}"
