# Alias, the short documented name: BEVFusion LiDAR + camera on ONE 24 GB GPU, i.e.
# configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb2-amp-acc16-6e_nus-3d.py
# (per-GPU batch 2 x 1 GPU x accumulation 16 = 32, AMP, gradient checkpointing, lean
# BEV pooling; that file says why). Kept for
#   python tools/train.py configs/bevfusion_1gpu.py   (work dir work_dirs/bevfusion_1gpu)
_base_ = ['./bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb2-amp-acc16-6e_nus-3d.py']
