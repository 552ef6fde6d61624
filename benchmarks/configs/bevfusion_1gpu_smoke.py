# configs/bevfusion_1gpu.py for a short measured run on synthetic nuScenes-format data
# at the official sizes (900x1600 cameras resized to 256x704): one epoch, then the
# nuScenes evaluation, with the GPU monitor. Used by benchmarks/gpu_1x.sh.
_base_ = ['../../configs/bevfusion_1gpu.py']

train_cfg = dict(max_epochs=1, val_interval=1)
model = dict(img_backbone=dict(init_cfg=None))  # no network on the GPU machine
default_hooks = dict(logger=dict(interval=5))
custom_hooks = [dict(type='GPUMonitorHook', interval=5)]
