#!/usr/bin/env bash
# One-H200 speed figures of docs/benchmarks.md: the exact voxelizer against mmcv's op,
# BEVFusion camera+LiDAR at micro-batch 4 (bf16, fp32; and bf16 with mmcv's voxelizer as
# the "before" profile), the 24 GiB one-GPU recipe, PV-RCNN against stock mmdet3d at one
# and sixteen intra-op threads (the two in one call), PV-RCNN's profile and stage table.
# Run from the checkout root on the GPU machine after `source .device/setup.sh`; results
# go to $OUT (default ./bench_out).
#   bash benchmarks/gpu_speed.sh voxelization nms bevfusion fit pv_rcnn pv_rcnn_profile
set -uo pipefail
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
STEP="python tools/analysis/benchmark_train_step.py"
BEVFUSION=configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py
TF32="float32_matmul_precision=high"
NO_HUB="model.img_backbone.init_cfg=None"  # no network on the GPU machine

nuscenes() {  # full-size synthetic nuScenes (6 x 1600x900 JPEG cameras, 10 sweeps)
  [ -f data/nuscenes/nuscenes_infos_train.pkl ] || python tools/create_synthetic_data.py \
    nuscenes --out data/nuscenes --train-frames 24 --val-frames 2 --full-res --workers 12 \
    --no-progress 2>&1 | tail -1
}
kitti() {
  [ -f data/synthetic_kitti/kitti_infos_train.pkl ] || python tools/create_synthetic_data.py \
    kitti --out data/synthetic_kitti --train-frames 200 --val-frames 20 --no-progress \
    2>&1 | tail -1
}

for stage in "$@"; do
  case $stage in
  voxelization)
    python benchmarks/voxelization.py --device cuda --out "$OUT/voxelization_h200.json" \
      2>&1 | tail -12
    ;;
  nms)
    timeout 150 python -m pytest -q -p no:cacheprovider tests/ops/test_nms_rotated.py \
      > "$OUT/nms_cuda_tests.txt" 2>&1; tail -2 "$OUT/nms_cuda_tests.txt"
    python benchmarks/nms_rotated.py --device cuda --out "$OUT/nms_rotated_h200.json" \
      > "$OUT/nms_rotated.log" 2>&1; tail -12 "$OUT/nms_rotated.log"
    ;;
  bevfusion)
    nuscenes
    $STEP $BEVFUSION --batch 4 --precision bf16,fp32 --workers 4 --warmup 6 --iters 12 \
      --profile 2 --cfg-options $TF32 $NO_HUB --out "$OUT/bevfusion_b4_h200.json" \
      > "$OUT/bevfusion_b4.log" 2>&1
    grep -E "^\[step\]|Error" "$OUT/bevfusion_b4.log"
    $STEP $BEVFUSION --batch 4 --precision bf16 --workers 4 --warmup 6 --iters 6 \
      --profile 2 --cfg-options $TF32 $NO_HUB model.data_preprocessor.voxelize_cfg.implementation=mmcv \
      --out "$OUT/bevfusion_b4_mmcv_voxelizer_h200.json" > "$OUT/bevfusion_b4_mmcv.log" 2>&1
    grep -E "^\[step\]|Error" "$OUT/bevfusion_b4_mmcv.log"
    ;;
  fit)
    nuscenes
    python benchmarks/bevfusion_1gpu_fit.py --out "$OUT/bevfusion_1gpu_fit_h200.json" \
      > "$OUT/bevfusion_1gpu_fit.log" 2>&1
    tail -25 "$OUT/bevfusion_1gpu_fit.log"
    ;;
  pv_rcnn)
    kitti
    for threads in 1 16; do
      python tools/benchmark_scaling.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 1 \
        --iters ${ITERS:-12} --warmup 1 --warmup-iters 12 --no-comm-run --threads $threads \
        --out work_dirs/vs_stock_t$threads --compare-stock-at equal \
        --compare-stock mmdet3d::pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py \
        --cfg-options train_dataloader.num_workers=6 > "$OUT/pv_rcnn_t$threads.log" 2>&1
      tail -8 "$OUT/pv_rcnn_t$threads.log"
      cp work_dirs/vs_stock_t$threads/scaling.json "$OUT/pv_rcnn_vs_stock_threads$threads.json"
    done
    ;;
  pv_rcnn_profile)
    kitti
    $STEP configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --batch 8 --precision fp32 --workers 6 \
      --warmup 6 --iters 6 --profile 2 --out "$OUT/pv_rcnn_b8_profile_h200.json" \
      > "$OUT/pv_rcnn_profile.log" 2>&1
    grep -E "^\[step\]|Error" "$OUT/pv_rcnn_profile.log"
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
