"""patches/speed/voxel_centers.py: PV-RCNN's voxel centres without copies from the
host, bit for bit mmdet3d's ``VoxelSetAbstraction.get_voxel_centers``."""
import pytest
import torch
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401
from mmdet3d.registry import MODELS
from mmdet3d_scaling.patches.speed import voxel_centers as patch
from tests.devices import DEVICES, needs_cuda

CONFIG = 'configs/pv_rcnn/pv_rcnn_synthetic_kitti.py'


@pytest.fixture(scope='module')
def encoder():
    from mmdet3d.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    return MODELS.build(Config.fromfile(CONFIG).model.points_encoder)


def _coors(n, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    coors = torch.stack([torch.randint(0, 4, (n,), generator=gen),
                         torch.randint(0, 41, (n,), generator=gen),
                         torch.randint(0, 1600, (n,), generator=gen),
                         torch.randint(0, 1408, (n,), generator=gen)], dim=1)
    return coors.int().to(device)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('scale', [1, 2, 4, 8, 3])
def test_same_centres_as_mmdet3d(encoder, device, scale):
    coors = _coors(500, device)
    ours = patch.get_voxel_centers(encoder, coors, scale)
    theirs = patch.get_voxel_centers.original(encoder, coors, scale)
    assert ours.dtype == theirs.dtype and ours.device == theirs.device
    assert torch.equal(ours, theirs)


def test_swapped_columns_would_fail(encoder):
    coors = _coors(50, 'cpu')
    wrong = coors.clone()
    wrong[:, 1], wrong[:, 3] = coors[:, 3], coors[:, 1]
    assert not torch.equal(patch.get_voxel_centers(encoder, wrong, 1),
                           patch.get_voxel_centers.original(encoder, coors, 1))


def test_bad_coors_is_a_clear_error(encoder):
    with pytest.raises(ValueError, match=r'\(N, 4\)'):
        patch.get_voxel_centers(encoder, torch.zeros(5, 3, dtype=torch.int32), 1)


@needs_cuda
@pytest.mark.cuda
def test_no_wait_for_the_gpu(encoder):
    coors = _coors(500, 'cuda')
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        patch.get_voxel_centers(encoder, coors, 2)
        with pytest.raises(RuntimeError):
            patch.get_voxel_centers.original(encoder, coors, 2)
    finally:
        torch.cuda.set_sync_debug_mode('default')
