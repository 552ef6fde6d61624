"""patches/speed/foreground_seg_targets.py: PV-RCNN's point-head targets with one host read a
batch, the same labels in the same order as upstream.

The head is PV-RCNN's own ForegroundSegmentationHead (boxes enlarged by 0.1 m for the
ignore band) from the plugin's PV-RCNN config. Keypoints of three samples come
interleaved, some inside a box, some in the band around it, most outside; one sample
has no box and one point belongs to no sample of the batch."""
import copy

import pytest
import torch
from mmengine.structures import InstanceData

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import foreground_seg_targets as patch
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from tests.devices import DEVICES
from tests.pv_rcnn_heads import build_pv_rcnn_head

ORIGINAL = patch.get_targets.original


@pytest.fixture(scope='module')
def head():
    return build_pv_rcnn_head('roi_head', 'rcnn').semantic_head


def _gts(num, gen):
    from mmdet3d.structures import LiDARInstance3DBoxes
    boxes = torch.cat([20 * torch.rand(num, 3, generator=gen),
                       1 + 2 * torch.rand(num, 3, generator=gen),
                       6.2 * torch.rand(num, 1, generator=gen) - 3.1], 1)
    return InstanceData(bboxes_3d=LiDARInstance3DBoxes(boxes),
                        labels_3d=torch.randint(0, 3, (num, ), generator=gen))


def _points(gts, sample, gen, per_box=12):
    """Points in and just around each box (bottom-centred: z from the box's bottom) and
    scattered ones, tagged with their sample."""
    boxes = gts.bboxes_3d
    inside = [boxes.gravity_center[i] + (torch.rand(per_box, 3, generator=gen) - 0.5)
              * boxes.dims[i] * torch.tensor([1.1, 1.1, 1.1]) for i in range(len(boxes))]
    scattered = 20 * torch.rand(30, 3, generator=gen)
    xyz = torch.cat(inside + [scattered])
    return torch.cat([torch.full((len(xyz), 1), float(sample)), xyz], 1)


def _case(seed):
    gen = torch.Generator().manual_seed(seed)
    gts = [_gts(4, gen), _gts(0, gen), _gts(3, gen)]
    points = torch.cat([_points(g, i, gen) for i, g in enumerate(gts)]
                       + [torch.tensor([[7., 1., 1., 1.]])])  # no such sample
    return points[torch.randperm(len(points), generator=gen)], gts


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('num_classes', [1, 3])
@pytest.mark.parametrize('seed', [0, 1])
def test_same_targets_as_mmdet3d(head, seed, num_classes, device):
    head = copy.deepcopy(head)
    head.num_classes = num_classes
    points, gts = _case(seed)
    points, gts = points.to(device), [g.to(device) for g in gts]
    ours = patch.get_targets(head, points, copy.deepcopy(gts))['seg_targets']
    theirs = ORIGINAL(head, points, copy.deepcopy(gts))['seg_targets']
    assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
    assert len(ours) == len(points) - 1
    assert {-1, 0} <= set(ours.tolist()) and (ours > 0).any()  # every kind of label


def test_one_read_a_batch(head):
    points, gts = _case(0)
    totals = []
    for fn in (patch.get_targets, ORIGINAL):
        with HostReadCensus() as census:
            fn(head, points, copy.deepcopy(gts))
        totals.append(census.total)
    assert totals[0] == 1 and totals[1] >= len(gts) + 1
