"""patches/speed/keypoint_sampling.py: PV-RCNN's keypoints sampled scan by scan on
parallel CUDA streams, the same keypoints as mmdet3d's ``sample_key_points``.

The module under test is a real ``VoxelSetAbstraction`` built from
configs/pv_rcnn/pv_rcnn_synthetic_kitti.py; on the CPU the FPS is point_ops_cpu's twin
and the patch runs upstream's method, on CUDA mmcv's kernel on several streams."""
import pytest
import torch
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401
from mmdet3d.registry import MODELS
from mmdet3d_scaling.patches.speed import keypoint_sampling as patch
from tests.devices import DEVICES

CONFIG = 'configs/pv_rcnn/pv_rcnn_synthetic_kitti.py'


@pytest.fixture(scope='module')
def encoder():
    from mmdet3d.utils import register_all_modules
    register_all_modules(init_default_scope=False)
    cfg = Config.fromfile(CONFIG).model.points_encoder
    cfg.num_keypoints = 64  # the CPU twin is O(N x M) in Python-free torch ops
    return MODELS.build(cfg)


def _scans(counts, device, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # x, y, z, intensity; a few exact duplicates so the FPS meets ties
    scans = []
    for n in counts:
        scan = torch.rand(n, 4, generator=gen) * torch.tensor([70.0, 80.0, 4.0, 1.0])
        scan[n // 2:n // 2 + 3] = scan[0]
        scans.append(scan.to(device))
    return scans


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('counts', [(900, 1500, 700, 1200), (50, 2000), (40, 30, 64)],
                         ids=['four scans', 'one smaller than the keypoints',
                              'all at most the keypoints'])
def test_same_keypoints_as_mmdet3d(encoder, counts, device):
    scans = _scans(counts, device)
    ours = patch.sample_key_points(encoder, scans, None)
    theirs = patch.sample_key_points.original(encoder, scans, None)
    assert ours.shape == (len(counts), encoder.num_keypoints, 3)
    assert ours.device == theirs.device and torch.equal(ours, theirs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_the_scans_are_sampled_on_several_streams(encoder):
    from torch.profiler import ProfilerActivity, profile
    scans = _scans((3000, 3000, 3000, 3000), 'cuda')
    patch.sample_key_points(encoder, scans, None)  # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        patch.sample_key_points(encoder, scans, None)
        torch.cuda.synchronize()
    streams = {e.device_resource_id for e in prof.events()
               if 'furthest_point_sampling' in e.name}
    assert len(streams) >= 2, streams


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')
def test_keypoints_are_ready_on_the_current_stream(encoder):
    """Used at once by a kernel on the current stream: the values are the finished
    ones (the stream waited for every side stream)."""
    scans = _scans((20000, 20000, 20000), 'cuda', seed=3)
    theirs = patch.sample_key_points.original(encoder, scans, None)
    for _ in range(3):
        ours = patch.sample_key_points(encoder, scans, None)
        total = (ours * 1.0).sum(dim=(1, 2))  # queued right behind the sampling
        torch.testing.assert_close(total, theirs.sum(dim=(1, 2)), rtol=0, atol=0)
