#!/usr/bin/env bash
# Two-H200 (nvidia-h200-x2) scaling measurements for docs/benchmarks.md, in stages that
# each fit one device command (<= 10 min). Run from the checkout root after
# `source .device/setup.sh`; results go to $OUT.
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn     # 1 -> 2 GPUs + stock (SYNC_BN=torch: old)
#   bash benchmarks/gpu_2x_scaling.sh bevfusion   # BEVFusion LiDAR-only 1 -> 2 GPUs
#   bash benchmarks/gpu_2x_scaling.sh auto_batch  # auto batch size targets + monitor tests
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_diag  # 1 -> 2 GPUs + 2 independent 1-GPU runs
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_sync_bn  # 2 GPUs: SyncBN all / scoped / off
#   bash benchmarks/gpu_2x_scaling.sh recheck       # PV-RCNN warm 1 -> 2, auto batch size
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_repeats  # 1 -> 2 GPUs, 3 alternating rounds
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_affinity # the same, distributed.cpu_affinity=split
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_split    # 1, DDP world of one, 2, 2 independent
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_neighbour  # 1 GPU beside a CPU / GPU / host-bound load
#   bash benchmarks/gpu_2x_scaling.sh pv_rcnn_shims   # patch GPU tests, GPU census, A/B, 1 -> 2
# Knobs (env): COMM_RUN= (empty: also the comm-off run), PROFILE_STEPS, SYNC_BN, SYNC_BN_SCOPE,
# WORKERS, ITERS, WARMUP_ITERS, REPEATS, GC_INTERVAL, *_TIMEOUT, BEV_ITERS, BEV_WARMUP, BEV_EXTRA,
# AUTO_BATCH_WORKERS, NPROC (pv_rcnn and pv_rcnn_shims' GPU counts; 1 on a one-GPU machine),
# AB (pv_rcnn_shims' A/B runs: space-separated NAME=PATCH,PATCH,... skipped in run NAME).
# Everything the runs write is packed into $OUT/results.tgz.
set -uo pipefail
STAGE=${1:?stage: pv_rcnn | bevfusion | auto_batch}
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1  # OMP_NUM_THREADS: torchrun's default (1 per process)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python -c "import os; print('cpus usable:', len(os.sched_getaffinity(0)), 'of', os.cpu_count())" \
  | tee -a "$OUT/gpu.txt"
cat /sys/fs/cgroup/cpu.max 2>/dev/null | sed 's/^/cgroup cpu.max: /' | tee -a "$OUT/gpu.txt"
# CPU topology (hyperthread siblings, NUMA) and GPU-CPU affinity, for the host-bound runs
{ lscpu 2>/dev/null | grep -E "^(Thread|Core|Socket|NUMA)" ; nvidia-smi topo -m 2>/dev/null; } \
  >> "$OUT/gpu.txt"

