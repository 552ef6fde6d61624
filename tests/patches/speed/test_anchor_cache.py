"""patches/speed/anchor_cache.py: anchors computed once a feature size, the same anchors.

The generators are those of the configs that use them (PV-RCNN / Part-A2 KITTI,
SECOND, PointPillars on nuScenes with custom values); the reference is mmdet3d's
``grid_anchors`` (the patch's ``original``) on a fresh generator."""
import pytest
import torch
from mmdet3d.models.task_modules.anchor import (AlignedAnchor3DRangeGenerator,
                                                Anchor3DRangeGenerator)

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.diagnostics.host_reads import SyncSiteRecorder
from mmdet3d_scaling.patches.speed import anchor_cache as patch

DEVICES = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
KITTI_3CLASS = dict(  # configs/_base_/models/pv_rcnn.py, parta2.py
    ranges=[[0, -40.0, -0.6, 70.4, 40.0, -0.6], [0, -40.0, -0.6, 70.4, 40.0, -0.6],
            [0, -40.0, -1.78, 70.4, 40.0, -1.78]],
    sizes=[[0.8, 0.6, 1.73], [1.76, 0.6, 1.73], [3.9, 1.6, 1.56]],
    rotations=[0, 1.57], reshape_out=False)
GENERATORS = {
    'pv_rcnn': (AlignedAnchor3DRangeGenerator, KITTI_3CLASS, [(200, 176)]),
    'second_car': (Anchor3DRangeGenerator, dict(
        ranges=[[0, -40.0, -1.78, 70.4, 40.0, -1.78]], sizes=[[3.9, 1.6, 1.56]],
        rotations=[0, 1.57], reshape_out=True), [(200, 176)]),
    'pointpillars_nus': (AlignedAnchor3DRangeGenerator, dict(
        ranges=[[-50, -50, -1.8, 50, 50, -1.8]], scales=[1, 2, 4],
        sizes=[[2.5981, 0.8660, 1.], [1.7321, 0.5774, 1.], [1., 1., 1.]],
        custom_values=[0, 0], rotations=[0, 1.57], size_per_range=False,
        reshape_out=True), [(100, 100), (50, 50), (25, 25)]),
}


def _same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.device == b.device
        assert a.shape == b.shape and a.stride() == b.stride()
        assert torch.equal(a, b)


def test_the_patch_is_applied():
    assert Anchor3DRangeGenerator.grid_anchors is patch.grid_anchors


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', sorted(GENERATORS))
def test_every_call_returns_the_anchors_mmdet3d_computes(name, device):
    cls, kwargs, sizes = GENERATORS[name]
    generator = cls(**kwargs)
    theirs = patch.grid_anchors.original(cls(**kwargs), sizes, device=device)
    for _ in range(3):  # computed, then twice from the cache
        _same(generator.grid_anchors(sizes, device=device), theirs)
    assert len(generator._grid_anchor_cache) == 1


def test_a_caller_changing_its_anchors_does_not_change_the_next_ones():
    cls, kwargs, sizes = GENERATORS['pv_rcnn']
    generator = cls(**kwargs)
    first = generator.grid_anchors(sizes, device='cpu')
    first[0].add_(100.0)
    second = generator.grid_anchors(sizes, device='cpu')
    second[0].zero_()
    _same(generator.grid_anchors(sizes, device='cpu'),
          patch.grid_anchors.original(cls(**kwargs), sizes, device='cpu'))


def test_new_settings_or_sizes_give_new_anchors():
    cls, kwargs, sizes = GENERATORS['second_car']
    generator = cls(**kwargs)
    generator.grid_anchors(sizes, device='cpu')
    generator.sizes = [[4.2, 1.8, 1.6]]
    generator.rotations = [0.3]
    reference = cls(**{**kwargs, 'sizes': [[4.2, 1.8, 1.6]], 'rotations': [0.3]})
    _same(generator.grid_anchors(sizes, device='cpu'),
          patch.grid_anchors.original(reference, sizes, device='cpu'))
    for size in [(10, 8), (12, 8), (10, 9), (4, 4), (5, 5)]:
        _same(generator.grid_anchors([size], device='cpu'),
              patch.grid_anchors.original(reference, [size], device='cpu'))
    assert len(generator._grid_anchor_cache) == patch.KEPT


def test_long_numpy_settings_are_keyed_by_every_value():
    import numpy as np
    cls, kwargs, sizes = GENERATORS['second_car']
    generator = cls(**kwargs)
    rotations = np.linspace(0, 1.5, 1200, dtype=np.float32)  # numpy's repr elides it
    generator.rotations = rotations
    generator.grid_anchors([(2, 2)], device='cpu')
    changed = rotations.copy()
    changed[600] += 0.25
    generator.rotations = changed
    reference = cls(**{**kwargs, 'rotations': changed})
    _same(generator.grid_anchors([(2, 2)], device='cpu'),
          patch.grid_anchors.original(reference, [(2, 2)], device='cpu'))


def test_anchors_made_in_inference_mode_are_not_kept():
    cls, kwargs, sizes = GENERATORS['second_car']
    generator = cls(**kwargs)
    with torch.inference_mode():
        generator.grid_anchors(sizes, device='cpu')
    assert not generator.__dict__.get('_grid_anchor_cache')
    anchors = generator.grid_anchors(sizes, device='cpu')
    assert not anchors[0].is_inference()


def test_a_subclass_with_its_own_anchors_is_not_cached():
    class Shifted(Anchor3DRangeGenerator):
        calls = 0

        def anchors_single_range(self, *args, **kwargs):
            Shifted.calls += 1
            return super().anchors_single_range(*args, **kwargs) + 1.0

    _, kwargs, sizes = GENERATORS['second_car']
    generator = Shifted(**kwargs)
    for _ in range(2):
        generator.grid_anchors(sizes, device='cpu')
    assert Shifted.calls == 2 and '_grid_anchor_cache' not in vars(generator)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='waits need a GPU')
def test_no_wait_for_the_gpu_once_computed():
    cls, kwargs, sizes = GENERATORS['pv_rcnn']
    generator = cls(**kwargs)
    with SyncSiteRecorder() as first:
        generator.grid_anchors(sizes, device='cuda')
    with SyncSiteRecorder() as again:
        generator.grid_anchors(sizes, device='cuda')
    waits = sum(first.counts.values()), sum(again.counts.values())
    assert waits[0] > 0 and waits[1] == 0, waits
