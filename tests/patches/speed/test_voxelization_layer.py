"""patches/speed/voxelization_layer.py: stock voxel models voxelize identically with the patch.

The package's conftest applies the ``speed`` set; ``_without_patch`` reverts this one
patch for a reference run and applies it again.
"""
import os.path as osp

import numpy as np
import pytest
import torch

import mmdet3d_scaling  # noqa: F401
import mmcv.ops.voxelize as mmcv_voxelize
import mmdet3d
import mmdet3d.models.data_preprocessors.voxelize as mmdet3d_voxelize
from mmcv.ops import Voxelization
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.speed import voxelization_layer as patch
from mmdet3d_scaling.datasets.synthetic import KITTI_CLASSES, SensorModel, sample_scene

from ..reverting import reverted

STOCK = osp.join(osp.dirname(mmdet3d.__file__), '.mim', 'configs')  # mmdet3d's own
CONFIGS = [
    f'{STOCK}/pv_rcnn/pv_rcnn_8xb2-80e_kitti-3d-3class.py',
    f'{STOCK}/pointpillars/pointpillars_hv_secfpn_8xb6-160e_kitti-3d-3class.py',
    f'{STOCK}/centerpoint/centerpoint_pillar02_second_secfpn_8xb4-cyclic-20e_nus-3d.py',
    'configs/second/second_synthetic_kitti.py',
]
DYNAMIC = f'{STOCK}/dynamic_voxelization/second_dv_secfpn_8xb6-80e_kitti-3d-car.py'


def _without_patch():
    return reverted(['voxelization_layer'])


@pytest.fixture(autouse=True)
def _per_sample_loop():
    """These tests follow mmdet3d's loop over samples (voxelize_batch bypasses it)."""
    undone = patching.revert(['voxelize_batch'])
    yield
    patching.apply(undone)


@pytest.fixture
def sort_calls(monkeypatch):
    """Counts the calls that the patched ``voxelization`` serves by the sort."""
    calls = []
    real = patch.hard_voxelize

    def counting(*args, **kwargs):
        calls.append(len(args[0]))
        return real(*args, **kwargs)

    monkeypatch.setattr(patch, 'hard_voxelize', counting)
    return calls


def _preprocessor(config: str):
    from mmdet3d.registry import MODELS
    from mmdet3d.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    return MODELS.build(Config.fromfile(config).model.data_preprocessor)


def _batch(channels: int, seed: int = 0):
    from mmdet3d.structures import Det3DDataSample
    points = []
    for i in range(2):
        scene = sample_scene(np.random.default_rng(seed + i), KITTI_CLASSES, n_objects=10,
                             sensor=SensorModel(density=3000))
        pts = torch.from_numpy(scene.points).float()
        pts[:, 1] -= 20 * i  # the second scan partly outside y's range
        extra = torch.rand(len(pts), channels - 4, generator=torch.Generator().manual_seed(i))
        points.append(torch.cat([pts, extra], 1))
    return dict(inputs=dict(points=points), data_samples=[Det3DDataSample() for _ in points])


def _voxelize(preprocessor, batch, training):
    preprocessor.train(training)  # the voxel layer's max_voxels follow the module mode
    out = preprocessor(dict(inputs=dict(points=list(batch['inputs']['points'])),
                            data_samples=batch['data_samples']), training=training)
    return out['inputs']['voxels']


def _same(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_the_patch_rebinds_both_modules():
    assert 'voxelization_layer' in patching.applied()
    for module in (mmcv_voxelize, mmdet3d_voxelize):
        assert module.voxelization.__module__ == patch.__name__
        assert module.voxelization.original.__self__ is module._Voxelization
    with _without_patch():
        assert mmcv_voxelize.voxelization.__self__ is mmcv_voxelize._Voxelization
        assert mmdet3d_voxelize.voxelization.__self__ is mmdet3d_voxelize._Voxelization


@pytest.mark.parametrize('config', CONFIGS)
@pytest.mark.parametrize('limits', ['config', 'tight'])
def test_stock_preprocessors_voxelize_identically(config, limits, sort_calls):
    preprocessor = _preprocessor(config)
    assert preprocessor.voxel_type == 'hard'
    layer = preprocessor.voxel_layer
    if limits == 'tight':  # both limits bite: voxels and points are dropped
        layer.max_voxels, layer.max_num_points = (1000, 1500), 2
    channels = 5 if 'nus' in config else 4
    batch = _batch(channels)
    for training in (True, False):
        with _without_patch():
            ref = _voxelize(preprocessor, batch, training)
        calls = len(sort_calls)
        got = _voxelize(preprocessor, batch, training)
        assert len(sort_calls) == calls + 2  # both samples went through the sort
        _same(got, ref)
        if limits == 'tight':
            assert len(ref['voxels']) == 2 * layer.max_voxels[0 if training else 1]
            assert ref['num_points'].max() == 2
    assert len(ref['voxels']) > 1000


def test_dynamic_and_nondeterministic_calls_stay_mmcvs(sort_calls):
    preprocessor = _preprocessor(DYNAMIC)
    assert preprocessor.voxel_type == 'dynamic'
    batch = _batch(4)
    with _without_patch():
        ref = _voxelize(preprocessor, batch, True)
    _same(_voxelize(preprocessor, batch, True), ref)
    layer = Voxelization([0.2, 0.2, 0.2], [0, -40, -3, 70.4, 40, 1], 5, 20000,
                         deterministic=False)
    points = batch['inputs']['points'][0]
    if torch.cuda.is_available():
        assert len(layer(points.cuda())[0]) > 0
    else:  # mmcv has no CPU kernel of its non-deterministic op: its error, unchanged
        with pytest.raises(RuntimeError, match='nondeterministic_hard_voxelize'):
            layer(points)
    assert sort_calls == []


def test_inputs_the_sort_does_not_take_go_to_mmcv(sort_calls):
    points = torch.rand(100, 4) * 4
    geometry = ([0.5, 0.5, 0.5], [0, 0, 0, 4, 4, 4])
    layer = Voxelization(*geometry, 5, 100)
    assert len(layer(points)[0]) > 0 and len(sort_calls) == 1
    with pytest.raises(RuntimeError) as ours:  # mmcv's own error, unchanged
        layer(points.bfloat16())
    with _without_patch(), pytest.raises(RuntimeError) as theirs:
        layer(points.bfloat16())
    assert str(ours.value) == str(theirs.value) and len(sort_calls) == 1
    assert not patch.handles(points, geometry[0], geometry[1], 5, 100, False)
    assert not patch.handles(points, geometry[0], geometry[1], -1, 100, True)
    assert not patch.handles(points, geometry[0], [0, 0, 0, 0.1, 4, 4], 5, 100, True)
    assert patch.handles(points.double(), geometry[0], geometry[1], 5, 100, True)
