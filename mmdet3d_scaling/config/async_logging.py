"""``async_logging=True``: loss and gradient-norm reads that do not wait for the GPU.

A pure ``cfg -> cfg`` step: the key swaps ``default_hooks.runtime_info`` for
``AsyncRuntimeInfoHook`` and selects the ``deferred_grad_norm`` patch (its gradient-norm
half); ``False`` or absent leaves the config as it is.
"""
from mmengine.config import Config, ConfigDict

from ..utils.registry_scope import type_name

HOOK = 'AsyncRuntimeInfoHook'
PATCH = 'deferred_grad_norm'


def configure_async_logging(cfg: Config) -> Config:
    """Apply ``cfg.async_logging`` (idempotent)."""
    value = cfg.get('async_logging')
    if value is None or value is False:
        return cfg
    if value is not True:
        raise ValueError(f'async_logging must be True or False, got {value!r}: True reads '
                         'losses and the gradient norm without waiting for the GPU '
                         '(logged values exact, read up to one iteration late).')
    hooks = dict(cfg.get('default_hooks') or {})
    current = hooks.get('runtime_info')
    if current is not None:
        name = type_name(current.get('type') if isinstance(current, dict) else type(current))
        if name not in ('RuntimeInfoHook', HOOK):
            raise ValueError(
                f'async_logging=True replaces default_hooks.runtime_info, but this config '
                f'sets it to {name!r}: drop async_logging, or drop that hook from '
                f'default_hooks.runtime_info.')
    hooks['runtime_info'] = ConfigDict(type=HOOK)
    cfg.default_hooks = hooks
    patches = list(cfg.get('patches') or [])
    if PATCH not in patches:
        patches.append(PATCH)
    cfg.patches = patches
    return cfg
