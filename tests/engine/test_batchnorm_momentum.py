"""scaling.bn_momentum: BatchNorm running statistics per optimizer step under
accumulation, on real ScalingRunners (a toy model for exact arithmetic, the demo
PointPillars for a real mmdet3d model)."""
import os
import uuid

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.config.scaling_plan import make_plan
from mmdet3d_scaling.engine import batchnorm_momentum as bn
from tests.toy import toy_runner_cfg

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MOMENTUM = 0.1


def _runner(tmp_path, per_gpu: int, mode=None, steps: int = 1):
    scaling = dict(total_batch_size=4, per_gpu_batch_size=per_gpu,
                   max_per_gpu_batch_size=per_gpu)
    if mode is not None:
        scaling['bn_momentum'] = mode
    cfg = Config(toy_runner_cfg(
        tmp_path / f'b{per_gpu}_{mode}', max_iters=steps, runner_type='ScalingRunner',
        model=dict(type='ToyBNRegressor', momentum=MOMENTUM), scaling=scaling,
        default_scope='mmdet3d', log_level='INFO',
        # a logger of its own: runners built in the same second would share one
        experiment_name=f'bn_momentum_{uuid.uuid4().hex}'))
    cfg.train_dataloader.dataset = dict(type='ToyDataset', length=8, same_inputs=True)
    return RUNNERS.build(cfg)


def _bn_layer(runner):
    return runner.model.bn


def test_conversion_arithmetic():
    for m in (0.01, 0.1, 0.5):
        for k in (1, 2, 4, 8):
            assert (1 - bn.per_forward_momentum(m, k)) ** k == pytest.approx(1 - m)
    assert bn.per_forward_momentum(0.1, 1) == pytest.approx(0.1)
    with pytest.raises(ValueError, match='accumulation must be >= 1, got 0'):
        bn.per_forward_momentum(0.1, 0)


@pytest.mark.slow
def test_accumulation_ends_a_step_with_the_statistics_of_no_accumulation(tmp_path):
    """One optimizer step of 4 samples (all equal): batch 4 updates the running mean once
    with m; batch 2 x accumulation 2 updates it twice: with 'per_step' (default) it ends
    where batch 4 ends, with 'per_forward' it has moved further (1 - (1 - m)^2)."""
    x = None
    ends = {}
    for per_gpu, mode in ((4, None), (2, None), (2, 'per_forward')):
        runner = _runner(tmp_path, per_gpu, mode)
        runner.train()
        layer = _bn_layer(runner)
        x = runner.train_dataloader.dataset.x[0]
        ends[(per_gpu, mode)] = layer.running_mean.clone()
        assert int(layer.num_batches_tracked) == 4 // per_gpu
    torch.testing.assert_close(ends[(4, None)], MOMENTUM * x)
    torch.testing.assert_close(ends[(2, None)], ends[(4, None)], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ends[(2, 'per_forward')], (1 - (1 - MOMENTUM) ** 2) * x)


def test_the_conversion_is_logged_and_follows_a_new_plan(tmp_path):
    runner = _runner(tmp_path, 1)  # accumulation 4
    layer = _bn_layer(runner)
    assert layer.momentum == pytest.approx(bn.per_forward_momentum(MOMENTUM, 4))
    log = open(runner.log_dir + f'/{runner.timestamp}.log').read()
    assert "scaling.bn_momentum='per_step': 1 BatchNorm layer(s)" in log
    assert '0.1 -> 0.0259' in log
    # a plan chosen at run time (auto batch size) converts from the per-step value again
    runner.train_loop  # noqa: B018  (builds the loop and the optimizer wrapper)
    runner.optim_wrapper = runner.build_optim_wrapper(runner.optim_wrapper)
    runner.apply_plan(make_plan(4, 1, per_gpu_batch=2), 'test')
    assert layer.momentum == pytest.approx(bn.per_forward_momentum(MOMENTUM, 2))
    runner.apply_plan(make_plan(4, 1, per_gpu_batch=4), 'test')
    assert layer.momentum == pytest.approx(MOMENTUM)


def test_per_forward_and_configs_without_scaling_keep_the_momentum(tmp_path):
    assert _bn_layer(_runner(tmp_path, 1, 'per_forward')).momentum == MOMENTUM
    cfg = Config(toy_runner_cfg(tmp_path / 'plain', runner_type='ScalingRunner',
                                model=dict(type='ToyBNRegressor', momentum=MOMENTUM),
                                optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1),
                                                   accumulative_counts=4)))
    assert RUNNERS.build(cfg).model.bn.momentum == MOMENTUM


def test_a_bad_mode_names_the_value(tmp_path):
    with pytest.raises(ValueError, match=r"scaling.bn_momentum='per_iter' is not one of "
                                         r'per_step, per_forward'):
        _runner(tmp_path, 1, 'per_iter')


def test_every_batchnorm_of_the_demo_pointpillars_is_converted(tmp_path):
    """A real mmdet3d model: all 1-D and 2-D BN layers (momentum 0.01) of PointPillars'
    voxel encoder, backbone and neck get the per-forward value for accumulation 4."""
    cfg = Config.fromfile(os.path.join(ROOT, 'configs/demo/pointpillars_synthetic_kitti_cpu.py'))
    cfg.work_dir = str(tmp_path / 'pp')
    cfg.scaling = dict(total_batch_size=4, per_gpu_batch_size=1, max_per_gpu_batch_size=1)
    runner = RUNNERS.build(cfg)
    layers = dict(bn.batchnorm_layers(runner.model))
    kinds = {type(layer).__name__ for layer in layers.values()}
    assert {'BatchNorm1d', 'BatchNorm2d'} <= kinds
    assert any(n.startswith('voxel_encoder') for n in layers)
    assert any(n.startswith('neck') for n in layers)
    want = bn.per_forward_momentum(0.01, 4)
    assert all(layer.momentum == pytest.approx(want) for layer in layers.values())
