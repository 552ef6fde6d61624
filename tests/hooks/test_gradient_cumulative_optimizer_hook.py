"""GradientCumulativeOptimizerHook on a real mmengine Runner with real optimizers.

Equivalence tests compare N micro-batches of b samples with one batch of N*b samples
(the toy model has no BatchNorm and a batch-mean loss, so they must agree in fp32).
"""
import glob
import uuid
import os.path as osp
from typing import Dict, List

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401  (registers the hook, applies the patches)
from mmdet3d_scaling.hooks.gradient_cumulative_optimizer_hook import (
    CHECKPOINT_KEY, AccumulationCheckpointHook, GradientCumulativeOptimizerHook,
    batch_norm_layers)
from tests.toy import toy_runner_cfg  # registers ToyRegressor, ToyBNRegressor

TOL = 1e-5


class Recorder(Hook):
    """Records the LR before and the parameters after every training iteration."""

    priority = 'LOWEST'

    # valid Python: Runner logs the config with yapf
    def __repr__(self):
        return 'Recorder()'

    def __init__(self):
        self.lrs: List[float] = []
        self.params: List[torch.Tensor] = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.lrs.append(runner.optim_wrapper.get_lr()['lr'][0])

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.params.append(torch.cat([p.detach().flatten().clone()
                                      for p in runner.model.parameters()]))


class StopAt(Hook):
    """Stops training after ``iters`` iterations, as an interrupted job would."""

    # valid Python: Runner logs the config with yapf
    def __repr__(self):
        return 'StopAt()'

    def __init__(self, iters: int):
        self.iters = iters

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        if runner.iter + 1 == self.iters:
            runner.train_loop.stop_training = True


def toy_cfg(work_dir, batch_size: int, dataset_len: int, cumulative_iters: int = 1,
            max_iters: int = None, max_epochs: int = None, model='ToyRegressor',
            param_scheduler=None, clip_grad=None, hooks=(), **extra) -> dict:
    cfg = toy_runner_cfg(work_dir, max_iters=max_iters or 1, batch_size=batch_size)
    cfg['model'] = dict(type=model)
    cfg['train_dataloader']['dataset'] = dict(type='ToyDataset', length=dataset_len)
    cfg['default_scope'] = 'mmdet3d'
    cfg['randomness'] = dict(seed=0)  # the same initial weights in every run
    # mmengine names the logger after the experiment (default: a timestamp in
    # seconds); runners created in the same second would share a log file.
    cfg['experiment_name'] = f'acc_{uuid.uuid4().hex}'
    cfg['optim_wrapper'] = dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9),
                                clip_grad=clip_grad)
    if max_epochs:
        cfg['train_cfg'] = dict(by_epoch=True, max_epochs=max_epochs)
        cfg['default_hooks'] = dict(checkpoint=None)
    if param_scheduler is not None:
        cfg['param_scheduler'] = param_scheduler
    custom = [Recorder(), *hooks]
    if cumulative_iters > 1:
        custom.append(dict(type='GradientCumulativeOptimizerHook',
                           cumulative_iters=cumulative_iters))
    cfg['custom_hooks'] = custom
    cfg.update(extra)
    return cfg


def train(cfg: dict) -> Runner:
    runner = Runner.from_cfg(Config(cfg))
    runner.train()
    return runner


def hook_of(runner: Runner, cls: type) -> Hook:
    return next(h for h in runner.hooks if isinstance(h, cls))


def params(runner: Runner) -> Dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in runner.model.named_parameters()}


