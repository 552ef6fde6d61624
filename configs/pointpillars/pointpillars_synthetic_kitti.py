# A small PointPillars (the demo's reduced model) on synthetic KITTI-format data with the
# scaling engine's recipe: effective batch 8 on any GPU/process count (up to 2 per
# process x processes x accumulation: 2x1x4, 2x2x2, 2x4x1, 1x8x1), LR of the demo
# (tuned for batch 4) scaled linearly. Fast enough for CPU smoke runs and the benchmark tool's
# tests (gloo), also runs on GPUs.
#
#   python tools/create_synthetic_data.py kitti --out data/synthetic_kitti
#   python tools/train.py configs/pointpillars/pointpillars_synthetic_kitti.py
#   bash tools/dist_train.sh configs/pointpillars/pointpillars_synthetic_kitti.py 2
_base_ = ['../demo/pointpillars_synthetic_kitti_cpu.py']

scaling = dict(total_batch_size=8, base_batch_size=4, lr_scaling='linear',
               max_per_gpu_batch_size=2)
train_dataloader = dict(batch_size=2)
distributed = dict(sync_bn='torch')  # a single process keeps plain BN
custom_hooks = [dict(type='GPUMonitorHook'), dict(type='NonFiniteGuardHook'),
                dict(type='PreemptionHook')]
