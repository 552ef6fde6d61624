#!/usr/bin/env bash
# One-H200 checks of the patch sets (docs/patches.md, docs/benchmarks.md), in stages that
# each fit one device command (<= 10 min). From the checkout root, after
# `source .device/setup.sh`; results go to $OUT.
#   bash benchmarks/gpu_1x_checks.sh patches   # import snapshot + speed-patch CUDA tests +
#                                              # KITTI eval on this numpy with / without the fix
#   bash benchmarks/gpu_1x_checks.sh pv_rcnn   # PV-RCNN 1 GPU: speed set on vs off, same settings
#   bash benchmarks/gpu_1x_checks.sh pv_rcnn_vs_stock  # plugin vs stock mmdet3d, equal settings + as shipped
#   bash benchmarks/gpu_1x_checks.sh bevfusion_amp  # BEVFusion 1 GPU from scratch, 24 GiB:
#                                              # fp32 / fp16 / bf16 -> bevfusion_1gpu_amp_*.json
#   (parity runs, docs/parity.md: benchmarks/gpu_parity.sh, gpu_parity_bevfusion.sh)
#   bash benchmarks/gpu_1x_checks.sh camera_decoding  # BEVFusion camera JPEGs: PIL in the
#                                              # workers vs nvJPEG on the GPU (decode='gpu'),
#                                              # 48 full-res frames -> camera_decoding_*.json
set -uo pipefail
STAGE=${1:?stage: patches | pv_rcnn | bevfusion_amp | pv_rcnn_vs_stock | camera_decoding}
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import numpy, torch; print('numpy', numpy.__version__, '| torch', torch.__version__)" \
  | tee -a "$OUT/gpu.txt"
kitti() {  # kitti FRAMES
  [ -f data/synthetic_kitti/kitti_infos_train.pkl ] || python tools/create_synthetic_data.py \
    kitti --out data/synthetic_kitti --train-frames "$1" --val-frames 20 --no-progress \
    2>&1 | tail -1
}
SPEED=$(python -c "import mmdet3d_scaling; from mmdet3d_scaling.patches import patching; \
print(','.join(patching.resolve(['speed'])))" 2>/dev/null | tail -1)

case $STAGE in
patches)
  kitti 200
  # 1. what import changes on a CUDA machine (fixes only), the speed patches' CUDA tests
  timeout 300 python -m pytest -q -p no:cacheprovider tests/patches/test_import_snapshot.py \
    tests/patches/test_patching.py tests/patches/speed/test_grouping_backward.py \
    tests/patches/speed/test_rpn_proposal_nms.py tests/patches/speed/test_stack_query_group.py \
    tests/patches/speed/test_roi_assign.py tests/patches/speed/test_anchor_targets.py \
    tests/patches/speed/test_iou_piecewise_sampler.py tests/patches/speed/test_foreground_seg_targets.py \
    tests/patches/speed/test_rcnn_bbox_targets.py tests/patches/speed/test_max_iou_assigner.py \
    tests/patches/speed/test_pseudo_sampler.py tests/patches/speed/test_instance_data_index.py \
    > "$OUT/patch_tests.txt" 2>&1; tail -4 "$OUT/patch_tests.txt"
  # 2. mmdet3d's KITTI evaluation (numba CUDA rotated IoU) on this numpy: the demo model's
  #    test split, with the numpy fix and without it
  for skip in "" numpy_removed_apis; do
    echo "== KITTI eval, MMDET3D_SCALING_SKIP_PATCHES='$skip'"
    MMDET3D_SCALING_SKIP_PATCHES=$skip timeout 200 python - <<'PY' 2>&1 | tail -4
from mmengine.config import Config
from mmengine.registry import RUNNERS
import mmdet3d_scaling
from mmdet3d_scaling.patches import patching
cfg = Config.fromfile('configs/demo/pointpillars_synthetic_kitti_cpu.py')
cfg.work_dir = 'work_dirs/kitti_eval_check'
metrics = RUNNERS.build(cfg).test()
print('applied fixes:', [n for n in patching.applied() if patching.PATCHES[n].kind == 'fixes'])
print('KITTI eval ok:', len(metrics), 'metrics')
PY
  done 2>&1 | tee "$OUT/kitti_eval.txt"
  ;;
