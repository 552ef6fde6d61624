#!/usr/bin/env bash
# Make sure a Python environment with the whole stack exists, then print its python.
#
# Used by tools/quickstart.sh and tools/run_tests.sh (the README's two commands).
# Picks, in order: the active virtualenv ($VIRTUAL_ENV), the active conda env
# ($CONDA_PREFIX), else `.venv` in the repository (created when missing).
# Quick when already set up: a stamp in the env records the hash of the requirement
# files, and the install only runs when that hash changes or an import fails.
#
# What it installs, and why in this order (docs/installation.md has the details):
#   1. torch, only when absent (CPU wheel 2.13.0; GPU users bring their own CUDA build);
#   2. setuptools<70 (mmcv 2.1.0's setup.py imports pkg_resources);
#   3. mmcv 2.1.0 with compiled ops, only when no working mmcv 2.1.x with ops is there:
#      built from the sdist once (~11 min on 2 cores), then pip's wheel cache serves it;
#   4. requirements/runtime.txt, then requirements/nodeps.txt with --no-deps, then this
#      package in editable mode and the test requirements.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "[ensure_env] $*" >&2; }

if [ -n "${VIRTUAL_ENV:-}" ]; then
  ENV_DIR=$VIRTUAL_ENV
elif [ -n "${CONDA_PREFIX:-}" ]; then
  ENV_DIR=$CONDA_PREFIX
else
  ENV_DIR=$REPO/.venv
  if [ ! -x "$ENV_DIR/bin/python" ]; then
    BASE_PY=$(command -v python3.11 || command -v python3)
    log "creating $ENV_DIR with $BASE_PY"
    "$BASE_PY" -m venv "$ENV_DIR"
  fi
fi
PY=$ENV_DIR/bin/python
[ -x "$PY" ] || { log "no python in $ENV_DIR"; exit 1; }
PIP=("$PY" -m pip --disable-pip-version-check)

STAMP=$ENV_DIR/.mmdet3d_scaling_env
WANT=$(cat "$REPO"/requirements/*.txt "$REPO"/setup.py | sha256sum | cut -c1-16)

stack_imports() {
  "$PY" - <<'PY' >/dev/null 2>&1
import mmcv, mmcv.ops, mmdet, mmdet3d, mmengine, torch, spconv, mmdet3d_scaling
import mmdet3d.evaluation, mmdet3d.datasets, mmdet3d.models
from mmcv.ops import Voxelization, nms_rotated
assert mmcv.__version__.startswith('2.1.')
PY
}

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && stack_imports; then
  echo "$PY"
  exit 0
fi

log "installing the stack into $ENV_DIR (first run only)"
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  log "torch not found: installing the CPU build torch==2.13.0"
  "${PIP[@]}" install torch==2.13.0 >&2
fi
# After torch: torch's own metadata asks for a newer setuptools, mmcv's build an older one.
"${PIP[@]}" install 'setuptools<70' wheel >&2

if "$PY" -c 'import mmcv, mmcv.ops; from mmcv.ops import nms; assert mmcv.__version__.startswith("2.1.")' >/dev/null 2>&1; then
  log "using the mmcv $("$PY" -c 'import mmcv; print(mmcv.__version__)') with compiled ops already installed"
else
  log "building mmcv 2.1.0 with ops (about 11 min on 2 cores the first time; cached after)"
  MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} \
    "${PIP[@]}" install --no-build-isolation mmcv==2.1.0 >&2
fi

"${PIP[@]}" install -r "$REPO/requirements/runtime.txt" >&2
"${PIP[@]}" install --no-deps -r "$REPO/requirements/nodeps.txt" >&2
"${PIP[@]}" install --no-deps --no-build-isolation -e "$REPO" >&2
"${PIP[@]}" install -r "$REPO/requirements/tests.txt" >&2

if ! stack_imports; then
  log "the stack still does not import; details:"
  "$PY" -c 'import mmcv.ops, mmdet3d, spconv, mmdet3d_scaling' >&2 || true
  exit 1
fi
echo "$WANT" > "$STAMP"
log "environment ready: $PY"
echo "$PY"
