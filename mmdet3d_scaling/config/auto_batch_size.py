"""Config switch for the auto batch size (a :func:`prepare_config` step).

Two equivalent ways to turn it on::

    scaling = dict(total_batch_size=32, per_gpu_batch_size='auto')  # with the recipe
    auto_batch_size = dict(margin=0.1)  # AutoBatchSizeHook's arguments; or True

Either adds ``AutoBatchSizeHook`` to ``custom_hooks``. Must run before the scaling
recipe step, which expects a number (or None) in ``scaling.per_gpu_batch_size``.
"""
from mmengine.config import Config, ConfigDict

from ..utils.registry_scope import type_name

HOOK_TYPE = 'AutoBatchSizeHook'
CONFIG_KEY = 'auto_batch_size'


def _has_hook(hooks: list) -> bool:
    return any(isinstance(h, dict) and type_name(h.get('type')) == HOOK_TYPE
               for h in hooks)


def configure_auto_batch_size(cfg: Config) -> Config:
    """Turn ``scaling.per_gpu_batch_size='auto'`` / ``auto_batch_size`` into the hook.

    Idempotent: the ``auto_batch_size`` key is consumed and ``'auto'`` becomes None (the
    recipe then starts from the configured batch, which the hook replaces before
    training).
    """
    scaling = cfg.get('scaling') or {}
    wants_auto = scaling.get('per_gpu_batch_size') == 'auto'
    options = cfg.pop(CONFIG_KEY, None)
    if options is False and wants_auto:
        raise ValueError(f"{CONFIG_KEY}=False contradicts scaling.per_gpu_batch_size="
                         "'auto': remove one of them.")
    if options is None or options is False:
        options = {} if wants_auto else None
    elif options is True:
        options = {}
    elif not isinstance(options, dict):
        raise ValueError(f'{CONFIG_KEY} must be a dict of AutoBatchSizeHook arguments '
                         f'or True/False, got {options!r}')
    if wants_auto:
        cfg.scaling.per_gpu_batch_size = None
    if options is None:
        return cfg
    hooks = list(cfg.get('custom_hooks') or [])
    if _has_hook(hooks):
        raise ValueError(f'{HOOK_TYPE} is in custom_hooks and also requested by '
                         f"{CONFIG_KEY} / scaling.per_gpu_batch_size='auto': configure "
                         'it in one place.')
    hooks.append(ConfigDict(type=HOOK_TYPE, **options))
    cfg.custom_hooks = hooks
    return cfg
