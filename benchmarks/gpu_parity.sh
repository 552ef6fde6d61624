#!/usr/bin/env bash
# PV-RCNN parity on one large GPU (docs/parity.md, "PV-RCNN on one H200"): the two
# 1-process arrangements of effective batch 16 with the speed patch set on, and the
# reference arrangement with the speed set off, 3 seeds each, PARITY_ITERS optimizer
# steps (default 1000; the config's own 200 reach 3D AP 0.64 only). The runs take
# hours, far longer than one device command (10 min), so they run in the background
# and a command only starts or watches them:
#
#   bash benchmarks/gpu_parity.sh start   # data, launch (setsid), watch WAIT s, collect
#   bash benchmarks/gpu_parity.sh watch   # watch WAIT s more (or until done), collect
#
# One run per patch setting at a time (JOBS, default 1): four PV-RCNN runs sharing
# the 140 GiB held 33-58 GiB each and ran out of memory.
# Shared runs' wall times are no speed figure. From the checkout root after
# `source .device/setup.sh`; results go to $OUT. The background runs live as long as
# the machine: call `watch` within its idle release.
set -uo pipefail
source "$(dirname "$0")/background_runs.sh"
STAGE=${1:?stage: start | watch}
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
WAIT=${WAIT:-540}
ITERS=${PARITY_ITERS:-1000}
JOBS=${JOBS:-1}
SEEDS=${PARITY_SEEDS:-0,1,2}
RUNS="tools/benchmark_parity.py configs/pv_rcnn"  # what watch_runs looks for
DIR=work_dirs/gpu_parity
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

launch() {
  mkdir -p "$DIR"
  [ -f data/synthetic_kitti/kitti_infos_train.pkl ] || python tools/create_synthetic_data.py \
    kitti --out data/synthetic_kitti --train-frames 200 --val-frames 20 --no-progress \
    2>&1 | tail -1
  local speed
  speed=$(python -c "import mmdet3d_scaling; from mmdet3d_scaling.patches import patching; \
print(','.join(patching.resolve(['speed'])))" 2>/dev/null | tail -1)
  local common=(configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --batch 8 --accumulation 2
    --nproc 2 --seeds "$SEEDS" --iters "$ITERS" --jobs "$JOBS"
    --cfg-options train_dataloader.num_workers=2)
  OMP_NUM_THREADS=2 setsid nohup python tools/benchmark_parity.py "${common[@]}" \
    --only 1proc_b8_acc2,1proc_b16 --out work_dirs/parity_pv_rcnn_speed_on \
    > "$DIR/speed_on.log" 2>&1 < /dev/null &
  OMP_NUM_THREADS=2 MMDET3D_SCALING_SKIP_PATCHES=$speed setsid nohup python \
    tools/benchmark_parity.py "${common[@]}" --only 1proc_b8_acc2 \
    --out work_dirs/parity_pv_rcnn_speed_off > "$DIR/speed_off.log" 2>&1 < /dev/null &
  echo "launched at $(date +%T); speed set: $speed"
}

collect() {
  grep -h "^\[parity\]" "$DIR"/speed_*.log
  tail -n 40 "$DIR/watch.log" > "$OUT/watch.log" 2>/dev/null
  cp "$DIR"/speed_on.log "$DIR"/speed_off.log "$OUT/" 2>/dev/null
  for s in on off; do
    for f in parity.json parity.png; do
      cp "work_dirs/parity_pv_rcnn_speed_$s/$f" "$OUT/speed_${s}_$f" 2>/dev/null
    done
  done
}

case $STAGE in
start) nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
       launch; watch_runs "$RUNS"; collect ;;
watch) watch_runs "$RUNS"; collect ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
