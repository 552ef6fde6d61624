"""Config switch for the fastest arrangement that fits a memory budget (a
:func:`prepare_config` step)::

    scaling = dict(total_batch_size=32, memory_budget='24GiB')  # or 24 (GiB)

adds ``FastestFitHook`` to ``custom_hooks`` (a hook already there keeps its options).
Runs before the auto batch size step: both choose the per-GPU batch, so asking for both
is an error.
"""
from mmengine.config import Config, ConfigDict

from ..utils.memory_size import parse_memory_budget

HOOK_TYPE = 'FastestFitHook'
AUTO_HOOK_TYPE = 'AutoBatchSizeHook'


def _hook_types(hooks: list) -> set:
    return {h.get('type').split('.')[-1] for h in hooks
            if isinstance(h, dict) and isinstance(h.get('type'), str)}


def configure_fastest_fit(cfg: Config) -> Config:
    """Validate ``scaling.memory_budget`` and add the hook it asks for. Idempotent."""
    scaling = cfg.get('scaling') or {}
    budget = scaling.get('memory_budget')
    hooks = list(cfg.get('custom_hooks') or [])
    types = _hook_types(hooks)
    if budget is None and HOOK_TYPE not in types:
        return cfg
    if budget is not None:
        parse_memory_budget(budget, 'scaling.memory_budget')
    if scaling.get('per_gpu_batch_size') == 'auto':
        raise ValueError(
            f"scaling.memory_budget={budget!r} (or {HOOK_TYPE}) chooses the fastest "
            "per-GPU batch that fits, scaling.per_gpu_batch_size='auto' the largest: "
            'remove one of them (a number in per_gpu_batch_size fixes the batch and '
            'leaves only the checkpointing to choose).')
    if cfg.get('auto_batch_size') not in (None, False) or AUTO_HOOK_TYPE in types:
        raise ValueError(
            f'scaling.memory_budget={budget!r} (or {HOOK_TYPE}) chooses the per-GPU '
            f'batch, and so does auto_batch_size / {AUTO_HOOK_TYPE}: remove one of them.')
    if HOOK_TYPE not in types:
        hooks.append(ConfigDict(type=HOOK_TYPE))
        cfg.custom_hooks = hooks
    return cfg
