"""Pure ``cfg -> cfg`` steps: what the plugin's config keys mean.

| module            | keys it reads                                               |
|-------------------|-------------------------------------------------------------|
| legacy_keys       | mmcv 1.x ``optimizer_config``, ``fp16``; the plugin's ``amp`` |
| scaling_recipe    | ``scaling`` (total batch -> per-GPU batch x accumulation, LR)  |
| distributed       | ``distributed`` (DDP wrapper options, SyncBN, timeout)        |
| devices           | none: gloo and CPU-style DDP where there is no CUDA           |
| matmul_precision  | ``float32_matmul_precision``                                |
| fused_optimizer   | ``optim_wrapper.optimizer.fused`` (torch's key, checked)      |
| preflight         | ``preflight``: the data paths a command will read            |
| validators        | shared checks (positive ints, conflicting settings)         |

:func:`prepare_config` applies them in order; ``ScalingRunner`` calls it once. The keys
of the batch size search (``auto_batch_size``, ``scaling.per_gpu_batch_size='auto'``,
``scaling.memory_budget``) are read by its own step, in
:mod:`mmdet3d_scaling.batch_size.config_step`, which registers itself here
(:func:`register_batch_step`).
"""
from .preparation import PLUGIN_KEYS, plugin_keys, prepare_config, register_batch_step

__all__ = ['PLUGIN_KEYS', 'plugin_keys', 'prepare_config', 'register_batch_step']
