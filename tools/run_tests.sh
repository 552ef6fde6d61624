#!/usr/bin/env bash
# The README's test command: set up the environment if needed, then run the test suite.
#   bash tools/run_tests.sh [pytest args]          # every test, 2 workers, then the 25 slowest
#   bash tools/run_tests.sh --fast [pytest args]   # the fast tier: -m "not slow"
# The full tier runs on pytest-xdist workers (TEST_WORKERS, default 2; 0 runs in this
# process), a test file a worker (--dist loadfile: a module's fixtures are built once);
# every worker and every process it starts uses one intra-op thread (OMP_NUM_THREADS=1).
# Tiers and their measured times: docs/tools.md ("Tests"); markers: pytest.ini.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=$(bash "$REPO/tools/ensure_env.sh")
cd "$REPO"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [[ "${1:-}" == "--fast" ]]; then
    shift
    exec "$PY" -m pytest tests -m "not slow" --durations=10 "$@"
fi
WORKERS=${TEST_WORKERS:-2}
PARALLEL=()
if [[ "$WORKERS" != 0 ]]; then
    PARALLEL=(-n "$WORKERS" --dist loadfile)
fi
exec "$PY" -m pytest tests "${PARALLEL[@]}" --durations=25 "$@"
