"""NonFiniteGuardHook with real Runners, models, data files and processes (CPU).

- NaN in 5 % of the point intensities of a generated KITTI dataset: the demo
  PointPillars config stops at iteration 1 with a non-zero exit, an error naming the
  iteration, the rank and the point files of the batch, and no checkpoint written;
- a step that an AmpOptimWrapper's dynamic loss scaler skips (a real GradScaler with a
  huge scale: the scaled gradients overflow) is not flagged; a NaN loss under the same
  wrapper is;
- without gradient clipping non-finite weights after the step are caught.
"""
import glob
import math
import os
import os.path as osp
import subprocess
import sys

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.registry import DATASETS, HOOKS
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.datasets.synthetic.kitti import write_kitti
from mmdet3d_scaling.datasets.transforms import CheckFiniteInputs
from mmdet3d_scaling.hooks.non_finite_guard_hook import NonFiniteError
from tests.toy import ToyDataset, toy_runner_cfg

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
DEMO_CONFIG = osp.join(REPO, 'configs', 'demo', 'pointpillars_synthetic_kitti_cpu.py')


def _poison_intensities(root: str, share: float = 0.05) -> list:
    """NaN into ``share`` of the intensities of every point file the config reads."""
    files = sorted(glob.glob(osp.join(root, 'training', 'velodyne_reduced', '*.bin')))
    rng = np.random.default_rng(0)
    for path in files:
        points = np.fromfile(path, dtype=np.float32).reshape(-1, 4)
        rows = rng.choice(len(points), max(1, int(share * len(points))), replace=False)
        points[rows, 3] = np.nan
        points.tofile(path)
    return files


@pytest.fixture(scope='module')
def nan_workspace(tmp_path_factory):
    """cwd for the demo config: data/synthetic_kitti with NaN intensities."""
    root = tmp_path_factory.mktemp('nan')
    data = root / 'data' / 'synthetic_kitti'
    write_kitti(str(data), 4, 1, seed=0, progress=False)
    return root, _poison_intensities(str(data))


@pytest.mark.slow
def test_nan_points_stop_the_demo_at_iteration_1(nan_workspace):
    root, files = nan_workspace
    work = str(root / 'work')
    done = subprocess.run(
        [sys.executable, osp.join(REPO, 'tools', 'train.py'), DEMO_CONFIG, '--work-dir',
         work, '--cfg-options', 'train_cfg.max_iters=3', 'train_dataloader.batch_size=2',
         'train_dataloader.num_workers=0', 'train_dataloader.persistent_workers=False',
         'default_hooks.checkpoint.interval=1'],
        cwd=str(root), env=dict(os.environ, PYTHONPATH=REPO), capture_output=True,
        text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert 'NonFiniteGuardHook: non-finite value at iteration 1 (epoch 1) on rank 0: ' \
           'loss=nan' in out, out[-3000:]
    named = [osp.basename(f) for f in files if osp.basename(f) in out]
    assert len(named) == 2, out[-3000:]  # the two point files of the batch
    assert 'lidar_path=' in out and 'sample_idx=' in out
    assert 'no checkpoint was saved before it' in out
    assert not glob.glob(osp.join(work, '*.pth'))  # interval 1: iter_1.pth never written


def test_check_finite_inputs_names_the_file(nan_workspace):
    from mmdet3d.datasets.transforms import LoadPointsFromFile
    _, files = nan_workspace
    results = LoadPointsFromFile(coord_type='LIDAR', load_dim=4, use_dim=4)(
        dict(lidar_points=dict(lidar_path=files[0]), lidar_path=files[0], sample_idx=0))
    with pytest.raises(ValueError) as err:
        CheckFiniteInputs()(results)
    message = str(err.value)
    assert f"lidar_path={files[0]!r}" in message and 'sample_idx=0' in message
    assert 'are NaN or inf (column(s) [3])' in message
    results['points'].tensor[:, 3] = 0.0  # clean: passes through
    assert CheckFiniteInputs()(results) is results


# --------------------------------------------------------------- toy runs (AMP)
@DATASETS.register_module(name='NFPoisoned', force=True)
class NFPoisoned(ToyDataset):
    """ToyDataset with targets 100 larger (losses ~1e4: a scale of 2**127 overflows
    them for sure) whose sample ``bad`` has NaN inputs."""

    def __init__(self, bad: int = -1, **kwargs):
        super().__init__(**kwargs)
        self.y += 100
        if bad >= 0:
            self.x[bad] = float('nan')


@HOOKS.register_module(name='NFHugeLossScale', force=True)
class NFHugeLossScale(Hook):
    """Gives the AmpOptimWrapper a real, enabled GradScaler with a scale that
    overflows every scaled gradient (CPU AMP has loss scaling off otherwise)."""

    priority = 'VERY_HIGH'

    def before_train(self, runner) -> None:
        runner.optim_wrapper.loss_scaler = torch.amp.GradScaler(
            'cpu', init_scale=2.0 ** 127, backoff_factor=0.9)


def _amp_runner(tmp_path, bad: int = -1, clip: bool = True) -> Runner:
    wrapper = dict(type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1),
                   dtype='float32')
    if clip:
        wrapper['clip_grad'] = dict(max_norm=10, norm_type=2)
    cfg = toy_runner_cfg(
        tmp_path, max_iters=3, optim_wrapper=wrapper, default_scope='mmdet3d',
        custom_hooks=[dict(type='NFHugeLossScale'), dict(type='NonFiniteGuardHook')],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1,
                                           by_epoch=False)))
    cfg['train_dataloader']['dataset'] = dict(type='NFPoisoned', bad=bad, length=16)
    return Runner(**cfg)


