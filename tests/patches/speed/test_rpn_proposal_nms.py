"""patches/speed/rpn_proposal_nms.py: PartA2RPNHead's proposals with one host read for the mask.

The head is PV-RCNN's own RPN head, built from the plugin's PV-RCNN config; the inputs
are the tensors ``get_bboxes`` hands to ``class_agnostic_nms``."""
import pytest
import torch
from mmengine.config import ConfigDict

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import rpn_proposal_nms as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus
from tests.pv_rcnn_heads import build_pv_rcnn_head

ORIGINAL = patch.class_agnostic_nms.original


@pytest.fixture(scope='module')
def head():
    return build_pv_rcnn_head('rpn_head', 'rpn')


def _inputs(num, seed, num_classes=3):
    from mmdet3d.structures import LiDARInstance3DBoxes, xywhr2xyxyr
    gen = torch.Generator().manual_seed(seed)
    centres = torch.rand(num, 3, generator=gen) * torch.tensor([40., 40., 2.])
    sizes = 1 + 3 * torch.rand(num, 3, generator=gen)
    yaw = (torch.rand(num, 1, generator=gen) - 0.5) * 6.5
    boxes = torch.cat([centres, sizes, yaw], 1)
    for_nms = xywhr2xyxyr(LiDARInstance3DBoxes(boxes).bev)
    cls_score = torch.randn(num, num_classes, generator=gen)
    max_scores, labels = cls_score.sigmoid().max(1)
    dir_scores = torch.randint(0, 2, (num, ), generator=gen)
    meta = dict(box_type_3d=LiDARInstance3DBoxes)
    return boxes, for_nms, max_scores, labels, cls_score, dir_scores, meta


def _call(fn, head, num, seed, score_thr, rotate, nms_post):
    boxes, for_nms, scores, labels, cls_score, dirs, meta = _inputs(num, seed)
    cfg = ConfigDict(use_rotate_nms=rotate, nms_thr=0.3, nms_post=nms_post)
    return fn(head, boxes.clone(), for_nms, scores, labels, cls_score, dirs, score_thr,
              cfg, meta)


def test_the_patch_is_in_place():
    from mmdet3d.models.dense_heads import PartA2RPNHead
    assert PartA2RPNHead.class_agnostic_nms is patch.class_agnostic_nms
    assert patching.apply(['rpn_proposal_nms']) == []  # applied once; the original stays
    assert patch.class_agnostic_nms.original is ORIGINAL


@pytest.mark.parametrize('num,score_thr,nms_post', [
    (0, 0.0, 10), (1, 0.0, 10), (300, 0.0, 512), (300, 0.6, 512), (300, 0.6, 20),
    (2000, 0.3, 100), (300, 1.1, 10)])
@pytest.mark.parametrize('rotate', [True, False])
@pytest.mark.parametrize('seed', [0, 1])
def test_same_proposals_as_mmdet3d(head, num, score_thr, nms_post, rotate, seed):
    ours = _call(patch.class_agnostic_nms, head, num, seed, score_thr, rotate, nms_post)
    theirs = _call(ORIGINAL, head, num, seed, score_thr, rotate, nms_post)
    assert type(ours.bboxes_3d) is type(theirs.bboxes_3d)
    pairs = [(ours.bboxes_3d.tensor, theirs.bboxes_3d.tensor)] + [
        (getattr(ours, k), getattr(theirs, k))
        for k in ('scores_3d', 'labels_3d', 'cls_preds')]
    for a, b in pairs:
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    assert ours.bboxes_3d.tensor.shape[0] <= nms_post


def test_one_wait_for_the_mask_instead_of_six(head):
    counts = []
    for fn in (patch.class_agnostic_nms, ORIGINAL):
        with HostReadCensus() as census:
            _call(fn, head, 300, 0, 0.3, True, 512)
        counts.append(census.total)
    ours, theirs = counts
    assert theirs - ours == 5, (ours, theirs)  # the NMS's own reads are in both
