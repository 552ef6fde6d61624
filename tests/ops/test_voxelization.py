"""ops/voxelization.py: the sort gives mmcv's voxelization tensor for tensor."""
import numpy as np
import pytest
import torch
from mmcv.ops.voxelize import _Voxelization

from mmdet3d_scaling.datasets.synthetic import KITTI_CLASSES, SensorModel, sample_scene
from mmdet3d_scaling.ops import (dynamic_voxelize, grid_shape, hard_voxelize,
                                 hard_voxelize_batch)

# mmcv's autograd Function itself: the speed patch rebinds the module's ``voxelization``
# name, never this, so the reference stays upstream's op whatever is applied
MMCV = _Voxelization.apply

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
BEVFUSION = dict(voxel_size=[0.075, 0.075, 0.2], point_cloud_range=[-54, -54, -5, 54, 54, 3])
SECOND = dict(voxel_size=[0.05, 0.05, 0.1], point_cloud_range=[0, -40, -3, 70.4, 40, 1])
PILLARS = dict(voxel_size=[0.16, 0.16, 4], point_cloud_range=[0, -39.68, -3, 69.12, 39.68, 1])
SMALL = dict(voxel_size=[0.5, 0.25, 1.0], point_cloud_range=[-2, -1.5, -2, 2, 1.5, 2.5])


def _same(got, ref):
    names = ('voxels', 'coors', 'num_points')
    for name, a, b in zip(names, got, ref):
        assert a.dtype == b.dtype and a.device == b.device, name
        assert a.shape == b.shape, (name, a.shape, b.shape)
        assert torch.equal(a, b), name


def _check(points, geometry, max_points, max_voxels):
    """Ours equals mmcv's deterministic op; returns mmcv's voxel count."""
    ref = MMCV(points, geometry['voxel_size'], geometry['point_cloud_range'], max_points,
               max_voxels, True)
    got = hard_voxelize(points, geometry['voxel_size'], geometry['point_cloud_range'],
                        max_points, max_voxels)
    _same(got, ref)
    return len(ref[0])


