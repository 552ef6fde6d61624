"""patches/speed/box_geometry.py: the boxes' ``bev``, ``nearest_bev`` and LiDAR
``corners`` without copies from the host, bit for bit mmdet3d's values and gradients.

Upstream's properties are compared inside ``patching.scoped([])`` where the patch is not
in force (another test of the worker may have left the speed set applied in its scope:
``scoped`` reverts only what it applied)."""
import numpy as np
import pytest
import torch
from mmdet3d.structures import (CameraInstance3DBoxes, DepthInstance3DBoxes,
                                LiDARInstance3DBoxes)
from mmdet3d.structures.bbox_3d.base_box3d import BaseInstance3DBoxes

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.speed import box_geometry as patch
from tests.devices import DEVICES, needs_cuda

PROPERTIES = {'bev': patch.bev, 'nearest_bev': patch.nearest_bev,
              'corners': patch.lidar_corners}


def _boxes(cls, n, device, seed=0, box_dim=7):
    gen = torch.Generator().manual_seed(seed)
    t = torch.rand(n, box_dim, generator=gen) * torch.tensor(
        [70.0, 80.0, 3.0, 4.0, 2.0, 1.8, 2 * np.pi] + [1.0] * (box_dim - 7))
    t[:, 6] -= np.pi  # yaws in [-pi, pi): both sides of 45 degrees
    if n > 3:
        t[1, 6], t[2, 6] = np.pi / 4, -3 * np.pi / 4  # on the swap threshold
    t = t.to(device)
    return cls(t, box_dim=box_dim)


def _upstream(boxes, name):
    assert 'box_geometry' not in patching.applied()
    return getattr(boxes, name)


@pytest.fixture
def upstream_in_force():
    """mmdet3d's own properties for the test (the patch reverted if a scope left it)."""
    was = 'box_geometry' in patching.applied()
    if was:
        patching.revert(['box_geometry'])
    yield
    if was:
        patching.apply(['box_geometry'])


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('cls', [LiDARInstance3DBoxes, DepthInstance3DBoxes])
@pytest.mark.parametrize('n,box_dim', [(40, 7), (5, 9), (0, 7)])
def test_same_values_as_mmdet3d(upstream_in_force, device, cls, n, box_dim):
    boxes = _boxes(cls, n, device, box_dim=box_dim)
    names = ['bev', 'nearest_bev'] + (['corners'] if cls is LiDARInstance3DBoxes else [])
    for name in names:
        ours, theirs = PROPERTIES[name](boxes), _upstream(boxes, name)
        assert ours.dtype == theirs.dtype and ours.device == theirs.device, name
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('name', ['bev', 'nearest_bev', 'corners'])
def test_same_gradients_as_mmdet3d(upstream_in_force, device, name):
    grads = []
    for fn in (PROPERTIES[name], lambda b: _upstream(b, name)):
        leaf = _boxes(LiDARInstance3DBoxes, 30, device, seed=1).tensor.requires_grad_()
        out = fn(LiDARInstance3DBoxes(leaf))  # the boxes may hold a view of the leaf
        out.mul(torch.linspace(-1, 1, out.numel(), device=device).view_as(out)).sum(
            ).backward()
        grads.append(leaf.grad)
    assert torch.equal(grads[0], grads[1])


def test_applied_in_scope_and_camera_boxes_keep_their_own(upstream_in_force):
    camera_bev = CameraInstance3DBoxes.bev
    with patching.scoped(['box_geometry']):
        assert BaseInstance3DBoxes.bev.fget is patch.bev
        assert LiDARInstance3DBoxes.corners.fget is patch.lidar_corners
        assert CameraInstance3DBoxes.bev is camera_bev
        boxes = _boxes(LiDARInstance3DBoxes, 10, 'cpu')
        assert torch.equal(boxes.bev, patch.bev(boxes))
    assert BaseInstance3DBoxes.bev.fget is not patch.bev


def test_a_wrong_column_fails():
    """The comparison can fail: the yaw taken from the velocity's column."""
    boxes = _boxes(LiDARInstance3DBoxes, 10, 'cpu', box_dim=9)
    t = boxes.tensor
    wrong = torch.cat([t[:, 0:2], t[:, 3:5], t[:, 7:8]], dim=1)
    assert not torch.equal(wrong, patch.bev(boxes))


@needs_cuda
@pytest.mark.cuda
def test_no_wait_for_the_gpu(upstream_in_force):
    """Under torch's sync debug mode a wait raises: upstream's properties wait, the
    patched ones not (the unit box is made once before)."""
    boxes = _boxes(LiDARInstance3DBoxes, 20, 'cuda')
    patch.lidar_corners(boxes)  # the once-per-device constant
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        with pytest.raises(RuntimeError, match='synchronizing'):
            _upstream(boxes, 'bev')
        with patching.scoped(['box_geometry']):  # nearest_bev reads self.bev
            for name in PROPERTIES:
                getattr(boxes, name)
    finally:
        torch.cuda.set_sync_debug_mode('default')
