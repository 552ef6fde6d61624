# A small PointPillars (the demo's reduced model) on synthetic KITTI-format data with the
# scaling engine's recipe: effective batch 4 on any GPU/process count (2 per process x
# processes x accumulation). Fast enough for CPU smoke runs and the benchmark tool's
# tests (gloo), also runs on GPUs.
#
#   python tools/create_synthetic_data.py kitti --out data/synthetic_kitti
#   python tools/train.py configs/pointpillars/pointpillars_synthetic_kitti.py
#   bash tools/dist_train.sh configs/pointpillars/pointpillars_synthetic_kitti.py 2
_base_ = ['../demo/pointpillars_synthetic_kitti_cpu.py']

scaling = dict(total_batch_size=4, base_batch_size=4, lr_scaling='linear',
               per_gpu_batch_size=2)
train_dataloader = dict(batch_size=2)
distributed = dict(sync_bn='torch')  # a single process keeps plain BN
custom_hooks = [dict(type='GPUMonitorHook')]
