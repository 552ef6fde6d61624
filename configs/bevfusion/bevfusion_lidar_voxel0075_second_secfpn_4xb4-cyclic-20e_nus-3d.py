# Alias: the former name of configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_4xb4-acc2-cyclic-20e_nus-3d.py
# (renamed to mmdet3d's rule {algorithm}_{components}_{N}xb{B}[-amp][-accK]-{schedule}_{dataset},
# docs/configs.md). Kept so commands and work dirs that use this name still work.
_base_ = ['./bevfusion_lidar_voxel0075_second_secfpn_4xb4-acc2-cyclic-20e_nus-3d.py']
