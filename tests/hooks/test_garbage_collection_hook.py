"""GarbageCollectionHook on a real mmengine Runner: freeze, manual collections at fixed
iterations, automatic collection during validation, the collector restored after."""
import gc
from typing import List, Tuple

import pytest
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401  (registers the hook)
from mmdet3d.registry import HOOKS
from mmdet3d_scaling.hooks.garbage_collection_hook import GarbageCollectionHook
from tests.toy import toy_runner_cfg


class GCWatch(Hook):
    """Records, per training iteration, the collector's state and which generations
    were collected while the iteration (hooks included) ran."""

    priority = 'HIGHEST'  # before_train_iter first, so the iteration's own work is seen

    def __repr__(self):  # valid Python: Runner logs the config with yapf
        return 'GCWatch()'

    def __init__(self):
        self.iters: List[Tuple[int, bool, int]] = []  # (iter, enabled, frozen objects)
        self.collected: List[Tuple[int, int]] = []  # (iter, generation)
        self.val_enabled: List[bool] = []
        self._iter = -1

    def _callback(self, phase, info):
        if phase == 'start':
            self.collected.append((self._iter, info['generation']))

    def before_train(self, runner):
        gc.callbacks.append(self._callback)

    def after_train(self, runner):
        gc.callbacks.remove(self._callback)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._iter = runner.iter
        self.iters.append((runner.iter, gc.isenabled(), gc.get_freeze_count()))

    def after_val_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.val_enabled.append(gc.isenabled())


def _train(tmp_path, hook, max_iters=9, **overrides):
    watch = GCWatch()
    runner = Runner(**toy_runner_cfg(tmp_path, max_iters=max_iters,
                                     custom_hooks=[hook, watch], **overrides))
    runner.train()
    return watch


@pytest.fixture(autouse=True)
def _clean_collector():
    enabled = gc.isenabled()
    gc.enable()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


@pytest.mark.slow
def test_freeze_during_training_and_restore_after(tmp_path):
    assert gc.get_freeze_count() == 0
    hook = GarbageCollectionHook()
    watch = _train(tmp_path, hook)
    assert hook.frozen_objects > 1000  # torch, mmengine, the runner: a real heap
    # stays frozen while training (objects that die leave the permanent generation)
    assert all(frozen > 0.9 * hook.frozen_objects for _, _, frozen in watch.iters)
    assert all(enabled for _, enabled, _ in watch.iters)  # automatic mode kept
    assert gc.get_freeze_count() == 0 and gc.isenabled()


@pytest.mark.slow
def test_manual_collections_at_fixed_iterations_only(tmp_path):
    hook = GarbageCollectionHook(freeze=False, collect_interval=3)
    watch = _train(tmp_path, hook, max_iters=9)
    assert [enabled for _, enabled, _ in watch.iters] == [False] * 9
    # full collections in iterations 2, 5, 8 (after every 3rd) and none in between
    assert watch.collected == [(2, 2), (5, 2), (8, 2)]
    assert hook.collections == 3
    assert gc.isenabled()


@pytest.mark.slow
def test_automatic_collection_during_validation(tmp_path):
    hook = GarbageCollectionHook(collect_interval=2)
    cfg = toy_runner_cfg(tmp_path, max_iters=4)
    val = dict(val_dataloader=cfg['train_dataloader'],
               val_evaluator=dict(type='ToyMetric'), val_cfg=dict())
    cfg['train_cfg'] = dict(by_epoch=False, max_iters=4, val_interval=2)
    _register_toy_metric()
    watch = GCWatch()
    cfg.update(val, custom_hooks=[hook, watch])
    Runner(**cfg).train()
    assert watch.val_enabled and all(watch.val_enabled)
    assert [enabled for _, enabled, _ in watch.iters] == [False] * 4
    assert gc.isenabled()


@pytest.mark.slow
def test_collector_left_disabled_if_it_was(tmp_path):
    gc.disable()
    _train(tmp_path, GarbageCollectionHook(collect_interval=2), max_iters=2)
    assert not gc.isenabled()


def test_built_from_config_registry():
    hook = HOOKS.build(dict(type='mmdet3d.GarbageCollectionHook', collect_interval=50))
    assert isinstance(hook, GarbageCollectionHook) and hook.collect_interval == 50


@pytest.mark.parametrize('bad', [0, -5, 2.5, True, '10'])
def test_bad_interval_names_the_value(bad):
    with pytest.raises(ValueError, match='collect_interval') as err:
        GarbageCollectionHook(collect_interval=bad)
    assert str(err.value).endswith(f'got {bad!r}')


def _register_toy_metric():
    from mmengine.evaluator import BaseMetric
    from mmengine.registry import METRICS

    @METRICS.register_module(name='ToyMetric', force=True)
    class ToyMetric(BaseMetric):
        def process(self, data_batch, data_samples):
            self.results.append(0.0)

        def compute_metrics(self, results):
            return dict(toy=0.0)
