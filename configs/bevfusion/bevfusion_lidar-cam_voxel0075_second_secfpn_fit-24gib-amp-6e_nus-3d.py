# BEVFusion LiDAR + camera on ONE 24 GB GPU with the official recipe's hyper-parameters
# (effective batch 32, lr 2e-4, 6 epochs, AMP `dtype='auto'`: bf16 where the GPU has it,
# else fp16 from loss scale 2**3; lean BEV pooling), the per-GPU batch and gradient
# checkpointing chosen at start: the fastest fit in 24 GiB.
# Its short, documented name is configs/bevfusion_1gpu.py (an alias of this file):
#
#   python tools/train.py configs/bevfusion_1gpu.py \
#       --cfg-options load_from=work_dirs/<lidar-only run>/epoch_20.pth
#
# `scaling.memory_budget='24GiB'` adds FastestFitHook (docs/auto_batch_size.md,
# "The fastest fit in a memory budget"). Before training it tries, in this order,
# batch 4 without checkpointing, batch 4 with the checkpointing below, then batches 2
# and 1 likewise: each trains 2 + 3 real steps on the largest samples with the GPU
# limited to 90 % of 24 GiB, the ones that fit are timed, and the fastest (samples/s)
# is used, with accumulation 32 / batch (batch 4 x 8, 2 x 16, ...). The log prints the
# choice, its speed and memory (peak allocated / reserved after warm-up) and every
# trial; the result is cached in WORK_DIR/auto_batch_size.json, so a resumed run does
# not search again. On another card: --cfg-options scaling.memory_budget=16GiB (a
# number is GiB). The former fixed recipe (batch 2 x accumulation 16, checkpointing on,
# configs/bevfusion/..._1xb2-amp-acc16-6e_nus-3d.py) is
#   --cfg-options scaling.memory_budget=None scaling.per_gpu_batch_size=2
# and a number in scaling.per_gpu_batch_size with the budget fixes the batch and lets
# the search choose only the checkpointing.
_base_ = ['./bevfusion_lidar-cam_voxel0075_second_secfpn_1xb2-amp-acc16-6e_nus-3d.py']

scaling = dict(per_gpu_batch_size=None, memory_budget='24GiB')
train_dataloader = dict(batch_size=4)  # the largest per-GPU batch tried
# the checkpointing that variants "with checkpointing" use (from the base file):
# Swin-T blocks, image neck levels, depth-net + pooling (view_transform.with_cp)
