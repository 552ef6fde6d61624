#!/usr/bin/env bash
# Two-H200 measurements (nvidia-h200-x2): BEVFusion LiDAR-camera on one 24 GiB-capped GPU,
# then PV-RCNN scaling 1 -> 2 GPUs. Run from the checkout root after
# `source .device/setup.sh`; results go to $OUT.
set -uo pipefail
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"
python tools/create_synthetic_data.py nuscenes --out data/nuscenes --train-frames 16 \
  --val-frames 6 --full-res --workers 16 --no-progress --overwrite 2>&1 | tail -1
[ -f data/synthetic_kitti/kitti_infos_train.pkl ] || python tools/create_synthetic_data.py \
  kitti --out data/synthetic_kitti --train-frames 200 --val-frames 20 --no-progress 2>&1 | tail -1

# 1. configs/bevfusion_1gpu.py (official sizes, AMP, checkpointing) under a 24 GiB cap
CUDA_VISIBLE_DEVICES=0 timeout ${BEVFUSION_TIMEOUT:-240} python - <<'PY' > "$OUT/bevfusion_1gpu.log" 2>&1
import runpy, sys, torch
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(24 * 2**30 / total)
print(f'memory cap: 24 GiB of {total / 2**30:.1f} GiB')
sys.argv = ['tools/train.py', 'benchmarks/configs/bevfusion_1gpu_smoke.py', '--work-dir', 'work_dirs/b1']
runpy.run_path('tools/train.py', run_name='__main__')
PY
echo "bevfusion exit $?" | tee -a "$OUT/bevfusion_1gpu.log"
grep -E "Epoch\(train\)|memory cap|NDS|mAP:|Error" "$OUT/bevfusion_1gpu.log" | tail -12

# 2. PV-RCNN scaling, 1 -> 2 GPUs, real data pipeline, same effective batch
timeout ${SCALING_TIMEOUT:-240} python tools/benchmark_scaling.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
  --nproc 1,2 --iters 20 --warmup 5 --out "$OUT/scaling_pv_rcnn" 2>&1 | tail -25