kitti() {
  [ -f data/synthetic_kitti/kitti_infos_train.pkl ] || python tools/create_synthetic_data.py \
    kitti --out data/synthetic_kitti --train-frames 200 --val-frames 20 --no-progress \
    2>&1 | tail -1
}
scaling() {  # scaling OUTNAME TIMEOUT ARGS...
  local name=$1 limit=$2; shift 2
  echo "== $name: python tools/benchmark_scaling.py $*"
  timeout "$limit" python tools/benchmark_scaling.py "$@" --out "$RES/$name" 2>&1 | tail -20
  echo "== $name exit ${PIPESTATUS[0]}"
  # keep what comes back small: results + the tail of each run's log, packed into one
  # file after every call (the device returns at most 8 files)
  for run in "$RES/$name"/*/; do
    [ -f "$run/result.json" ] && cp "$run/result.json" "$RES/${name}__$(basename "$run").json"
    [ -f "$run/run.log" ] && { grep -m1 "cpu_affinity=" "$run/run.log"; grep -E \
      "Iter\(train\)|Error|error:|Scaling plan|per-GPU" "$run/run.log" | tail -20; } \
      > "$RES/${name}__$(basename "$run").log"
    rm -rf "$run"
  done
  tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
}
RES=$(mktemp -d)  # everything the stages write; packed into $OUT/results.tgz
auto_batch_benchmark() {  # a 2 GiB card: search, confirmed largest, 300 iterations after
  CUDA_VISIBLE_DEVICES=0 timeout ${AUTO_BATCH_TIMEOUT:-400} python \
    tools/benchmark_auto_batch_size.py configs/pointpillars/pointpillars_synthetic_kitti.py \
    --memory-gib 2 --iters 300 --max-batch-size 512 --out "$OUT/auto_batch_size.json" \
    --cfg-options scaling.max_per_gpu_batch_size=512 scaling.total_batch_size=512 \
    train_dataloader.num_workers=${AUTO_BATCH_WORKERS:-24} 2>&1 \
    | grep --line-buffered -v "Iter(train) \[ *[0-9]*[1-9]0/" | tee "$OUT/auto_batch_size.txt"
}

case $STAGE in
pv_rcnn)
  kitti
  # the PV-RCNN synthetic config as shipped (per-GPU 8, TF32, cudnn autotune, SyncBN
  # 'allreduce'), 2 loader workers a rank, 1 -> 2 GPUs, then stock mmdet3d on 1 GPU.
  # COMM_RUN= adds the comm-off runs, PROFILE_STEPS=3 the torch.profiler runs.
  scaling pv_rcnn_b8 ${PV_RCNN_TIMEOUT:-330} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --nproc ${NPROC:-1,2} --iters 12 --warmup 3 ${COMM_RUN---no-comm-run} \
    --profile-steps ${PROFILE_STEPS:-0} \
    --compare-stock mmdet3d::pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2} \
    distributed.sync_bn=${SYNC_BN:-allreduce}
  ;;
pv_rcnn_diag)
  kitti
  # What separates PV-RCNN's 2-GPU rate from twice the 1-GPU rate: 1 -> 2 GPUs as
  # shipped, 30 warm-up iterations in every process, plus (--independent) two 1-GPU runs
  # at once without a process group: what sharing the machine costs vs what DDP costs.
  # GC_INTERVAL=N: the same with GarbageCollectionHook(collect_interval=N).
  # SYNC_BN=None: plain BatchNorm on 2 GPUs (splits SyncBN's cost from lockstep);
  # SYNC_BN_SCOPE="[middle_encoder,backbone,neck]": SyncBN only in those submodules.
  cfg=configs/pv_rcnn/pv_rcnn_synthetic_kitti.py
  if [ -n "${GC_INTERVAL:-}" ]; then
    gc_cfg=$(mktemp -d)/pv_rcnn_synthetic_kitti_gc.py
    printf "_base_ = ['%s']\ncustom_hooks = [dict(type='GPUMonitorHook'), dict(type='GarbageCollectionHook', collect_interval=%s)]\n" \
      "$PWD/$cfg" "$GC_INTERVAL" > "$gc_cfg"
    cfg=$gc_cfg
  fi
  scaling diag ${PV_RCNN_TIMEOUT:-420} "$cfg" --nproc 1,2 --independent --iters ${ITERS:-20} \
    --warmup 1 --warmup-iters ${WARMUP_ITERS:-30} --no-comm-run \
    --profile-steps ${PROFILE_STEPS:-0} --cfg-options train_dataloader.num_workers=${WORKERS:-2} \
    distributed.sync_bn=${SYNC_BN:-allreduce} ${SYNC_BN_SCOPE:+distributed.sync_bn_scope=$SYNC_BN_SCOPE}
  ;;
pv_rcnn_sync_bn)
  kitti
  # What SyncBN costs at 2 GPUs: the same 2-GPU run with SyncBN on all 59 BatchNorm
  # layers (as shipped), only in the feature extractors, and off (mmdet3d's own recipe),
  # back to back on one machine; compare with the 1-GPU row of pv_rcnn_diag.
  for variant in "allreduce:" "allreduce:[middle_encoder,backbone,neck]" "None:"; do
    bn=${variant%%:*}; scope=${variant#*:}
    scaling "sync_bn_${bn}${scope:+_scoped}" ${PV_RCNN_TIMEOUT:-170} \
      configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 2 --iters ${ITERS:-20} --warmup 1 \
      --warmup-iters ${WARMUP_ITERS:-30} --no-comm-run --cfg-options \
      train_dataloader.num_workers=${WORKERS:-2} distributed.sync_bn=$bn \
      ${scope:+distributed.sync_bn_scope=$scope}
  done
  ;;
pv_rcnn_repeats)
  kitti
  # PV-RCNN as shipped, 1 -> 2 GPUs, in REPEATS rounds of alternating order (1,2 / 2,1 /
  # 1,2): single runs of the same config a minute apart differ by up to 10 % here, so
  # the efficiency is read from the median runs and from each round's own pair.
  scaling repeats ${PV_RCNN_TIMEOUT:-540} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --nproc 1,2 --repeats ${REPEATS:-3} --iters ${ITERS:-12} --warmup 1 \
    --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2}
  ;;
pv_rcnn_affinity)
  kitti
  # pv_rcnn_repeats with distributed.cpu_affinity=split: each 2-GPU rank pinned to its
  # own half of the host's CPUs (loader workers inherit it; the 1-GPU runs have one rank
  # and stay as launched). Compare its median runs / per-round pairs with pv_rcnn_repeats.
  scaling affinity ${PV_RCNN_TIMEOUT:-540} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --nproc 1,2 --repeats ${REPEATS:-3} --iters ${ITERS:-12} --warmup 1 \
    --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2} distributed.cpu_affinity=split
  ;;
pv_rcnn_split)
  kitti
  # Where a 2-GPU rank loses its ~20 % against one process (fifth session): the plain
  # 1-GPU run, the same as a DDP world of one (the distributed code path alone), the
  # 2-GPU DDP run and two independent 1-GPU runs at once (sharing the machine alone).
  # Then the plain 1-GPU run with torchrun's one intra-op thread (OMP_NUM_THREADS=1).
  scaling split ${PV_RCNN_TIMEOUT:-450} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --nproc 1,2 --ddp-one --independent --iters ${ITERS:-12} --warmup 1 \
    --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2}
  OMP_NUM_THREADS=1 scaling split_omp1 ${OMP1_TIMEOUT:-120} \
    configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 1 --iters ${ITERS:-12} --warmup 1 \
    --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2}
  ;;
pv_rcnn_neighbour)
  kitti
  # Which shared resource slows a PV-RCNN process when another trains beside it (sixth
  # session: two independent 1-GPU runs each 10 % slower than one alone): the 1-GPU run
  # on GPU 0 alone, then beside benchmarks/neighbour_load.py on GPU 1 (or the CPU only).
  # LOADS="none launches copies reads" splits the host-bound load into its parts.
  for load in ${LOADS:-none cpu host_bound gpu}; do
    pid=
    if [ "$load" != none ]; then
      CUDA_VISIBLE_DEVICES=1 timeout -s KILL 300 python benchmarks/neighbour_load.py \
        $load --seconds 280 > "$RES/neighbour_$load.txt" 2>&1 &
      pid=$!
      sleep 5
    fi
    echo "== $(date +%T) neighbour $load"
    CUDA_VISIBLE_DEVICES=0 scaling "neighbour_$load" ${PV_RCNN_TIMEOUT:-150} \
      configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 1 --iters ${ITERS:-12} --warmup 1 \
      --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
      --cfg-options train_dataloader.num_workers=${WORKERS:-2}
    if [ -n "$pid" ]; then
      pkill -TERM -f "neighbour_load.py $load"; sleep 2; pkill -KILL -f "neighbour_load.py $load"
      wait $pid; echo "neighbour $load: $(cat "$RES/neighbour_$load.txt")"
    fi
  done
  tar czf "$OUT/results.tgz" -C "$RES" . 2>/dev/null
  ;;
pv_rcnn_shims)
  kitti
  # The patches that cut host reads, on the GPU: their CUDA tests, the GPU census of a
  # micro-batch (CUDA API calls, host reads, top kernels), the 1-GPU run without the
  # read patches, without the four target patches only, with all (same machine A/B), then
  # with all on NPROC GPUs.
  CUDA_VISIBLE_DEVICES=0 timeout 150 python -m pytest -q -p no:cacheprovider \
    tests/patches/speed/test_grouping_backward.py tests/patches/speed/test_rpn_proposal_nms.py \
    tests/patches/speed/test_stack_query_group.py tests/patches/speed/test_roi_assign.py \
    tests/patches/speed/test_anchor_targets.py tests/patches/speed/test_iou_piecewise_sampler.py \
    tests/patches/speed/test_foreground_seg_targets.py tests/patches/speed/test_rcnn_bbox_targets.py \
    tests/diagnostics/test_profiling.py > "$RES/shim_tests.txt" 2>&1; tail -3 "$RES/shim_tests.txt"
  CUDA_VISIBLE_DEVICES=0 timeout ${CENSUS_TIMEOUT:-150} python \
    tools/analysis/count_host_reads.py configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --steps 2 --warmup 3 --launches --cuda-api --top 40 --out "$RES/gpu_census.json" \
    --cfg-options train_dataloader.num_workers=${WORKERS:-2} > "$RES/gpu_census.txt" 2>&1
  grep -E "host reads a training step|kernel-running|^profiled" "$RES/gpu_census.txt"
  targets=anchor_targets,iou_piecewise_sampler,foreground_seg_targets,rcnn_bbox_targets
  for ab in ${AB:-"no_read_shims=rpn_proposal_nms,stack_query_group,roi_assign,$targets" \
                 "no_target_shims=$targets"}; do
    MMDET3D_SCALING_SKIP_PATCHES=${ab#*=} CUDA_VISIBLE_DEVICES=0 scaling ${ab%%=*} \
      ${PV_RCNN_TIMEOUT:-110} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py --nproc 1 \
      --iters ${ITERS:-12} --warmup 1 --warmup-iters ${WARMUP_ITERS:-20} --no-comm-run \
      --cfg-options train_dataloader.num_workers=${WORKERS:-2}
  done
  scaling shims ${PV_RCNN_TIMEOUT2:-230} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --nproc ${NPROC:-1,2} --iters ${ITERS:-12} --warmup 1 --warmup-iters ${WARMUP_ITERS:-20} \
    --no-comm-run --cfg-options train_dataloader.num_workers=${WORKERS:-2}
  ;;
recheck)
  kitti
  # PV-RCNN as shipped, 1 -> 2 GPUs, 30 warm-up iterations in every process (the
  # diag stage's runs still sped up after 3 warm-up steps), then the auto batch size
  # targets (largest confirmed by 20 training steps on random batches).
  scaling pv_rcnn_warm ${PV_RCNN_TIMEOUT:-300} configs/pv_rcnn/pv_rcnn_synthetic_kitti.py \
    --nproc 1,2 --iters ${ITERS:-20} --warmup 1 --warmup-iters ${WARMUP_ITERS:-30} \
    --no-comm-run --cfg-options train_dataloader.num_workers=${WORKERS:-2}
  auto_batch_benchmark
  CUDA_VISIBLE_DEVICES=0 timeout 60 python -m pytest -q -p no:cacheprovider \
    tests/batch_size/test_memory_probe.py 2>&1 | tail -1 | tee -a "$OUT/auto_batch_size.txt"
  ;;
bevfusion)
  [ -f data/nuscenes/nuscenes_infos_train.pkl ] || python tools/create_synthetic_data.py \
    nuscenes --out data/nuscenes --train-frames 32 --val-frames 4 --workers 16 \
    --no-progress --overwrite 2>&1 | tail -1
  scaling bevfusion_lidar ${BEV_TIMEOUT:-420} \
    configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_1xb4-cyclic-20e_nus-3d.py \
    --nproc 1,2 --iters ${BEV_ITERS:-4} --warmup ${BEV_WARMUP:-2} ${BEV_EXTRA:-}
  ;;
auto_batch)
  kitti
  auto_batch_benchmark
  # GPUMonitorHook on 1 GPU and with 2 NCCL processes
  CUDA_VISIBLE_DEVICES=0 timeout 120 python -m pytest -q -p no:cacheprovider \
    tests/hooks/test_gpu_monitor_hook.py 2>&1 | tail -4 | tee "$OUT/monitor_1gpu.txt"
  timeout 120 python -m pytest -q -p no:cacheprovider tests/hooks/test_gpu_monitor_hook.py \
    2>&1 | tail -4 | tee "$OUT/monitor_2gpu.txt"
  ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
