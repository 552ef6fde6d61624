"""The config step that gives a run with PreemptionHook a ResumableSampler."""
from mmengine.config import Config

from mmdet3d_scaling.config.preemption import use_resumable_sampler


def _cfg(hooks, sampler='DefaultSampler') -> Config:
    return Config(dict(custom_hooks=hooks, train_dataloader=dict(
        sampler=dict(type=sampler, shuffle=True))))


def test_default_sampler_is_swapped_when_the_hook_is_there():
    cfg = use_resumable_sampler(_cfg([dict(type='PreemptionHook')]))
    assert cfg.train_dataloader.sampler == dict(type='mmdet3d_scaling.ResumableSampler',
                                                shuffle=True)
    again = use_resumable_sampler(cfg)  # idempotent
    assert again.train_dataloader.sampler.type == 'mmdet3d_scaling.ResumableSampler'


def test_nothing_changes_without_the_hook_or_with_another_sampler():
    assert use_resumable_sampler(_cfg([])).train_dataloader.sampler.type == \
        'DefaultSampler'
    scoped = _cfg([dict(type='mmdet3d_scaling.PreemptionHook')], 'InfiniteSampler')
    assert use_resumable_sampler(scoped).train_dataloader.sampler.type == \
        'InfiniteSampler'
