# PV-RCNN smoke recipe for a CPU on synthetic KITTI-format data: the full model (sparse
# encoder on spconv's CPU path, voxel set abstraction, RPN, RoI-grid head), its CUDA-only
# point ops replaced on CPU tensors by the PyTorch twins of
# mmdet3d_scaling/patches/cpu/point_ops_cpu.py.
#
#   python tools/create_synthetic_data.py kitti --out data/synthetic_kitti
#   python tools/train.py configs/pv_rcnn/pv_rcnn_synthetic_kitti_cpu.py
#
# Differences to pv_rcnn_synthetic_kitti.py, all for speed (the CPU twins are plain
# tensor ops): 256 keypoints (2048), 1024 -> 64 proposals after the RPN in training
# (9000 -> 512: rotated NMS over 9000 boxes takes minutes on a CPU), 32 RoIs a sample
# (128), batch 2 in one process with no loader workers, 20 optimizer steps. About 25 s
# an iteration and 7 s a validation frame on 2 CPU cores (the dense BEV backbone
# dominates). For tests, smoke runs and profiling host-side code; train on a GPU.
_base_ = ['./pv_rcnn_synthetic_kitti.py']

max_iters = 20
scaling = dict(total_batch_size=2, per_gpu_batch_size=None, max_per_gpu_batch_size=2)

model = dict(
    points_encoder=dict(num_keypoints=256),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1024, nms_post=64, max_num=64),
        rcnn=dict(sampler=dict(num=32))),
    test_cfg=dict(rpn=dict(nms_pre=1024, nms_post=64, max_num=64)))

train_dataloader = dict(num_workers=0, persistent_workers=False, pin_memory=False)
val_dataloader = dict(num_workers=0, persistent_workers=False)
test_dataloader = val_dataloader
env_cfg = dict(cudnn_benchmark=False)
float32_matmul_precision = None

param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=5),
    dict(type='CosineAnnealingLR', T_max=max_iters - 5, by_epoch=False, begin=5,
         end=max_iters),
]
train_cfg = dict(max_iters=max_iters, val_interval=max_iters)
default_hooks = dict(
    logger=dict(interval=5),
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=max_iters))
