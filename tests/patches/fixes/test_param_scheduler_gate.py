"""param_scheduler_gate: the stock ParamSchedulerHook is upstream's in every runner whose
accumulation hook does not ask for the gate (here: mmengine's own accumulation through
``optim_wrapper.accumulative_counts``, no plugin hook). The gated case is tested with the
hook (tests/hooks/test_gradient_cumulative_optimizer_hook.py)."""
from typing import List

import pytest
from mmengine.hooks import Hook, ParamSchedulerHook
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.fixes import param_scheduler_gate
from tests.patches.reverting import reverted
from tests.toy import toy_runner_cfg


class LRs(Hook):
    priority = 'LOWEST'  # after the scheduler hook

    def __init__(self) -> None:
        self.lrs: List[float] = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.lrs.append(runner.optim_wrapper.get_lr()['lr'][0])


def _lrs(work_dir) -> List[float]:
    cfg = toy_runner_cfg(work_dir, max_iters=6, param_scheduler=[dict(
        type='StepLR', by_epoch=False, step_size=1, gamma=0.5)])
    cfg['optim_wrapper'] = dict(optimizer=dict(type='SGD', lr=0.1), accumulative_counts=2)
    runner = Runner(**cfg)
    recorder = LRs()
    runner.register_hook(recorder)
    runner.train()
    assert not param_scheduler_gate.gated(runner)
    return recorder.lrs


@pytest.mark.slow
def test_without_the_asking_hook_the_stock_hook_is_upstreams(tmp_path):
    assert 'param_scheduler_gate' in patching.applied()
    assert ParamSchedulerHook.after_train_iter is not (
        ParamSchedulerHook.after_train_iter.original)
    patched = _lrs(tmp_path / 'patched')
    with reverted(['param_scheduler_gate']):
        upstream = _lrs(tmp_path / 'upstream')
    assert patched == upstream
    # upstream's behaviour: one scheduler step per micro-step, windows of 2 or not
    assert patched[:5] == pytest.approx([0.1 * 0.5 ** i for i in range(1, 6)])
