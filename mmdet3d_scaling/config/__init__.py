"""Pure ``cfg -> cfg`` steps: what the plugin's config keys mean.

| module            | keys it reads                                               |
|-------------------|-------------------------------------------------------------|
| legacy_keys       | mmcv 1.x ``optimizer_config``, ``fp16``; the plugin's ``amp`` |
| scaling_recipe    | ``scaling`` (total batch -> per-GPU batch x accumulation, LR)  |
| distributed       | ``distributed`` (DDP wrapper options, SyncBN, timeout)        |
| devices           | none: gloo and CPU-style DDP where there is no CUDA           |
| auto_batch_size   | ``auto_batch_size``, ``scaling.per_gpu_batch_size='auto'``     |
| fastest_fit       | ``scaling.memory_budget`` (fastest arrangement that fits)   |
| matmul_precision  | ``float32_matmul_precision``                                |
| preflight         | ``preflight``: the data paths a command will read            |
| validators        | shared checks (positive ints, conflicting settings)         |

:func:`prepare_config` applies them in order; ``ScalingRunner`` calls it once.
"""
from .preparation import PLUGIN_KEYS, plugin_keys, prepare_config

__all__ = ['PLUGIN_KEYS', 'plugin_keys', 'prepare_config']
