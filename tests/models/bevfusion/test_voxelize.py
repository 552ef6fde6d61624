"""models/bevfusion/voxelize.py: the batched sort gives what mmcv's op gave per sample."""
import pytest
import torch

from mmdet3d_scaling.models.bevfusion.voxelize import BEVFusionVoxelizer

from .common import PCR, VOXEL, toy_batch

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


def _pair(reduce: bool, max_voxels=(20000, 30000)):
    kw = dict(voxel_size=VOXEL, point_cloud_range=PCR, max_num_points=3,
              max_voxels=max_voxels, voxelize_reduce=reduce)
    return (BEVFusionVoxelizer(**kw),
            BEVFusionVoxelizer(**kw, implementation='mmcv'))


def _same(a, b):
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)


@pytest.mark.parametrize('reduce', [True, False])
@pytest.mark.parametrize('training', [True, False])
def test_sort_equals_mmcv_per_sample(reduce, training):
    points = toy_batch(seed=3, batch_size=3)['inputs']['points']
    points.append(points[0].flip(0).contiguous())  # same voxels, another order
    ours, mmcv = _pair(reduce, max_voxels=(400, 900))
    ours.train(training)
    mmcv.train(training)
    got, ref = ours(points), mmcv(points)
    _same(got, ref)
    limit = 400 if training else 900
    counts = torch.bincount(got[1][:, 0].long())
    assert (counts <= limit).all() and (counts == limit).any()  # the limit is reached


def test_empty_sample_in_batch():
    points = toy_batch(seed=1)['inputs']['points']
    points.insert(1, points[0][:0])
    ours, mmcv = _pair(True)
    _same(ours(points), mmcv(points))


def test_nondeterministic_and_bad_implementation():
    assert BEVFusionVoxelizer(VOXEL, PCR, 10, deterministic=False).implementation == 'mmcv'
    with pytest.raises(ValueError, match="implementation='cuda'"):
        BEVFusionVoxelizer(VOXEL, PCR, 10, implementation='cuda')


@pytest.mark.cuda
@needs_cuda
def test_sort_on_cuda_equals_mmcv_on_cuda():
    points = [p.cuda() for p in toy_batch(seed=5, batch_size=3)['inputs']['points']]
    ours, mmcv = _pair(False)
    _same(ours(points), mmcv(points))
