#!/usr/bin/env bash
# Install check (CI runs it after the tests): the package as a user gets it, not the checkout.
#
#   bash tools/check_install.sh [--keep]     # --keep: leave the temp folder for a look
#
# 7 to 9.5 min on 2 shared cores once mmcv's wheel is in pip's cache (.ci/run builds it
# first); about 5 of them install the new venv's torch, mmcv and requirements.
#
# 1. build the sdist, then the wheel from that sdist (`python -m build --no-isolation`);
# 2. install the wheel into a fresh virtualenv in a temp folder outside the checkout,
#    with the stack in tools/ensure_env.sh's order (torch from the local CPU wheel, mmcv
#    from pip's wheel cache once built, requirements/*.txt, the wheel with --no-deps);
# 3. from a folder outside the checkout: mmdet3d_scaling imports from that venv, its
#    .mim holds configs/ and tools/ as plain files, and `mmdet3d_scaling::` resolves
#    (mmengine.hub.get_config of every config there, and a user config's `_base_`);
# 4. generate a tiny synthetic KITTI set with the installed tools, and train one CPU
#    step of the demo config through a user config inheriting
#    `mmdet3d_scaling::demo/pointpillars_synthetic_kitti_cpu.py`, with the installed
#    `.mim/tools/train.py`;
# 5. `pip install openmim`; `mim search mmdet3d_scaling` lists bevfusion_1gpu and the
#    PV-RCNN configs (the model index); `mim train mmdet3d_scaling <config name>`: one step.
# Each training step must leave its checkpoint. Prints the time of each part.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
KEEP=0
[ "${1:-}" = "--keep" ] && KEEP=1
START=$(date +%s)
say() { echo "[check_install +$(( $(date +%s) - START ))s] $*"; }
die() { echo "[check_install] FAILED: $*" >&2; exit 1; }

# The checkout's environment builds (it has `build`); $BUILD_PY overrides it.
PY=${BUILD_PY:-$(bash "$REPO/tools/ensure_env.sh")}
BASE_PY=$(command -v python3.11 || command -v python3)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mmdet3d_scaling_install.XXXXXX")
WORK=$(cd "$WORK" && pwd -P)
case "$WORK/" in "$(cd "$REPO" && pwd -P)/"*) die "temp folder $WORK is inside the checkout";; esac
if [ "$KEEP" = 1 ]; then say "keeping $WORK"; else trap 'rm -rf "$WORK"' EXIT; fi

