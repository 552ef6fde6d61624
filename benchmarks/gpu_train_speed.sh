#!/usr/bin/env bash
# Same-call training speed as users run it (docs/benchmarks.md): this plugin through
# tools/train.py against upstream through mmdet3d's own tools/train.py, each side with
# spconv 2.x and with mmcv's sparse conv; plus the sparse-conv CUDA tests and the sparse
# encoder benchmark with and without spconv.
#
# On the GPU machine, from the checkout root:
#   DEVICE_SPCONV=1 source .device/setup.sh && bash benchmarks/gpu_train_speed.sh STAGE...
# (spconv is unpacked once; every run below sets its own PYTHONPATH with or without it).
# UPSTREAM: an mmdetection3d v1.4.0 checkout holding projects/BEVFusion (default
# .upstream/mmdetection3d-v1.4.0, a copy of ../shared/reference/...); its CUDA extension
# is built for this GPU's architecture in a copy under work_dirs/.
#
# SIDES (bevfusion, pv_rcnn, second): the sparse-conv backends to run, default "mmcv spconv";
# LOG_INTERVAL (bevfusion, pv_rcnn, second): iterations a log line on both sides, default
# 1 (a divisor of WARMUP; 5 measures async_logging as configs log);
# STOCK_THREADS (pv_rcnn, second): stock's OMP_NUM_THREADS runs, default "1 16";
# VARIANTS (bevfusion): "NAME=OPTION OPTION;...", ours bf16 once more per entry with those
# --cfg-options; FIT_1GPU=1 (bevfusion): configs/bevfusion_1gpu.py as users run it;
# OURS_OPTIONS (bevfusion): --cfg-options added to every run of ours;
# PROFILE_MODELS (profile): default "bevfusion pv_rcnn"; STEP_OPTIONS (profile): more
# --cfg-options for BEVFusion; STEP_ARGS (profile): more benchmark_train_step.py
# arguments for BEVFusion (--gc-freeze, --gc-interval N: GarbageCollectionHook);
# TRACE=1 (profile): BEVFusion's Chrome trace of the profiled micro-batches as
# $OUT/bevfusion_b4_spconv[_LABEL]_trace.json.gz;
# PROFILE_STEPS (profile): BEVFusion's profiled micro-batches, default 8 (call I1's
# four took 136-262 ms each: too few for a busy share); PROFILE_LABEL (profile): a
# suffix of BEVFusion's file names, to profile two settings in one call; TEST_FILES (tests).
# CUDA_TEST_TIMEOUT (cuda_tests): seconds a side, default 330 (with spconv -n 8 ran past
# 200 s on an H100, call H1); CUDA_TEST_WORKERS (cuda_tests): pytest-xdist workers,
# default 8 (12 ran the 80 GB H100 out of memory in the subprocess tests);
# CUDA_TESTS_TOGETHER=1 (cuda_tests): both sides at once, half the workers each.
# Stages: tests data encoders encoder_profile local_memory upstream_build bevfusion pv_rcnn second
#         profile (where the step waits, with spconv: tools/analysis/benchmark_train_step.py)
#         fit_table
#         cuda_tests (every `-m cuda` test, without spconv and with it)
#         pack (last: every .log / .txt under $OUT into one new logs[_N].tgz, removed once
#         archived, since a device call returns at most 8 files; the JSONs stay)
set -uo pipefail
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
UPSTREAM=${UPSTREAM:-.upstream/mmdetection3d-v1.4.0}
UP=$PWD/work_dirs/upstream_mmdet3d  # the built copy
SP=$PYTHONPATH  # with spconv (setup.sh puts /tmp/site-spconv first)
NOSP=$(echo "$PYTHONPATH" | sed 's#/tmp/site-spconv:##')
MMDET3D=$(PYTHONPATH=$NOSP python -c "import mmdet3d, os; print(os.path.dirname(mmdet3d.__file__))")
STOCK_TRAIN=$MMDET3D/.mim/tools/train.py
STOCK_CFG=$MMDET3D/.mim/configs
SPEED="python benchmarks/train_speed.py"
ITERS=${ITERS:-30}; WARMUP=${WARMUP:-10}
# ScalingRunner configs count max_iters in optimizer steps (BEVFusion's 1xb4 recipe
# accumulates 8 micro-batches a step): 4 steps = 32 iterations, as many as upstream's.
OURS_STEPS=${OURS_STEPS:-4}
BEVFUSION=configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb4-6e_nus-3d.py
UP_BEVFUSION=projects/BEVFusion/configs/bevfusion_lidar-cam_voxel0075_second_secfpn_8xb4-cyclic-20e_nus-3d.py
NO_HUB="model.img_backbone.init_cfg=None"  # no network on the GPU machine

