"""Configs that copy batches to the GPU without blocking the host: they pin the training
loader's memory (without it a non-blocking copy still waits) and deliver the batch the
blocking copy delivers (CUDA case: run on a GPU machine)."""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401

from ..patches.speed.test_voxelization_layer import _batch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
ASYNC = [
    'configs/pv_rcnn/pv_rcnn_80e_kitti-3d-3class.py',
    'configs/pv_rcnn/pv_rcnn_1xb2-acc8-80e_kitti-3d-3class.py',
    'configs/pv_rcnn/pv_rcnn_synthetic_kitti.py',
    'configs/bevfusion/bevfusion_lidar_voxel0075_second_secfpn_cyclic-20e_nus-3d.py',
    'configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py',
]
DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


@pytest.mark.parametrize('config', ASYNC)
def test_async_copies_come_with_pinned_loader_memory(config):
    cfg = Config.fromfile(osp.join(REPO, config))
    assert cfg.model.data_preprocessor.get('non_blocking') is True, config
    assert cfg.train_dataloader.get('pin_memory') is True, config


def _preprocessor(config: str, non_blocking: bool, device: str):
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules
    register_all_modules()
    cfg = Config.fromfile(osp.join(REPO, config)).model.data_preprocessor
    cfg.non_blocking = non_blocking
    return MODELS.build(cfg).to(device)


def _with_targets(batch: dict, pin: bool) -> dict:
    """The voxelization tests' two scans, with boxes and labels, pinned when asked."""
    from mmdet3d.structures import LiDARInstance3DBoxes
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(0)
    for sample in batch['data_samples']:
        gt = InstanceData()
        gt.bboxes_3d = LiDARInstance3DBoxes(torch.rand(5, 7, generator=gen) * 10)
        gt.labels_3d = torch.randint(0, 3, (5,), generator=gen)
        sample.gt_instances_3d = gt
    if pin:
        batch['inputs']['points'] = [p.pin_memory() for p in batch['inputs']['points']]
    return batch


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
@pytest.mark.parametrize('device', DEVICES)
def test_non_blocking_copy_delivers_the_blocking_copys_batch(device):
    config = 'configs/pv_rcnn/pv_rcnn_synthetic_kitti.py'
    outs = []
    for non_blocking in (False, True):
        batch = _with_targets(_batch(4), pin=device == 'cuda')
        out = _preprocessor(config, non_blocking, device)(batch, training=True)
        outs.append(out)
    ref, got = outs
    assert ref['inputs'].keys() == got['inputs'].keys()
    for a, b in zip(ref['inputs']['points'], got['inputs']['points']):
        assert b.device.type == device and torch.equal(a, b)
    for key, value in ref['inputs']['voxels'].items():
        assert torch.equal(value, got['inputs']['voxels'][key]), key
    for a, b in zip(ref['data_samples'], got['data_samples']):
        assert torch.equal(a.gt_instances_3d.bboxes_3d.tensor, b.gt_instances_3d.bboxes_3d.tensor)
        assert torch.equal(a.gt_instances_3d.labels_3d, b.gt_instances_3d.labels_3d)