pv_rcnn)
  kitti 200
  # same config, batch, precision, workers, threads and warm-up; only the speed set differs
  for run in "speed_on=" "speed_off=$SPEED"; do
    MMDET3D_SCALING_SKIP_PATCHES=${run#*=} timeout ${PV_RCNN_TIMEOUT:-250} python \
      tools/benchmark_scaling.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 1 \
      --iters ${ITERS:-12} --warmup 1 --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
      --out "work_dirs/${run%%=*}" --cfg-options train_dataloader.num_workers=${WORKERS:-2} \
      2>&1 | tail -6
    cp "work_dirs/${run%%=*}/scaling.json" "$OUT/pv_rcnn_1gpu_${run%%=*}.json"
  done 2>&1 | tee "$OUT/pv_rcnn_speed.txt"
  ;;
bevfusion_amp)
  # configs/bevfusion_1gpu.py at the official sizes (benchmarks/configs/bevfusion_1gpu_smoke.py),
  # from scratch under a 24 GiB cap, one run per precision in one process: fp16 and bf16
  # as amp=dict(dtype='auto') resolves them without / with native bf16. Each run stops
  # after AMP_ITERS micro-batches or at the first optimizer step after AMP_BUDGET_S s of
  # training. On one H200: ~0.46 s a micro-batch, ~30 s start-up a run, so 304 micro-
  # batches for all three take ~10 min: in one 10-minute device command use
  # AMP_BUDGET_S=90 (208 each, as in docs/data), or AMP_PRECISIONS=fp16,bf16 then fp32.
  [ -f data/nuscenes/nuscenes_infos_train.pkl ] || python tools/create_synthetic_data.py \
    nuscenes --out data/nuscenes --train-frames 24 --val-frames 2 --full-res --workers 8 \
    --no-progress 2>&1 | tail -1
  timeout ${AMP_TIMEOUT:-3000} python benchmarks/bevfusion_amp.py \
    --precisions ${AMP_PRECISIONS:-fp16,bf16,fp32} --iters ${AMP_ITERS:-304} \
    --budget-s ${AMP_BUDGET_S:-100000} --cap-gib 24 --out-dir "$OUT" \
    > "$OUT/bevfusion_amp.txt" 2>&1
  grep -E "^== |memory cap|amp dtype|Error|skipped by loss scaling" "$OUT/bevfusion_amp.txt" | tail -20
  ;;
pv_rcnn_vs_stock)
  kitti 200
  # the plugin config against stock mmdet3d's PV-RCNN on the same data and effective
  # batch: at the plugin run's batch / precision / workers (quoted first) and as shipped
  timeout ${PV_RCNN_TIMEOUT:-560} python tools/benchmark_scaling.py \
    configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 1 --iters ${ITERS:-12} --warmup 1 \
    --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run --out work_dirs/vs_stock \
    --compare-stock mmdet3d::pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2} 2>&1 | tail -12 \
    | tee "$OUT/pv_rcnn_vs_stock.txt"
  cp work_dirs/vs_stock/scaling.json "$OUT/pv_rcnn_1gpu_vs_stock_equal_and_shipped_h200.json"
  ;;
camera_decoding)
  # the official LiDAR-camera config's train loader on 48 full-res synthetic frames
  # (~1 min to write with 8 processes), decode='cpu' vs 'gpu': the device path's tests
  # (CUDA ones included), the loader alone at 2 / 4 / 8 workers with the nvJPEG-vs-PIL
  # image difference, then with the model's train step at the config's 4 workers.
  # ~5 min on one H200 (16 cores); CAMDEC_ITERS / CAMDEC_STEP_ITERS shorten it.
  [ -f data/nuscenes_camdec/nuscenes_infos_train.pkl ] || python \
    tools/create_synthetic_data.py nuscenes --out data/nuscenes_camdec --train-frames 48 \
    --val-frames 2 --full-res --workers 8 --no-progress 2>&1 | tail -1
  timeout 150 python -m pytest -q -p no:cacheprovider \
    tests/datasets/test_bevfusion_deferred_decode.py \
    tests/models/bevfusion/test_data_preprocessor.py > "$OUT/camera_decoding_tests.txt" 2>&1
  tail -3 "$OUT/camera_decoding_tests.txt"
  timeout 180 python benchmarks/camera_decoding.py --data-root data/nuscenes_camdec \
    --workers 2,4,8 --iters ${CAMDEC_ITERS:-16} --compare 4 \
    --out "$OUT/camera_decoding_loader_h200.json" 2>&1 | grep -E "^images|^decode=|Error"
  timeout 180 python benchmarks/camera_decoding.py --data-root data/nuscenes_camdec \
    --workers 4 --iters ${CAMDEC_STEP_ITERS:-10} --compare 0 --model-step \
    --out "$OUT/camera_decoding_model_step_h200.json" 2>&1 | grep -E "^decode=|Error"
  ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
