"""patches/speed/rcnn_bbox_targets.py: PV-RCNN's box-head targets without host reads, the
same labels, weights and encoded boxes as upstream.

The head is PV-RCNN's own PVRCNNBBoxHead with its training config (IoU labels: 1 above
0.75, 0 below 0.25, linear between). The RoIs face every direction relative to their
ground truths, so the yaw targets pass through each flip and wrap."""
import copy

import pytest
import torch

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import rcnn_bbox_targets as patch
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from tests.devices import DEVICES
from tests.pv_rcnn_heads import build_pv_rcnn_head

ORIGINAL = patch.get_target_single.original


@pytest.fixture(scope='module')
def roi_head():
    return build_pv_rcnn_head('roi_head', 'rcnn')


def _case(num_pos, num_neg, seed):
    gen = torch.Generator().manual_seed(seed)
    gts = torch.cat([40 * torch.rand(num_pos, 3, generator=gen),
                     1 + 3 * torch.rand(num_pos, 3, generator=gen),
                     12 * torch.rand(num_pos, 1, generator=gen) - 6], 1)
    rois = gts + 0.3 * torch.randn(num_pos, 7, generator=gen)
    rois[:, 6] = 12 * torch.rand(num_pos, generator=gen) - 6  # any relative yaw
    ious = torch.rand(num_pos + num_neg, generator=gen)
    return rois, gts, ious


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('num_pos,num_neg', [(40, 88), (0, 128), (5, 0), (0, 0)])
def test_same_targets_as_mmdet3d(roi_head, num_pos, num_neg, device):
    head, cfg = roi_head.bbox_head, roi_head.train_cfg
    case = _case(num_pos, num_neg, seed=num_pos + num_neg)
    rois, gts, ious = (t.to(device) for t in case)
    ours = patch.get_target_single(head, rois.clone(), gts.clone(), ious.clone(), cfg)
    theirs = ORIGINAL(head, rois.clone(), gts.clone(), ious.clone(), cfg)
    names = ['label', 'bbox_targets', 'pos_gt_bboxes', 'reg_mask', 'label_weights',
             'bbox_weights']
    for name, a, b in zip(names, ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        if name == 'bbox_targets':  # where() on all rows vs masked writes: SIMD ulps
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)
        else:
            assert torch.equal(a, b), name


def test_no_host_read(roi_head):
    head, cfg = roi_head.bbox_head, roi_head.train_cfg
    rois, gts, ious = _case(40, 88, 0)
    totals = []
    for fn in (patch.get_target_single, ORIGINAL):
        with HostReadCensus() as census:
            fn(head, rois.clone(), gts.clone(), ious.clone(), cfg)
        totals.append(census.total)
    assert totals == [0, 4]  # upstream: label mask, any(), two yaw masks
