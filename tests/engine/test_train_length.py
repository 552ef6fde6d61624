"""engine/train_length.py with a real Runner and its real loops."""
import uuid

import pytest
from mmengine.hooks import Hook
from mmengine.runner import Runner

from mmdet3d_scaling.engine.train_length import set_max_iters, train_for
from tests.toy import toy_runner_cfg


class _TrainFor(Hook):
    priority = 'LOWEST'

    def __init__(self, iters: int) -> None:
        self.iters = iters
        self.seen = []

    def before_train(self, runner) -> None:
        train_for(runner, self.iters)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.seen.append(runner.optim_wrapper.should_update())


def _runner(tmp_path, **cfg) -> Runner:
    name = f'length_{uuid.uuid4().hex[:8]}'
    return Runner(**toy_runner_cfg(tmp_path, experiment_name=name, **cfg))


@pytest.mark.slow
@pytest.mark.parametrize('iters', [3, 7])
def test_train_for_sets_the_run_length_and_the_last_window(tmp_path, iters):
    # windows of 2 over 7 micro-batches: the last one is a partial window of 1
    runner = _runner(tmp_path, max_iters=4, optim_wrapper=dict(
        optimizer=dict(type='SGD', lr=0.1), accumulative_counts=2))
    hook = _TrainFor(iters)
    runner.register_hook(hook)
    runner.train()
    assert runner.iter == iters
    assert hook.seen == [i % 2 == 1 or i == iters - 1 for i in range(iters)]


def test_set_max_iters_on_an_epoch_loop_and_a_wrong_loop(tmp_path):
    runner = _runner(tmp_path, train_cfg=dict(by_epoch=True, max_epochs=2))
    loop = runner.train_loop  # built here
    set_max_iters(loop, 5)
    assert loop.max_iters == 5
    with pytest.raises(TypeError, match='not dict'):
        set_max_iters({}, 5)
