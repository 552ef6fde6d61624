# BEVFusion LiDAR-only, official recipe on 2 GPUs: per-GPU batch 4 x 2 GPUs x
# gradient accumulation 4 = effective batch 32, lr 1e-4 (unscaled), 20 epochs.
# Per-GPU batch 4 on every variant keeps BatchNorm statistics as in the official
# 8 x 4 run. The scaling engine derives the accumulation from the world size and prints
# the plan at start; started on another GPU count it re-plans (same effective batch).
#
#   bash tools/dist_train.sh configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_2xb4-acc4-cyclic-20e_nus-3d.py 2
_base_ = ['./bevfusion_lidar_voxel0075_second_secfpn_cyclic-20e_nus-3d.py']

scaling = dict(total_batch_size=32, base_batch_size=32, lr_scaling='linear',
               per_gpu_batch_size=4)
train_dataloader = dict(batch_size=4)
