#!/usr/bin/env bash
# The README's test command: set up the environment if needed, then run the test suite.
#   bash tools/run_tests.sh [pytest args]          # every test, then the 25 slowest
#   bash tools/run_tests.sh --fast [pytest args]   # the fast tier: -m "not slow"
# Tiers and their measured times: docs/tools.md ("Tests"); markers: pytest.ini.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$(bash "$REPO/tools/ensure_env.sh")
cd "$REPO"
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec "$PY" -m pytest tests -m "not slow" --durations=10 "$@"
fi
exec "$PY" -m pytest tests --durations=25 "$@"