def _clustered(seed, n, channels=5, spread=3.0):
    """Points in tight clusters (voxels overflow) plus a uniform background, some out
    of range, some on voxel boundaries exactly."""
    gen = torch.Generator().manual_seed(seed)
    centres = (torch.rand(n // 40 + 1, 3, generator=gen) * 2 - 1) * spread
    pts = centres.repeat_interleave(40, 0)[:n] + torch.randn(n, 3, generator=gen) * 0.05
    pts[::3] = (torch.rand(len(pts[::3]), 3, generator=gen) * 2 - 1) * spread
    pts[::7] = torch.round(pts[::7] * 4) / 4  # multiples of 0.25: on voxel boundaries
    feats = torch.rand(n, channels - 3, generator=gen)
    return torch.cat([pts, feats], 1)[torch.randperm(n, generator=gen)].contiguous()


@pytest.mark.parametrize('seed', range(6))
@pytest.mark.parametrize('max_points,max_voxels', [(1, 1000), (3, 1000), (5, 40),
                                                   (35, 20000), (4, 0)])
def test_random_points_equal_mmcv(seed, max_points, max_voxels):
    points = _clustered(seed, 600)
    _check(points, SMALL, max_points, max_voxels)


def test_overflow_of_points_and_voxels_is_exercised():
    points = _clustered(0, 2000)
    ref = MMCV(points, SMALL['voxel_size'], SMALL['point_cloud_range'], 3, 50, True)
    assert len(ref[0]) == 50 and ref[2].max() == 3  # both limits bite
    _check(points, SMALL, 3, 50)


@pytest.mark.parametrize('channels', [3, 4, 7])
def test_feature_channels(channels):
    _check(_clustered(1, 500, channels), SMALL, 4, 200)


def test_points_exactly_on_boundaries_and_one_ulp_off():
    """Points at min + k * size and the float32 neighbours on either side, for every
    voxel boundary of every axis, the range's own ends included."""
    size = torch.tensor(BEVFUSION['voxel_size'])
    low = torch.tensor(BEVFUSION['point_cloud_range'][:3], dtype=torch.float32)
    grid = torch.tensor(grid_shape(**BEVFUSION))
    rows = []
    for axis in range(3):
        k = torch.arange(-1, int(grid[axis]) + 2, dtype=torch.float32)
        on = low[axis] + k * size[axis]
        for value in (on, torch.nextafter(on, on - 1), torch.nextafter(on, on + 1)):
            pts = torch.full((len(value), 3), 0.01)
            pts[:, axis] = value
            rows.append(pts)
    xyz = torch.cat(rows)
    points = torch.cat([xyz, torch.rand(len(xyz), 2)], 1)
    assert _check(points, BEVFUSION, 10, 100000) > 0
    _check(points.flip(0).contiguous(), BEVFUSION, 2, 100000)


def test_negative_coordinates_and_out_of_range():
    geometry = dict(voxel_size=[0.3, 0.7, 0.45], point_cloud_range=[-7.1, -3.3, -9.0,
                                                                     -1.2, 2.9, -0.5])
    gen = torch.Generator().manual_seed(3)
    points = torch.rand(3000, 4, generator=gen) * 16 - 10  # many outside every side
    assert _check(points, geometry, 4, 5000) > 0


def test_no_point_in_range_and_empty_input():
    far = torch.full((20, 4), 100.0)
    _check(far, SMALL, 5, 100)
    empty = torch.zeros((0, 4))
    got = hard_voxelize(empty, SMALL['voxel_size'], SMALL['point_cloud_range'], 5, 100)
    assert [tuple(t.shape) for t in got] == [(0, 5, 4), (0, 3), (0,)]
    assert [t.dtype for t in got] == [torch.float32, torch.int32, torch.int32]
    _same(got, MMCV(empty, SMALL['voxel_size'], SMALL['point_cloud_range'], 5, 100, True))


@pytest.mark.parametrize('dtype', [torch.float64, torch.float16])
def test_other_float_dtypes_on_the_cpu(dtype):
    points = _clustered(2, 800).to(dtype)
    _check(points, SMALL, 3, 300)


@pytest.mark.parametrize('seed', range(2))
@pytest.mark.parametrize('geometry,max_points,max_voxels', [
    (PILLARS, 32, 16000), (SECOND, 5, 16000), (SECOND, 5, 2000), (BEVFUSION, 10, 120000)])
def test_synthetic_scans(seed, geometry, max_points, max_voxels):
    scene = sample_scene(np.random.default_rng(seed), KITTI_CLASSES, n_objects=12,
                         sensor=SensorModel(density=3000))
    points = torch.from_numpy(scene.points).float()
    assert len(points) > 5000
    _check(points, geometry, max_points, max_voxels)


def test_dynamic_voxelization_equals_mmcv():
    points = _clustered(4, 1500)
    for geometry in (SMALL, BEVFUSION):
        ref = MMCV(points, geometry['voxel_size'], geometry['point_cloud_range'], -1,
                   20000, True)
        got = dynamic_voxelize(points, **geometry)
        assert got.dtype == ref.dtype and torch.equal(got, ref)
        assert (got == -1).all(1).any()  # out-of-range rows are there


def test_batch_equals_each_sample_with_its_index():
    samples = [_clustered(s, n) for s, n in ((0, 700), (1, 0), (2, 1200), (3, 50))]
    voxels, coors, num = hard_voxelize_batch(samples, **SMALL, max_num_points=3,
                                             max_voxels=60)
    refs = [MMCV(p, SMALL['voxel_size'], SMALL['point_cloud_range'], 3, 60, True)
            for p in samples]
    assert torch.equal(voxels, torch.cat([r[0] for r in refs]))
    assert torch.equal(num, torch.cat([r[2] for r in refs]))
    batch = torch.cat([torch.full((len(r[1]), 1), i, dtype=torch.int32)
                       for i, r in enumerate(refs)])
    assert torch.equal(coors, torch.cat([batch, torch.cat([r[1] for r in refs])], 1))
    assert sum(len(r[0]) == 60 for r in refs) >= 2  # max_voxels applies per sample


def test_bad_input_names_the_value():
    points = _clustered(0, 10)
    with pytest.raises(ValueError, match='max_num_points=0'):
        hard_voxelize(points, **SMALL, max_num_points=0, max_voxels=10)
    with pytest.raises(ValueError, match='max_voxels=-1'):
        hard_voxelize(points, **SMALL, max_num_points=5, max_voxels=-1)
    with pytest.raises(ValueError, match=r'points of shape \(10, 2\)'):
        hard_voxelize(points[:, :2], **SMALL, max_num_points=5, max_voxels=10)
    with pytest.raises(TypeError, match='torch.int64'):
        hard_voxelize(points.long(), **SMALL, max_num_points=5, max_voxels=10)
    with pytest.raises(ValueError, match=r'voxel_size=\[0.5, 0.5\]'):
        hard_voxelize(points, [0.5, 0.5], SMALL['point_cloud_range'], 5, 10)
    with pytest.raises(ValueError, match='grid of'):
        hard_voxelize(points, [1, 1, 1], [0, 0, 0, 0.2, 1, 1], 5, 10)
    with pytest.raises(ValueError, match='differ'):
        hard_voxelize_batch([points, points.double()], **SMALL, max_num_points=5,
                            max_voxels=10)
    with pytest.raises(ValueError, match='no samples'):
        hard_voxelize_batch([], **SMALL, max_num_points=5, max_voxels=10)


# ------------------------------------------------------------------------------ CUDA
@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize('seed', range(3))
@pytest.mark.parametrize('max_points,max_voxels', [(1, 1000), (3, 50), (35, 20000)])
def test_cuda_equals_mmcv_cuda(seed, max_points, max_voxels):
    _check(_clustered(seed, 3000).cuda(), SMALL, max_points, max_voxels)


@pytest.mark.cuda
@needs_cuda
def test_cuda_bevfusion_scan_boundaries_and_batch():
    scene = sample_scene(np.random.default_rng(0), KITTI_CLASSES, n_objects=12)
    points = torch.from_numpy(scene.points).float().cuda()
    _check(points, BEVFUSION, 10, 120000)
    _check(points, SECOND, 5, 2000)
    lattice = torch.arange(-54.0, 54.0, 0.075)[:, None].repeat(1, 4)
    lattice[:, 2] = 0.0
    _check(lattice.cuda(), BEVFUSION, 10, 120000)
    cpu = hard_voxelize_batch([points.cpu(), points.cpu().flip(0)], **BEVFUSION,
                              max_num_points=10, max_voxels=120000)
    gpu = hard_voxelize_batch([points, points.flip(0)], **BEVFUSION, max_num_points=10,
                              max_voxels=120000)
    for a, b in zip(cpu, gpu):
        assert torch.equal(a, b.cpu())


@pytest.mark.cuda
@needs_cuda
def test_cuda_dynamic_keeps_mmcvs_partial_rows():
    points = (torch.rand(4000, 4) * 8 - 4).cuda()  # out of SMALL's range on each axis
    ref = MMCV(points, SMALL['voxel_size'], SMALL['point_cloud_range'], -1, 20000, True)
    got = dynamic_voxelize(points, **SMALL)
    assert torch.equal(got, ref)
    assert (got[:, 0] == -1).any() and (got[:, 2] == 0).logical_and(got[:, 0] == -1).any()


def test_one_host_read_a_call():
    """The voxel count, which sizes the outputs (mmcv reads it too); a batch also."""
    from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
    points = _clustered(0, 500)
    with HostReadCensus() as census:
        hard_voxelize(points, **SMALL, max_num_points=3, max_voxels=50)
    assert census.total == 1
    with HostReadCensus() as census:
        hard_voxelize_batch([points, points[:100]], **SMALL, max_num_points=3,
                            max_voxels=50)
    assert census.total == 1


def test_runs_under_deterministic_algorithms():
    """No atomics: torch.use_deterministic_algorithms(True) (mmengine's
    ``randomness.deterministic``) does not refuse the op, on the CPU or CUDA."""
    devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        for device in devices:
            points = _clustered(5, 800).to(device)
            _check(points, SMALL, 3, 100)
            hard_voxelize_batch([points, points[:300]], **SMALL, max_num_points=3,
                                max_voxels=100)
    finally:
        torch.use_deterministic_algorithms(before)
