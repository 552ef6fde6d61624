# Sourced by dist_train.sh / dist_test.sh: argument checks and torchrun's rendezvous.
# Every bad argument stops here, named, with the calling script's usage text ($USAGE),
# before torchrun starts a process.

die() {  # die MESSAGE: the error, the usage, exit 2
  echo "$(basename "$0"): error: $1" >&2
  echo "$USAGE" >&2
  exit 2
}

positive_int() {  # positive_int NAME VALUE
  [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "$1 must be a positive integer, got '$2'"
}

check_positional() {  # check_positional NAME VALUE: present, and not an option
  case "$2" in
    -h|--help) echo "$USAGE"; exit 0 ;;
    -*) die "unknown option '$2' where $1 belongs (this script's settings are environment \
variables; options for the Python tool go after the positional arguments)" ;;
    '') die "missing $1" ;;
  esac
}

check_config() {  # check_config PATH
  [ -f "$1" ] || die "config file '$1' does not exist"
}

check_gpus() {  # check_gpus GPUS: positive, and no more than the visible CUDA devices
  positive_int GPUS "$1"
  local visible
  visible=$("${PYTHON:-python}" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null) \
    || die "cannot run '${PYTHON:-python}' with torch (set PYTHON to the interpreter to use)"
  if [ "$visible" -gt 0 ] && [ "$1" -gt "$visible" ]; then
    die "GPUS=$1 but only $visible CUDA device(s) are visible\
${CUDA_VISIBLE_DEVICES+ (CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES)}: give at most $visible"
  fi
}

# RDZV_ARGS: how torchrun's processes find each other.
#  - one node, no PORT / MASTER_PORT given: --standalone. torchrun's c10d rendezvous binds
#    a free port itself (localhost:0) and keeps it: two jobs started at once cannot race
#    for a port that a script checked and released.
#  - several nodes (NNODES > 1), or a port given: the classic static rendezvous on
#    MASTER_ADDR:PORT, the same on every node.
set_rendezvous() {
  NNODES=${NNODES:-1}
  NODE_RANK=${NODE_RANK:-0}
  positive_int NNODES "$NNODES"
  [[ "$NODE_RANK" =~ ^[0-9]+$ ]] && [ "$NODE_RANK" -lt "$NNODES" ] \
    || die "NODE_RANK must be an integer from 0 to NNODES-1=$((NNODES - 1)), got '$NODE_RANK'"
  local port=${PORT:-${MASTER_PORT:-}}
  if [ "$NNODES" -eq 1 ] && [ -z "$port" ]; then
    RDZV_ARGS=(--standalone)
    return
  fi
  if [ "$NNODES" -gt 1 ] && [ -z "${MASTER_ADDR:-}" ]; then
    die "NNODES=$NNODES needs MASTER_ADDR (the address of node 0, the same on every node)"
  fi
  port=${port:-29500}
  positive_int PORT "$port"
  RDZV_ARGS=(--nnodes="$NNODES" --node_rank="$NODE_RANK"
             --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="$port")
}
