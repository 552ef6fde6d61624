"""PV-RCNN, the full model, trains and predicts on a CPU through a real Runner: the
CUDA-only point ops run as the PyTorch twins of mmdet3d_scaling/patches/cpu/point_ops_cpu.py
(configs/pv_rcnn/pv_rcnn_synthetic_kitti_cpu.py on synthetic KITTI-format frames)."""
import math
import os.path as osp

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from tests.auto_batch_size_common import REPO, _retarget, write_dataset

CONFIG = osp.join(REPO, 'configs', 'pv_rcnn', 'pv_rcnn_synthetic_kitti_cpu.py')


@pytest.fixture(scope='module')
def runner(tmp_path_factory):
    root = write_dataset(str(tmp_path_factory.mktemp('pv_kitti') / 'synthetic_kitti'),
                         train_frames=4)
    cfg = Config(_retarget(Config.fromfile(CONFIG).to_dict(), root.rstrip('/') + '/'))
    cfg.work_dir = str(tmp_path_factory.mktemp('pv_work'))
    # one optimizer step of 2 samples as 1 x acc 2: the scaling recipe on a CPU
    cfg.scaling.update(total_batch_size=2, max_per_gpu_batch_size=1)
    cfg.train_cfg.update(max_iters=1, val_interval=10**9)
    cfg.param_scheduler = None
    # ObjectSample's first call compiles numba kernels for ~30 s; the model is the point
    inner = cfg.train_dataloader.dataset.dataset
    inner.pipeline = [t for t in inner.pipeline if t['type'] != 'ObjectSample']
    cfg.default_hooks.logger.interval = 1
    cfg.log_level = 'WARNING'
    return Runner.from_cfg(cfg)


@pytest.mark.slow
def test_trains_on_the_cpu(runner):
    before = {k: v.detach().clone() for k, v in runner.model.named_parameters()}
    runner.train()
    assert runner.iter == 2  # 2 micro-batches = 1 optimizer step (1 x acc 2)
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert math.isfinite(loss) and loss > 0
    changed = [k for k, v in runner.model.named_parameters()
               if not torch.equal(v.detach(), before[k])]
    # the sparse encoder, voxel set abstraction, RPN and RoI head all learned
    for part in ('middle_encoder', 'points_encoder', 'rpn_head', 'roi_head'):
        assert any(k.startswith(part) for k in changed), part


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_predicts_on_the_cpu(runner):
    runner.model.eval()
    batch = next(iter(runner.build_dataloader(runner.cfg.val_dataloader)))
    with torch.no_grad():
        out = runner.model.val_step(batch)
    assert len(out) == len(batch['data_samples'])
    pred = out[0].pred_instances_3d
    assert pred.bboxes_3d.tensor.shape[-1] == 7
    assert len(pred.scores_3d) == len(pred.labels_3d) == len(pred.bboxes_3d)
