# Alias, the short documented name: BEVFusion LiDAR + camera on ONE 24 GB GPU, i.e.
# configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb2-amp-acc16-6e_nus-3d.py
# (per-GPU batch 2 x 1 GPU x accumulation 16 = 32, AMP `dtype='auto'`: bf16 where the
# GPU has it, else fp16 from loss scale 2**3; gradient checkpointing, lean BEV pooling;
# that file says why). Kept for
#   python tools/train.py configs/bevfusion_1gpu.py \
#       --cfg-options load_from=<LiDAR-only run>/epoch_20.pth   (the normal start)
# (work dir work_dirs/bevfusion_1gpu; docs/bevfusion.md, "Training BEVFusion on one GPU").
_base_ = ['./bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_1xb2-amp-acc16-6e_nus-3d.py']