nuscenes() {
  [ -f data/nuscenes/nuscenes_infos_train.pkl ] || PYTHONPATH=$NOSP python \
    tools/create_synthetic_data.py nuscenes --out data/nuscenes --train-frames 24 \
    --val-frames 2 --full-res --workers 12 --no-progress 2>&1 | tail -1
}
kitti() {  # in data/kitti, where the stock configs read it; ours read data/synthetic_kitti
  [ -f data/kitti/kitti_infos_train.pkl ] || PYTHONPATH=$NOSP python \
    tools/create_synthetic_data.py kitti --out data/kitti --train-frames 200 \
    --val-frames 8 --no-progress 2>&1 | tail -1
  [ -e data/synthetic_kitti ] || ln -s kitti data/synthetic_kitti
}
run() {  # LABEL PYTHONPATH [train_speed args...]; the run's log is kept as $OUT/LABEL.log
  local label=$1 pp=$2; shift 2
  $SPEED --label "$label" --out "$OUT/$label.json" --iters "$ITERS" --warmup "$WARMUP" \
    --log-interval "${LOG_INTERVAL:-1}" \
    --env "PYTHONPATH=$pp" "$@" 2>&1 | tail -4  # a later --iters wins
  cp "work_dirs/train_speed/$label/train_speed.log" "$OUT/$label.log" 2>/dev/null || true
}

