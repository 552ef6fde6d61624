"""Config step: a run with PreemptionHook samples its training data with ResumableSampler.

mmengine's ``DefaultSampler`` cannot start an epoch in its middle, so a run resumed
from a preemption checkpoint would train the interrupted epoch's first samples twice.
``ResumableSampler`` yields the same indices (same shuffle by seed + epoch) and can
skip; this step swaps it in for ``DefaultSampler`` when the config asks for the
PreemptionHook, and says so in the log.
"""
from mmengine.config import Config
from mmengine.logging import print_log

_DEFAULT_SAMPLERS = ('DefaultSampler', 'mmengine.DefaultSampler')
_HOOK = 'PreemptionHook'


def _has_preemption_hook(cfg: Config) -> bool:
    hooks = list(cfg.get('custom_hooks') or [])
    hooks += list((cfg.get('default_hooks') or {}).values())
    return any(isinstance(h, dict) and str(h.get('type', '')).split('.')[-1] == _HOOK
               for h in hooks)


def use_resumable_sampler(cfg: Config) -> Config:
    """Swap ``train_dataloader.sampler`` DefaultSampler -> ResumableSampler when the
    config has a PreemptionHook (in place; idempotent)."""
    loader = cfg.get('train_dataloader')
    sampler = loader.get('sampler') if isinstance(loader, dict) else None
    if not isinstance(sampler, dict) or sampler.get('type') not in _DEFAULT_SAMPLERS:
        return cfg
    if not _has_preemption_hook(cfg):
        return cfg
    sampler['type'] = 'mmdet3d_scaling.ResumableSampler'
    print_log('PreemptionHook: train_dataloader.sampler DefaultSampler -> '
              'ResumableSampler (the same indices; a resumed epoch continues after the '
              'samples already trained).', logger='current')
    return cfg
