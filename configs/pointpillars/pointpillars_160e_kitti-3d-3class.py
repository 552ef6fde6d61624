# PointPillars, KITTI 3 classes: mmdet3d 1.4's pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class recipe for any GPU count. Model, pipeline,
# AdamW and the cyclic schedule come unchanged from the stock config in the mmdet3d
# package; this file adds what the plugin needs to keep the recipe on 1..N GPUs. The
# per-GPU-count files (pointpillars_hv_secfpn_{1,2,4,8}xb6-160e_kitti-3d-3class.py) inherit it.
_base_ = ['mmdet3d::pointpillars/pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py']
custom_imports = dict(imports=['mmdet3d_scaling'], allow_failed_imports=False)
runner_type = 'ScalingRunner'  # the plugin's keys below are honoured by it
patches = ['speed']  # fewer GPU -> CPU waits in the heads: docs/patches.md
async_logging = True  # losses and grad norm read without waiting for the GPU: docs/hooks.md
# torch's fused AdamW step: one kernel for all parameters and no host reads of its step
# counters; the same updates to float rounding (docs/configs.md, "Fused optimizer step")
optim_wrapper = dict(optimizer=dict(fused=True))

# The recipe: 8 GPUs x 6 samples = effective batch 48 at lr 0.001, kept on every GPU count
# (6 per GPU, accumulation = 8 / GPUs).
scaling = dict(total_batch_size=48, base_batch_size=48, lr_scaling='linear',
               per_gpu_batch_size=6)
# Stated explicitly (48 = 8 x 6 matches this recipe); the scaling key owns the LR.
auto_scale_lr = dict(enable=False, base_batch_size=48)
distributed = dict(sync_bn='torch')  # a single process keeps plain BN
# NaN / inf guard and preemption-safe saves (docs/hooks.md)
custom_hooks = [dict(type='NonFiniteGuardHook'), dict(type='PreemptionHook')]