for stage in "$@"; do
  case $stage in
  tests)  # the CUDA tests of the sparse-conv paths, without spconv and with it
    FILES=${TEST_FILES:-"tests/ops/test_sparse_conv.py tests/patches/fixes/test_sparse_conv_layout.py
      tests/patches/speed/test_sparse_conv_batched.py tests/models/bevfusion/test_sparse_backends_cuda.py
      tests/models/bevfusion/test_state_dict_compat.py"}
    for side in mmcv spconv; do
      pp=$NOSP; [ $side = spconv ] && pp=$SP
      PYTHONPATH=$pp timeout 280 python -m pytest -q -p no:cacheprovider -n 8 $FILES \
        > "$OUT/cuda_tests_$side.txt" 2>&1
      echo "[tests $side]" $(tail -1 "$OUT/cuda_tests_$side.txt")
    done
    ;;
  cuda_tests)  # the whole CUDA tier, both backends; a summary line each
    # CUDA_TESTS_TOGETHER=1: both sides at once, the workers split between them
    workers=${CUDA_TEST_WORKERS:-8}; together=${CUDA_TESTS_TOGETHER:-0}
    [ "$together" = 1 ] && workers=$(( (workers + 1) / 2 ))
    cuda_side() {
      local side=$1 pp=$NOSP; [ "$1" = spconv ] && pp=$SP
      local log=$OUT/cuda_tests_all_$side.txt
      # -v: each test's outcome is in the log as it ends, so a run the timeout stops
      # still names its failures
      PYTHONPATH=$pp timeout "${CUDA_TEST_TIMEOUT:-330}" python -m pytest -v -rfE \
        -p no:cacheprovider -m cuda -n "$workers" --durations=15 tests > "$log" 2>&1
      echo "[cuda_tests $side rc=$?]" $(tail -1 "$log")
      grep -E '^\[gw[0-9]+\].* (FAILED|ERROR) ' "$log" | sed "s/^/[cuda_tests $side] /"
    }
    if [ "$together" = 1 ]; then
      cuda_side mmcv & cuda_side spconv & wait
    else
      cuda_side mmcv; cuda_side spconv
    fi
    ;;
  pack)  # a new archive each time (logs.tgz, logs_2.tgz, ...): an earlier one is kept
    (cd "$OUT" && files=$(ls *.log *.txt 2>/dev/null || true) && [ -n "$files" ] || exit 0
     tgz=logs.tgz; n=2; while [ -e "$tgz" ]; do tgz=logs_$n.tgz; n=$((n + 1)); done
     tar czf "$tgz" $files && rm -f $files && echo "[pack] $tgz:" $files)
    ;;
  data) nuscenes; kitti ;;
  encoders)
    B="python benchmarks/sparse_conv.py --precision fp32,bf16,fp16"
    PYTHONPATH=$NOSP $B --out "$OUT/sparse_encoders_mmcv.json" 2>&1 | tail -6
    PYTHONPATH=$NOSP $B --batched --out "$OUT/sparse_encoders_mmcv_batched.json" 2>&1 | tail -6
    PYTHONPATH=$SP $B --out "$OUT/sparse_encoders_spconv.json" 2>&1 | tail -6
    ;;
  local_memory)  # device memory the driver keeps after mmcv's strided sparse conv
    PYTHONPATH=$NOSP python benchmarks/mmcv_local_memory.py --out "$OUT/mmcv_local_memory.json"
    ;;
  encoder_profile)  # where the batched op's time goes (top kernels of one step)
    PYTHONPATH=$NOSP python benchmarks/sparse_conv.py --models bevfusion,second --batched \
      --repeats 2 --profile 2>&1 | tail -40
    ;;
  profile)  # stage tables (GPU busy, idle ms, launches, waits) of ours with spconv
    models=" ${PROFILE_MODELS:-bevfusion pv_rcnn} "
    [[ $models == *" bevfusion "* ]] && nuscenes
    [[ $models == *" pv_rcnn "* ]] && kitti
    STEP="python tools/analysis/benchmark_train_step.py"
    # the 1xb4 config as users run it (its 8 loader workers, both CUDA graphs), one
    # micro-batch an optimizer step
    if [[ $models == *" bevfusion "* ]]; then
      name=bevfusion_b4_spconv${PROFILE_LABEL:+_$PROFILE_LABEL}
      PYTHONPATH=$SP $STEP $BEVFUSION \
        --batch 4 --precision ${PRECISIONS:-bf16,fp32} --warmup 8 --iters 24 \
        --profile "${PROFILE_STEPS:-8}" \
        ${STEP_ARGS:-} --cfg-options float32_matmul_precision=high $NO_HUB ${STEP_OPTIONS:-} \
        ${TRACE:+--trace "$OUT/${name}_trace.json.gz"} \
        --out "$OUT/${name}_profile.json" > "$OUT/${name}_profile.log" 2>&1
      grep -E "^\[step\]|Error" "$OUT/${name}_profile.log" | cut -c1-160
    fi
    [[ $models == *" pv_rcnn "* ]] || continue
    PYTHONPATH=$SP $STEP configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --batch 8 --precision fp32 \
      --workers 6 --warmup 6 --iters 6 --profile 2 --out "$OUT/pv_rcnn_b8_spconv_profile.json" \
      > "$OUT/pv_rcnn_b8_spconv_profile.log" 2>&1
    grep -E "^\[step\]|Error" "$OUT/pv_rcnn_b8_spconv_profile.log" | cut -c1-160
    ;;
  upstream_build)
    if [ ! -f "$UP/.built" ]; then
      rm -rf "$UP" && mkdir -p "$UP/configs" && cp -r "$UPSTREAM/projects" "$UP/" \
        && cp -r "$UPSTREAM/configs/_base_" "$UP/configs/"
      arch=$(python -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())))")
      # upstream lists sm_70-86 only; CUDA 13 no longer compiles sm_70 / sm_75: the list
      # becomes this GPU's architecture alone
      sed -i -e "s/'-gencode=arch=compute_86,code=sm_86',/'-gencode=arch=compute_$arch,code=sm_$arch',/" \
        -e "/'-gencode=arch=compute_[78][05],code=sm_[78][05]',/d" "$UP/projects/BEVFusion/setup.py"
      grep -n gencode "$UP/projects/BEVFusion/setup.py"
      (cd "$UP" && PYTHONPATH=$NOSP MAX_JOBS=16 FORCE_CUDA=1 python projects/BEVFusion/setup.py \
        build_ext --inplace > build.log 2>&1) && touch "$UP/.built"
      grep -iE "error" "$UP/build.log" | head -5; tail -2 "$UP/build.log"
    fi
    ln -sfn "$PWD/data" "$UP/data"
    ;;
  bevfusion)  # camera+LiDAR, micro-batch 4, 4 workers, TF32: upstream and ours, one call
    nuscenes
    TF32="float32_matmul_precision=high"
    UPTF32="env_cfg.cudnn_benchmark=False"  # upstream's own default
    for side in ${SIDES:-mmcv spconv}; do
      pp=$NOSP; [ $side = spconv ] && pp=$SP
      run "upstream_amp_$side" "$UP:$pp" --train "$STOCK_TRAIN" --cwd "$UP" \
        --config "$UP_BEVFUSION" --batch 4 --amp --cfg-options $NO_HUB
      run "ours_bf16_$side" "$pp" --iters $OURS_STEPS --config $BEVFUSION --batch 4 \
        --cfg-options $NO_HUB $TF32 amp.dtype=bfloat16 ${OURS_OPTIONS:-}
    done
    # VARIANTS="NAME=OPTION OPTION;...": ours bf16 with spconv once more per entry, with
    # those --cfg-options added (e.g. "one_stream=model.concurrent_branches=False")
    IFS=';' read -ra variants <<< "${VARIANTS:-}"
    for variant in "${variants[@]}"; do
      [ -n "$variant" ] || continue
      run "ours_bf16_${variant%%=*}_spconv" "$SP" --iters $OURS_STEPS --config $BEVFUSION \
        --batch 4 --cfg-options $NO_HUB $TF32 amp.dtype=bfloat16 ${OURS_OPTIONS:-} ${variant#*=}
    done
    [ "${FIT_1GPU:-0}" = 1 ] && run ours_1gpu_fit_spconv "$SP" --iters $OURS_STEPS \
      --batch 4 --config configs/bevfusion_1gpu.py --cfg-options $NO_HUB ${OURS_OPTIONS:-}
    [ "${EQUAL:-0}" = 1 ] && run ours_amp_fp16_spconv "$SP" --iters $OURS_STEPS \
      --config $BEVFUSION --batch 4 --amp --cfg-options $NO_HUB $TF32
    ;;
  pv_rcnn|second)
    kitti
    if [ $stage = pv_rcnn ]; then
      stock=$STOCK_CFG/pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py
      # its recipe accumulates 2 micro-batches of 8 a step, and ScalingRunner counts
      # steps: half of ITERS gives as many iterations as stock's
      ours=configs/pv_rcnn/pv_rcnn_synthetic_kitti.py; batch=8; ours_iters=$(( (ITERS + 1) / 2 ))
    else
      stock=$STOCK_CFG/second/second_hv_secfpn_8xb6-80e_kitti-3d-3class.py
      # the stock model at the stock sizes (second_synthetic_kitti.py is a shrunk one);
      # it accumulates 8 micro-batches a step, and ScalingRunner counts steps
      ours=configs/second/second_hv_secfpn_1xb6-acc8-80e_kitti-3d-3class.py; batch=6
      ours_iters=$(( (ITERS + 7) / 8 ))
    fi
    for side in ${SIDES:-mmcv spconv}; do
      pp=$NOSP; [ $side = spconv ] && pp=$SP
      for t in ${STOCK_THREADS:-1 16}; do
        run "stock_${stage}_${side}_t$t" "$pp" --train "$STOCK_TRAIN" --config "$stock" \
          --batch $batch --env OMP_NUM_THREADS=$t --cfg-options \
          train_dataloader.batch_size=$batch train_dataloader.num_workers=6
      done
      run "ours_${stage}_${side}" "$pp" --iters $ours_iters --config $ours --batch $batch --cfg-options \
        scaling.per_gpu_batch_size=$batch train_dataloader.num_workers=6
    done
    ;;
  fit_table)  # "will it fit my card?": the fastest fit's choice per memory budget
    # (tools/analysis/fit_table.py, docs/auto_batch_size.md), BEVFusion camera+LiDAR and
    # LiDAR-only, PV-RCNN, SECOND, PointPillars (SECOND and PointPillars at the stock
    # model size, total batch 48); one JSON a model. About 6 min on one H200.
    # FIT_MODELS="bevfusion_lc pv_rcnn" runs those rows only; FIT_BUDGETS the budgets.
    nuscenes; kitti
    FIT="python tools/analysis/fit_table.py --budgets ${FIT_BUDGETS:-12,16,24,40,80}"
    LIDAR=configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_1xb4-acc8-cyclic-20e_nus-3d.py
    while read -r name config batches options; do
      case " ${FIT_MODELS:-$name} " in *" $name "*) ;; *) continue ;; esac
      PYTHONPATH=$SP $FIT "$config" --batch-sizes "$batches" --out "$OUT/fit_table_$name.json" \
        --work-dir "work_dirs/fit_table/$name" ${options:+--cfg-options $options} \
        < /dev/null > "$OUT/fit_table_$name.txt" 2>&1
      echo "[fit_table $name rc=$?]"; grep -A8 '^fit table:' "$OUT/fit_table_$name.txt" \
        || tail -5 "$OUT/fit_table_$name.txt"
    done <<EOF
bevfusion_lc configs/bevfusion_1gpu.py 8,4,2,1 $NO_HUB
bevfusion_l $LIDAR 8,4,2,1
pv_rcnn configs/pv_rcnn/pv_rcnn_synthetic_kitti.py 8,4,2,1
second configs/second/second_hv_secfpn_1xb6-acc8-80e_kitti-3d-3class.py 48,24,12,6
pointpillars configs/pointpillars/pointpillars_hv_secfpn_1xb6-acc8-160e_kitti-3d-3class.py 48,24,12,6
EOF
    ;;
  *) echo "unknown stage $stage"; exit 2 ;;
  esac
done