@pytest.mark.slow
def test_amp_overflow_skips_are_not_flagged(tmp_path):
    runner = _amp_runner(tmp_path)
    before = {k: v.clone() for k, v in runner.model.state_dict().items()}
    runner.train()  # no NonFiniteError
    assert runner.iter == 3
    # the unscaled gradient norm was not finite (overflow), and no error
    assert not math.isfinite(runner.message_hub.get_scalar('train/grad_norm').current())
    for name, value in runner.model.state_dict().items():  # every step was skipped
        assert torch.equal(value, before[name]), name
    assert runner.optim_wrapper.loss_scaler.get_scale() < 2.0 ** 127  # and backed off


@pytest.mark.slow
def test_nan_loss_under_amp_is_flagged(tmp_path):
    runner = _amp_runner(tmp_path, bad=1)  # batch of samples 0 and 1 (no shuffle)
    with pytest.raises(NonFiniteError) as err:
        runner.train()
    assert 'iteration 1 (epoch 1) on rank 0: loss=nan' in str(err.value)
    assert 'the batch has no data_samples metainfo' in str(err.value)  # a toy batch
    assert not glob.glob(str(tmp_path / '*.pth'))


@pytest.mark.slow
def test_non_finite_weights_without_clipping_are_flagged(tmp_path):
    # a finite loss, but an overflowing gradient in plain fp32 SGD: weights turn inf/nan
    cfg = toy_runner_cfg(
        tmp_path, max_iters=4, optim_wrapper=dict(optimizer=dict(type='SGD', lr=1e38)),
        default_scope='mmdet3d',
        custom_hooks=[dict(type='NonFiniteGuardHook', check_loss=False)],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1,
                                           by_epoch=False)))
    runner = Runner(**cfg)
    with pytest.raises(NonFiniteError) as err:
        runner.train()
    assert 'weights after the optimizer step=nan' in str(err.value)
    # stopped at its first bad iteration: the checkpoints before it are there, not it
    bad_iter = int(str(err.value).split('at iteration ')[1].split(' ')[0])
    saved = sorted(glob.glob(str(tmp_path / 'iter_*.pth')))
    assert [osp.basename(p) for p in saved] == [f'iter_{i}.pth' for i in
                                                range(1, bad_iter)]


def test_bad_arguments_are_named():
    from mmdet3d_scaling.hooks import NonFiniteGuardHook
    with pytest.raises(ValueError, match="check_weights must be True, False or 'auto', "
                                         "got 'yes'"):
        NonFiniteGuardHook(check_weights='yes')
    with pytest.raises(TypeError, match='check_loss must be True or False, got 1'):
        NonFiniteGuardHook(check_loss=1)
