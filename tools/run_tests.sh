#!/usr/bin/env bash
# The README's test command: set up the environment if needed, then run the test suite.
#   bash tools/run_tests.sh [pytest args]
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$(bash "$REPO/tools/ensure_env.sh")
cd "$REPO"
exec "$PY" -m pytest tests "$@"
