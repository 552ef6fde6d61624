#!/usr/bin/env bash
# One-H200 measurements for the closing notes and docs/benchmarks.md.
# Run on the GPU machine from the checkout root after `source .device/setup.sh`;
# results go to $OUT (default ./bench_out).
set -uo pipefail
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"

# 1. bev_pool: default / deterministic / lean paths vs the upstream kernel's 4.69 ms
python tools/benchmark_bev_pool.py 2>&1 | tee "$OUT/bev_pool.txt"
python tools/benchmark_bev_pool.py --dtype bf16 --batch 1 2>&1 | tee -a "$OUT/bev_pool.txt"

# 2. GPU monitor overhead
python tools/benchmark_gpu_monitor.py --iters 300 --repeats 3 2>&1 | tee "$OUT/gpu_monitor_bench.txt"

# 3. CUDA-only tests (sparse backends, bev_pool on CUDA, monitor with NVML)
python -m pytest -q -x tests/models/bevfusion/test_sparse_backends_cuda.py \
  tests/models/bevfusion/test_bev_pool.py tests/hooks/test_gpu_monitor_hook.py \
  2>&1 | tail -15 | tee "$OUT/cuda_tests.txt"

# 4. BEVFusion LiDAR-camera, official sizes (900x1600 cameras -> 256x704), AMP,
#    configs/bevfusion_1gpu.py under a 24 GiB cap, one epoch of synthetic data + eval.
[ -f data/nuscenes/nuscenes_infos_train.pkl ] || python tools/create_synthetic_data.py \
  nuscenes --out data/nuscenes --train-frames 24 --val-frames 6 --full-res --workers 8 \
  --no-progress 2>&1 | tail -3
python - <<'PY' 2>&1 | tee "$OUT/bevfusion_1gpu.txt" | grep -vE "^\s*$" | tail -40
import runpy, sys, torch
total = torch.cuda.get_device_properties(0).total_memory
torch.cuda.set_per_process_memory_fraction(24 * 2**30 / total)
print(f'memory cap: 24 GiB of {total / 2**30:.1f} GiB')
sys.argv = ['tools/train.py', 'benchmarks/configs/bevfusion_1gpu_smoke.py',
            '--work-dir', 'work_dirs/b1']
runpy.run_path('tools/train.py', run_name='__main__')
PY
