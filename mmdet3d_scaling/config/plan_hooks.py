"""The hooks a scaling recipe needs in ``custom_hooks``: the plan hook and the one that
saves an unfinished accumulation window's gradients in checkpoints."""
from typing import Any

from mmengine.config import Config, ConfigDict

from ..utils.registry_scope import type_name


def _hook_type(hook: Any) -> str:
    return type_name(hook.get('type') if isinstance(hook, dict) else type(hook))


#: hooks that save an unfinished accumulation window's gradients in checkpoints
WINDOW_CHECKPOINT_HOOKS = ('AccumulationCheckpointHook', 'GradientCumulativeOptimizerHook')


def add_plan_hooks(cfg: Config) -> None:
    """The plan hook (plan in checkpoints, conversion on resume) and the hook that puts
    an unfinished window's gradients into a checkpoint (a checkpoint can still land
    inside a window: an interval that is not a multiple, ``save_last``, a plan raised
    at run time by the auto batch size search)."""
    hooks = list(cfg.get('custom_hooks') or [])
    types = {_hook_type(h) for h in hooks}
    if 'ScalingPlanHook' not in types:
        hooks.append(ConfigDict(type='ScalingPlanHook'))
    if not types & set(WINDOW_CHECKPOINT_HOOKS):
        hooks.append(ConfigDict(type='AccumulationCheckpointHook'))
    cfg.custom_hooks = hooks
