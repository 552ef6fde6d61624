# BEVFusion LiDAR + camera, official recipe on 1 GPU(s): per-GPU batch 4 x 1 GPU(s) x
# gradient accumulation 8 = effective batch 32, lr 2e-4 (unscaled), 6 epochs.
# Per-GPU batch 4 keeps BatchNorm statistics as in the official 8 x 4 run and needs
# a large-memory GPU (for one 24 GB GPU see configs/bevfusion_1gpu.py). The scaling
# engine derives the accumulation from the world size and prints the plan at
# start; started on another GPU count it re-plans (same effective batch).
#
#   python tools/train.py configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb4-acc8-6e_nus-3d.py
_base_ = ['./bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py']

scaling = dict(total_batch_size=32, base_batch_size=32, lr_scaling='linear',
               per_gpu_batch_size=4)
# 8 loader workers: the step outruns 4 (PIL decoding of 6 full-size JPEGs a sample
# loads 11.5 samples/s with 4 workers, 22.7 with 8, docs/benchmarks.md "Camera
# decoding"; the bf16 step trains ~16). One GPU's share of a host's cores; on
# several GPUs a process each keeps the official 4.
train_dataloader = dict(batch_size=4, num_workers=8)
# The BEV backbone, neck and head as a CUDA graph too (forward and backward), beside
# Swin-T + neck; one process only. Measured speed-up and the equality test:
# docs/bevfusion.md "CUDA graphs".
model = dict(cuda_graphs=['img_encoder', 'bev_head'])
