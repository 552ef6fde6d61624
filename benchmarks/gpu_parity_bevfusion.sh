#!/usr/bin/env bash
# BEVFusion parity on one large GPU (docs/parity.md, "BEVFusion on one H200"), with the
# synthetic-data recipes (configs/bevfusion/*_synthetic_nus_cpu.py; they run on a GPU
# as well, and there they train long enough to score well):
#   1. LiDAR-only: 1proc_b1_acc2 (reference) vs 1proc_b2, 3 seeds, LIDAR_ITERS steps;
#   2. camera+LiDAR from the reference's seed-0 LiDAR-only checkpoint: fp32, bf16 and
#      fp16 (dynamic loss scale) AMP, 3 seeds each, CAM_ITERS steps.
# The runs outlast one device command (10 min), so they run in the background and a
# command only starts or watches them:
#
#   bash benchmarks/gpu_parity_bevfusion.sh start  # data, launch (setsid), watch, collect
#   bash benchmarks/gpu_parity_bevfusion.sh watch  # watch WAIT s more (or until done)
#
# Runs share the GPU and the CPU cores (--jobs, 2 loader workers and 2 threads a run), so
# their wall times are no speed figure. From the checkout root after
# `source .device/setup.sh` (on a CPU: DEVICE=cpu, fp16 is then skipped); results go to
# $OUT.
set -uo pipefail
source "$(dirname "$0")/background_runs.sh"
STAGE=${1:?stage: start | watch}
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
WAIT=${WAIT:-480}
LIDAR_ITERS=${LIDAR_ITERS:-600}
CAM_ITERS=${CAM_ITERS:-300}
SEEDS=${PARITY_SEEDS:-0,1,2}
DATA=${DATA:-data/synthetic_nuscenes}
WORKERS=${WORKERS:-2}
RUNS="tools/benchmark_parity.py configs/bevfusion"  # what watch_runs looks for
DIR=work_dirs/gpu_parity_bevfusion
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}

parity() {  # parity CONFIG OUT JOBS ITERS ONLY [cfg options...]
  python tools/benchmark_parity.py "$1" --batch 1 --accumulation 2 --nproc 2 \
    --seeds "$SEEDS" --iters "$4" --jobs "$3" --only "$5" --data-root "$DATA" \
    --out "$2" --cfg-options train_dataloader.num_workers="$WORKERS" \
    test_dataloader.num_workers="$WORKERS" "${@:6}"
}

pipeline() {  # runs in the background
  parity configs/bevfusion/bevfusion_lidar_synthetic_nus_cpu.py "$DIR/lidar" 6 \
    "$LIDAR_ITERS" 1proc_b1_acc2,1proc_b2
  local ckpt
  ckpt=$(cat "$DIR/lidar/runs/1proc_b1_acc2/seed0/last_checkpoint") || return 1
  local cam=configs/bevfusion/bevfusion_lidar-cam_synthetic_nus_cpu.py
  parity $cam "$DIR/cam_fp32" 3 "$CAM_ITERS" 1proc_b1_acc2 load_from="$ckpt" &
  parity $cam "$DIR/cam_bf16" 3 "$CAM_ITERS" 1proc_b1_acc2 load_from="$ckpt" \
    amp.dtype=bfloat16 &
  [ "${DEVICE:-cuda}" = cuda ] && parity $cam "$DIR/cam_fp16" 3 "$CAM_ITERS" \
    1proc_b1_acc2 load_from="$ckpt" amp.dtype=float16 &
  wait
}

launch() {
  mkdir -p "$DIR"
  [ -f "$DATA/nuscenes_infos_train.pkl" ] || python tools/create_synthetic_data.py \
    nuscenes --out "$DATA" --max-range 24 --samples-per-scene 5 --train-frames 600 \
    --workers 14 --no-progress 2>&1 | tail -1
  export -f parity pipeline
  export DIR DATA SEEDS LIDAR_ITERS CAM_ITERS WORKERS
  setsid nohup bash -c pipeline > "$DIR/pipeline.log" 2>&1 < /dev/null &
  echo "launched at $(date +%T)"
}

collect() {
  grep -E "^\[parity\] run|Error|error" "$DIR/pipeline.log" | tail -n 40
  tail -n 30 "$DIR/watch.log" > "$OUT/watch.log" 2>/dev/null
  cp "$DIR/pipeline.log" "$OUT/" 2>/dev/null
  for part in lidar cam_fp32 cam_bf16 cam_fp16; do
    cp "$DIR/$part/parity.json" "$OUT/${part}_parity.json" 2>/dev/null
  done
}

case $STAGE in
start) command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name --format=csv,noheader
       launch; watch_runs "$RUNS"; collect ;;
watch) watch_runs "$RUNS"; collect ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
