"""patches/speed/voxelize_batch.py: one sort per batch, the same voxel dict as the loop.

The package's conftest applies the ``speed`` set; the reference runs revert this patch
(and, separately, both voxelization patches: mmcv's own op in mmdet3d's own loop).
"""
import pytest
import torch

from mmdet3d_scaling.patches.speed import voxelize_batch as patch

from ..reverting import reverted
from .test_voxelization_layer import CONFIGS, DYNAMIC, _batch, _preprocessor, _same, _voxelize


@pytest.fixture
def batch_calls(monkeypatch):
    calls = []
    real = patch.hard_voxelize_batch

    def counting(points, *args, **kwargs):
        calls.append(len(points))
        return real(points, *args, **kwargs)

    monkeypatch.setattr(patch, 'hard_voxelize_batch', counting)
    return calls


DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('config', CONFIGS)
@pytest.mark.parametrize('limits', ['config', 'tight'])
def test_one_sort_gives_the_loops_voxels(config, limits, device, batch_calls):
    preprocessor = _preprocessor(config).to(device)  # the batch follows it there
    layer = preprocessor.voxel_layer
    if limits == 'tight':
        layer.max_voxels, layer.max_num_points = (1000, 1500), 2
    batch = _batch(5 if 'nus' in config else 4)
    for training in (True, False):
        with reverted(['voxelize_batch', 'voxelization_layer']):  # all mmdet3d + mmcv
            ref = _voxelize(preprocessor, batch, training)
        with reverted(['voxelize_batch']):  # the loop over the sorted op
            loop = _voxelize(preprocessor, batch, training)
        calls = len(batch_calls)
        got = _voxelize(preprocessor, batch, training)
        assert batch_calls[calls:] == [2]
        assert list(got) == list(ref)  # same keys, same order
        _same(got, ref)
        _same(loop, ref)
        assert got['voxels'].device.type == device
    assert len(ref['voxels']) > 1000 and ref['coors'][:, 0].unique().tolist() == [0, 1]


def test_an_empty_sample_keeps_its_place(batch_calls):
    preprocessor = _preprocessor(CONFIGS[0])
    batch = _batch(4)
    points = batch['inputs']['points']
    batch['inputs']['points'] = [points[0][:0], points[1], points[0][:0]]
    batch['data_samples'] = batch['data_samples'] + batch['data_samples'][:1]
    with reverted(['voxelize_batch']):
        ref = _voxelize(preprocessor, batch, True)
    got = _voxelize(preprocessor, batch, True)
    assert batch_calls == [3]
    _same(got, ref)
    assert ref['coors'][:, 0].unique().tolist() == [1]


def test_what_the_sort_does_not_take_runs_the_original(batch_calls):
    dynamic = _preprocessor(DYNAMIC)
    batch = _batch(4)
    with reverted(['voxelize_batch']):
        ref = _voxelize(dynamic, batch, True)
    _same(_voxelize(dynamic, batch, True), ref)

    hard = _preprocessor(CONFIGS[0])
    mixed = _batch(4)
    mixed['inputs']['points'][1] = mixed['inputs']['points'][1].double()
    with reverted(['voxelize_batch']):
        ref = _voxelize(hard, mixed, True)
    _same(_voxelize(hard, mixed, True), ref)

    class OwnLayer(type(hard.voxel_layer)):
        pass

    hard.voxel_layer.__class__ = OwnLayer
    assert not patch.batchable(hard, batch['inputs']['points'])
    hard.voxel_layer.__class__ = OwnLayer.__mro__[1]
    hard.voxel_layer.deterministic = False
    assert not patch.batchable(hard, batch['inputs']['points'])
    assert batch_calls == []