say "building sdist and wheel (from the sdist) into $WORK/dist"
"$PY" -m build --no-isolation --outdir "$WORK/dist" "$REPO" > "$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log"; die "python -m build"; }
SDIST=$(ls "$WORK"/dist/*.tar.gz)
WHEEL=$(ls "$WORK"/dist/*.whl)
tar tzf "$SDIST" > "$WORK/sdist.txt"  # (not piped into grep -q: pipefail + SIGPIPE)
grep -q '/mmdet3d_scaling/.mim/configs/demo/pointpillars_synthetic_kitti_cpu.py$' "$WORK/sdist.txt" \
  || die "$SDIST has no mmdet3d_scaling/.mim/configs"

say "fresh virtualenv $WORK/venv ($BASE_PY)"
"$BASE_PY" -m venv "$WORK/venv"
VPY=$WORK/venv/bin/python
PIP=("$VPY" -m pip --disable-pip-version-check -q)
"${PIP[@]}" install torch==2.13.0
"${PIP[@]}" install 'setuptools<70' wheel
say "torch installed; mmcv 2.1.0 with ops (pip's cached wheel when built before)"
MMCV_WITH_OPS=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} "${PIP[@]}" install --no-build-isolation mmcv==2.1.0
"${PIP[@]}" install -r "$REPO/requirements/runtime.txt"
"${PIP[@]}" install --no-deps -r "$REPO/requirements/nodeps.txt"
"${PIP[@]}" install --no-deps "$WHEEL"
say "stack and $(basename "$WHEEL") installed"

USER_DIR=$WORK/user
mkdir -p "$USER_DIR"
cd "$USER_DIR"
export REPO
unset PYTHONPATH
cat > user_cfg.py <<'EOF'
# A user's config: the plugin's demo config, by package path.
_base_ = ['mmdet3d_scaling::demo/pointpillars_synthetic_kitti_cpu.py']
EOF
PKG=$("$VPY" - <<'EOF'
import os, sys
import mmdet3d_scaling
from mmengine.config import Config
from mmengine.hub import get_config
from mmengine.utils import get_installed_path

pkg = os.path.dirname(os.path.realpath(mmdet3d_scaling.__file__))
repo = os.path.realpath(os.environ['REPO'])
assert not pkg.startswith(repo + os.sep), f'imported from the checkout: {pkg}'
assert pkg.startswith(os.path.realpath(sys.prefix) + os.sep), f'not from the venv: {pkg}'
assert os.path.realpath(get_installed_path('mmdet3d-scaling')) == pkg
mim = os.path.join(pkg, '.mim')
for rel in ('configs/demo/pointpillars_synthetic_kitti_cpu.py', 'tools/train.py',
            'tools/create_synthetic_data.py', 'model-index.yml'):
    path = os.path.join(mim, rel)
    assert os.path.isfile(path) and not os.path.islink(path), f'missing or a link: {path}'
demo = os.path.join(mim, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')
assert get_config('mmdet3d_scaling::demo/pointpillars_synthetic_kitti_cpu.py').filename == demo
inherited = get_config('mmdet3d_scaling::pv_rcnn/pv_rcnn_1xb2-80e_kitti-3d-3class.py')
assert inherited.model.type == 'PointVoxelRCNN'  # through mmdet3d:: and ./ bases
configs = os.path.join(mim, 'configs')
for root, _, files in os.walk(configs):  # every config parses from the installed copy
    for name in sorted(f for f in files if f.endswith('.py')):
        get_config('mmdet3d_scaling::' + os.path.relpath(os.path.join(root, name), configs))
assert Config.fromfile('user_cfg.py').model.type == 'VoxelNet'
print(pkg)
EOF
) || die "the installed package"
say "imports from $PKG; mmdet3d_scaling:: configs resolve"

"$VPY" "$PKG/.mim/tools/create_synthetic_data.py" kitti --out data/synthetic_kitti \
  --train-frames 4 --val-frames 2 --no-progress
# The demo's data_root is data/synthetic_kitti/ relative to the working folder; one
# iteration, no validation, a checkpoint at the step.
ONE_STEP=(train_cfg.max_iters=1 train_cfg.val_begin=2 default_hooks.checkpoint.interval=1)

say "one training step: installed tools/train.py user_cfg.py"
"$VPY" "$PKG/.mim/tools/train.py" user_cfg.py --work-dir "$USER_DIR/work_dirs/train" \
  --cfg-options "${ONE_STEP[@]}" > train.log 2>&1 || { tail -40 train.log; die "tools/train.py"; }
[ -f work_dirs/train/iter_1.pth ] || { tail -40 train.log; die "no iter_1.pth from tools/train.py"; }

say "installing openmim"
"${PIP[@]}" install openmim
say "mim search mmdet3d_scaling: the model index lists the configs"
"$WORK/venv/bin/mim" search mmdet3d_scaling --valid-config > mim_search.txt 2>&1 \
  || { tail -20 mim_search.txt; die "mim search"; }
for name in bevfusion_1gpu pv_rcnn_synthetic_kitti pv_rcnn_8xb2-80e_kitti-3d-3class; do
  grep -q "'$name'" mim_search.txt || { cat mim_search.txt; die "mim search lists no $name"; }
done
say "one training step: mim train mmdet3d_scaling pointpillars_synthetic_kitti_cpu.py"
"$WORK/venv/bin/mim" train mmdet3d_scaling pointpillars_synthetic_kitti_cpu.py \
  --work-dir "$USER_DIR/work_dirs/mim" --cfg-options "${ONE_STEP[@]}" > mim.log 2>&1 \
  || { tail -40 mim.log; die "mim train"; }
grep -q "$PKG/.mim/tools/train.py" mim.log || { tail -40 mim.log; die "mim did not run .mim/tools/train.py"; }
[ -f work_dirs/mim/iter_1.pth ] || { tail -40 mim.log; die "no iter_1.pth from mim train"; }

say "install check passed in $(( $(date +%s) - START )) s"