def max_diff(a: Dict[str, torch.Tensor], b: Dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def changed_at(runner: Runner) -> List[int]:
    """Iterations after which the parameters changed (= optimizer steps)."""
    seen = hook_of(runner, Recorder).params
    return [i for i in range(1, len(seen)) if not torch.equal(seen[i], seen[i - 1])]


@pytest.mark.slow
def test_micro_batches_equal_one_large_batch_iteration_loop(tmp_path):
    schedulers = [
        dict(type='LinearLR', start_factor=0.25, by_epoch=False, begin=0, end=2),
        dict(type='CosineAnnealingLR', by_epoch=False, begin=2, eta_min=0.001)]
    clip = dict(max_norm=0.5)
    micro = train(toy_cfg(tmp_path / 'micro', batch_size=2, dataset_len=32,
                          cumulative_iters=4, max_iters=16,
                          param_scheduler=schedulers, clip_grad=clip))
    large = train(toy_cfg(tmp_path / 'large', batch_size=8, dataset_len=32,
                          max_iters=4, param_scheduler=schedulers, clip_grad=clip))
    assert changed_at(micro) == [3, 7, 11, 15]  # one optimizer step per window
    assert max_diff(params(micro), params(large)) <= TOL
    # the defaulted `end` of the cosine schedule counts the 4 optimizer steps
    assert micro.param_schedulers[1].end == 4


@pytest.mark.slow
def test_epoch_end_partial_window_equals_smaller_last_batch(tmp_path):
    # 20 samples: micro-batches of 2 -> 10 per epoch -> windows 4, 4, 2;
    # batches of 8 -> 8, 8, 4. The last window's loss is divided by 2, not 4.
    schedulers = [
        dict(type='LinearLR', start_factor=0.5, by_epoch=False, begin=0, end=2),
        dict(type='MultiStepLR', by_epoch=True, milestones=[1], gamma=0.1,
             convert_to_iter_based=True)]
    micro = train(toy_cfg(tmp_path / 'micro', batch_size=2, dataset_len=20,
                          cumulative_iters=4, max_epochs=2,
                          param_scheduler=schedulers))
    large = train(toy_cfg(tmp_path / 'large', batch_size=8, dataset_len=20,
                          max_epochs=2, param_scheduler=schedulers))
    assert changed_at(micro) == [3, 7, 9, 13, 17, 19]
    assert max_diff(params(micro), params(large)) <= TOL
    # converted epoch milestone: optimizer step 3 = first step of epoch 2
    assert micro.param_schedulers[1].milestones == {3: 1}
    lrs = hook_of(micro, Recorder).lrs
    assert lrs[10] == pytest.approx(0.01)  # epoch 2 runs at the decayed LR


@pytest.mark.slow
@pytest.mark.parametrize('build', ['from_cfg', 'Runner'])
def test_iteration_schedulers_step_per_optimizer_step(tmp_path, build):
    cfg = toy_cfg(tmp_path, batch_size=2, dataset_len=20, cumulative_iters=4,
                  max_iters=10, param_scheduler=[dict(
                      type='StepLR', by_epoch=False, step_size=1, gamma=0.5)])
    if build == 'from_cfg':
        runner = train(cfg)
    else:  # without the plugin's config preparation: the hook gates the stock hook
        runner = Runner(**cfg)
        runner.train()
    lrs = hook_of(runner, Recorder).lrs
    assert lrs == pytest.approx([0.1] * 4 + [0.05] * 4 + [0.025] * 2)
    assert changed_at(runner) == [3, 7, 9]  # 10 % 4: a last window of 2


@pytest.mark.slow
def test_resume_in_the_middle_of_a_window(tmp_path):
    def cfg(work_dir, **extra):
        return toy_cfg(work_dir, batch_size=2, dataset_len=24, cumulative_iters=4,
                       max_iters=12, param_scheduler=[dict(
                           type='LinearLR', start_factor=0.5, by_epoch=False, end=3)],
                       default_hooks=dict(checkpoint=dict(
                           type='CheckpointHook', interval=6, by_epoch=False)),
                       **extra)

    whole = train(cfg(tmp_path / 'whole'))
    train(cfg(tmp_path / 'cut', hooks=[StopAt(6)]))
    ckpt_path = str(tmp_path / 'cut' / 'iter_6.pth')
    ckpt = torch.load(ckpt_path, weights_only=False)
    assert ckpt[CHECKPOINT_KEY]['micro_steps'] == 2  # iteration 6 = 2 into window 2
    resumed = train(cfg(tmp_path / 'resumed', resume=True, load_from=ckpt_path))
    assert max_diff(params(resumed), params(whole)) <= 1e-6

    # Without the saved gradients the window loses 2 micro-steps: the test can fail.
    del ckpt[CHECKPOINT_KEY]
    torch.save(ckpt, str(tmp_path / 'lost.pth'))
    lost = train(cfg(tmp_path / 'lost', resume=True,
                     load_from=str(tmp_path / 'lost.pth')))
    assert max_diff(params(lost), params(whole)) > 1e-4


@pytest.mark.slow
def test_window_checkpoint_hook_alone_with_accumulative_counts(tmp_path):
    # mmengine's own accumulation (optim_wrapper.accumulative_counts, what the scaling
    # recipe writes) plus AccumulationCheckpointHook: a checkpoint inside a window
    # resumes bit-exactly
    def cfg(work_dir, **extra):
        c = toy_cfg(work_dir, batch_size=2, dataset_len=24, max_iters=12,
                    default_hooks=dict(checkpoint=dict(
                        type='CheckpointHook', interval=6, by_epoch=False)), **extra)
        c['optim_wrapper']['accumulative_counts'] = 4
        c['custom_hooks'].append(dict(type='AccumulationCheckpointHook'))
        return c

    whole = train(cfg(tmp_path / 'whole'))
    train(cfg(tmp_path / 'cut', hooks=[StopAt(6)]))
    ckpt_path = str(tmp_path / 'cut' / 'iter_6.pth')
    assert torch.load(ckpt_path, weights_only=False)[CHECKPOINT_KEY]['micro_steps'] == 2
    resumed = train(cfg(tmp_path / 'resumed', resume=True, load_from=ckpt_path))
    for name, value in params(resumed).items():
        assert torch.equal(value, params(whole)[name]), name
    assert isinstance(hook_of(resumed, AccumulationCheckpointHook), Hook)
    assert issubclass(GradientCumulativeOptimizerHook, AccumulationCheckpointHook)


@pytest.mark.slow
def test_batch_norm_warning_once_naming_layers(tmp_path):
    runner = train(toy_cfg(tmp_path, batch_size=2, dataset_len=8, cumulative_iters=2,
                           max_epochs=2, model='ToyBNRegressor'))
    assert batch_norm_layers(runner.model) == ['bn']  # tests.toy.ToyBNRegressor
    log = ''.join(open(f).read() for f in glob.glob(osp.join(tmp_path, '*', '*.log')))
    assert log.count('GradientCumulativeOptimizerHook: the model has 1 BatchNorm '
                     'layer(s) (bn)') == 1


@pytest.mark.slow
def test_conflicting_accumulative_counts_is_an_error(tmp_path):
    cfg = toy_cfg(tmp_path, batch_size=2, dataset_len=8, cumulative_iters=4,
                  max_iters=4)
    cfg['optim_wrapper']['accumulative_counts'] = 2
    runner = Runner(**cfg)  # no config preparation: the hook itself must refuse
    with pytest.raises(ValueError, match=r'cumulative_iters=4.*accumulative_counts=2'):
        runner.train()


@pytest.mark.parametrize('bad', [0, -1, 2.0, True])
def test_bad_cumulative_iters(bad):
    with pytest.raises(ValueError, match='cumulative_iters'):
        GradientCumulativeOptimizerHook(cumulative_iters=bad)
