"""The batch size search's config step: each key read once, the hook added with the
resolved values (budget in bytes, the recipe), conflicts named; idempotent."""
import pytest
from mmengine.config import Config

from mmdet3d_scaling.batch_size.config_step import configure_batch_size_search
from mmdet3d_scaling.config.preparation import BATCH_STEPS

GiB = 2**30
RECIPE = dict(total_batch_size=8, base_batch_size=None, lr_scaling='linear',
              per_gpu_batch_size=None, max_per_gpu_batch_size=None)


def prepared(**cfg) -> Config:
    return configure_batch_size_search(Config(cfg))


def test_it_is_a_step_of_prepare_config():
    assert configure_batch_size_search in BATCH_STEPS


@pytest.mark.parametrize('cfg,hook', [
    (dict(scaling=dict(total_batch_size=8, per_gpu_batch_size='auto')),
     dict(type='AutoBatchSizeHook', recipe=RECIPE)),
    (dict(auto_batch_size=dict(margin=0.2)),
     dict(type='AutoBatchSizeHook', margin=0.2, recipe=None)),
    (dict(auto_batch_size=True, scaling=dict(total_batch_size=8, base_batch_size=4,
                                             max_per_gpu_batch_size=2)),
     dict(type='AutoBatchSizeHook',
          recipe=dict(RECIPE, base_batch_size=4, max_per_gpu_batch_size=2))),
    (dict(scaling=dict(total_batch_size=8, memory_budget='24GiB')),
     dict(type='FastestFitHook', budget_bytes=24 * GiB, recipe=RECIPE)),
    (dict(scaling=dict(total_batch_size=8, memory_budget=1.5, per_gpu_batch_size=2),
          custom_hooks=[dict(type='mmdet3d_scaling.FastestFitHook', min_gain=0.1)]),
     dict(type='mmdet3d_scaling.FastestFitHook', min_gain=0.1,
          budget_bytes=int(1.5 * GiB), recipe=dict(RECIPE, per_gpu_batch_size=2))),
    (dict(scaling=dict(total_batch_size=8),  # the hook's own option, as users write it
          custom_hooks=[dict(type='FastestFitHook', memory_budget='512MiB')]),
     dict(type='FastestFitHook', budget_bytes=512 * 2**20, recipe=RECIPE)),
], ids=['auto', 'auto_batch_size', 'recipe', 'budget', 'hook-kept', 'hook-budget'])
def test_the_hook_gets_the_resolved_values_once(cfg, hook):
    cfg = prepared(**cfg)
    assert cfg.custom_hooks == [hook]
    assert 'auto_batch_size' not in cfg
    assert (cfg.get('scaling') or {}).get('per_gpu_batch_size') != 'auto'
    assert configure_batch_size_search(cfg).custom_hooks == [hook]  # idempotent


def test_nothing_asked_nothing_added():
    assert not prepared(scaling=dict(total_batch_size=8)).get('custom_hooks')


@pytest.mark.parametrize('cfg,message', [
    (dict(auto_batch_size=True, custom_hooks=[dict(type='AutoBatchSizeHook')]),
     'in one place'),
    (dict(auto_batch_size='yes'), 'must be a dict'),
    (dict(auto_batch_size=False, scaling=dict(per_gpu_batch_size='auto')),
     'contradicts'),
    (dict(scaling=dict(total_batch_size=8, per_gpu_batch_size=2), auto_batch_size=True),
     'per_gpu_batch_size=2 fixes it'),
    (dict(scaling=dict(total_batch_size=4, memory_budget='24 gigs')),
     r"scaling.memory_budget='24 gigs'"),
    (dict(scaling=dict(total_batch_size=4, memory_budget=-2)),
     r'scaling.memory_budget=-2'),
    (dict(scaling=dict(total_batch_size=4, memory_budget=24, per_gpu_batch_size='auto')),
     "per_gpu_batch_size='auto'"),
    (dict(scaling=dict(total_batch_size=4, memory_budget=24),
          auto_batch_size=dict(margin=0.2)), 'auto_batch_size'),
    (dict(scaling=dict(total_batch_size=4, memory_budget='3MiB'),
          custom_hooks=[dict(type='FastestFitHook', memory_budget='2MiB')]),
     'conflicting memory budget'),
    (dict(custom_hooks=[dict(type='FastestFitHook')]), 'scaling recipe'),
], ids=['twice', 'not-a-dict', 'contradiction', 'fixed-batch', 'unit', 'negative',
        'auto-and-budget', 'both-hooks', 'two-budgets', 'no-recipe'])
def test_conflicts_and_bad_values_name_the_keys(cfg, message):
    with pytest.raises(ValueError, match=message):
        prepared(**cfg)
