# Runtime defaults shared by this project's configs (mmdet3d 1.4 / mmengine 0.10 keys).
default_scope = 'mmdet3d'

default_hooks = dict(
    timer=dict(type='IterTimerHook'),
    logger=dict(type='LoggerHook', interval=50),
    param_scheduler=dict(type='ParamSchedulerHook'),
    checkpoint=dict(type='CheckpointHook', interval=-1),
    sampler_seed=dict(type='DistSamplerSeedHook'),
    visualization=dict(type='Det3DVisualizationHook'))

env_cfg = dict(
    cudnn_benchmark=False,
    mp_cfg=dict(mp_start_method='fork', opencv_num_threads=0),
    # nccl on GPUs; on a CPU-only machine the plugin switches to gloo
    dist_cfg=dict(backend='nccl'))

# Stop at the first NaN / inf loss or gradient norm, naming the samples; on SIGTERM /
# SIGUSR1 save a checkpoint at the next optimizer step and exit 0 (docs/hooks.md).
custom_hooks = [dict(type='NonFiniteGuardHook'), dict(type='PreemptionHook')]

log_processor = dict(type='LogProcessor', window_size=50, by_epoch=True)

# LocalVisBackend writes the JSON scalar log (read by tools/analysis/plot_gpu_monitor.py).
# TensorBoard: use the second line instead of the first to also write event files to
# <work_dir>/<timestamp>/vis_data/ (`tensorboard --logdir work_dirs/<config>`; needs the
# `tensorboard` package). A config built on this file switches it on with
# `visualizer = dict(vis_backends=[dict(type='LocalVisBackend'),
# dict(type='TensorboardVisBackend')])` (docs/monitoring.md, "TensorBoard").
vis_backends = [dict(type='LocalVisBackend')]
# vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='Det3DLocalVisualizer', vis_backends=vis_backends, name='visualizer')

log_level = 'INFO'
load_from = None
resume = False
