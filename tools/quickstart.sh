#!/usr/bin/env bash
# The README's main job: set up the environment if needed, generate synthetic KITTI-format
# data (if absent), train the demo detector, evaluate it and print the metrics table.
#   bash tools/quickstart.sh [tools/demo.py args]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$(bash "$REPO/tools/ensure_env.sh")
cd "$REPO"
exec "$PY" tools/demo.py "$@"
