# BEVFusion LiDAR + camera, official recipe on 2 GPU(s): per-GPU batch 4 x 2 GPU(s) x
# gradient accumulation 4 = effective batch 32, lr 2e-4 (unscaled), 6 epochs.
# Per-GPU batch 4 keeps BatchNorm statistics as in the official 8 x 4 run and needs
# a large-memory GPU (for one 24 GB GPU see configs/bevfusion_1gpu.py). The scaling
# engine derives the accumulation from the world size and prints the plan at
# start; started on another GPU count it re-plans (same effective batch).
#
#   bash tools/dist_train.sh configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_2xb4-acc4-6e_nus-3d.py 2
_base_ = ['./bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py']

scaling = dict(total_batch_size=32, base_batch_size=32, lr_scaling='linear',
               per_gpu_batch_size=4)
train_dataloader = dict(batch_size=4)
