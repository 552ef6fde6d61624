# Alias, the short documented name: BEVFusion LiDAR + camera on ONE 24 GB GPU, i.e.
# configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_fit-24gib-amp-6e_nus-3d.py
# (effective batch 32, AMP `dtype='auto'`: bf16 where the GPU has it, else fp16 from
# loss scale 2**3; lean BEV pooling; per-GPU batch and gradient checkpointing chosen at
# start as the fastest fit in 24 GiB; that file says how). Kept for
#   python tools/train.py configs/bevfusion_1gpu.py \
#       --cfg-options load_from=<LiDAR-only run>/epoch_20.pth   (the normal start)
# (work dir work_dirs/bevfusion_1gpu; docs/bevfusion.md, "Training BEVFusion on one GPU").
_base_ = ['./bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_fit-24gib-amp-6e_nus-3d.py']
