"""mmdet3d 1.4.0: PV-RCNN's box head targets wait on the GPU 2-5 times a sample.

``PVRCNNBBoxHead._get_target_single`` writes the IoU-interval labels through a boolean
mask (``label[mask] = ...``: a host wait), asks ``reg_mask.bool().any()`` (another)
although the mask is made from a size the host knows, and, once there are positive
RoIs, flips and wraps the yaw targets through two more boolean masks. Counted on
PV-RCNN on an H200 early in training: 16 of a micro-batch's 160 host reads.

The patch computes the same targets with ``torch.where`` for the masked writes and the
positive count from the tensor's shape: no host wait. Equality with the original is
tested in ``tests/patches/speed/test_rcnn_bbox_targets.py``.
"""
import math

import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'


def _canonical_yaw(yaw: Tensor) -> Tensor:
    """The RoI-relative yaw target in [-pi/2, pi/2]: flipped by pi where the RoI faces
    the other way, as upstream does it."""
    two_pi = 2 * math.pi
    yaw = yaw % two_pi
    opposite = (yaw > math.pi * 0.5) & (yaw < math.pi * 1.5)
    yaw = torch.where(opposite, (yaw + math.pi) % two_pi, yaw)
    yaw = torch.where(yaw > math.pi, yaw - two_pi, yaw)
    return torch.clamp(yaw, min=-math.pi / 2, max=math.pi / 2)


def _box_targets(head, pos_bboxes: Tensor, pos_gt_bboxes: Tensor) -> Tensor:
    """Ground truths in their RoI's frame (centre at 0, yaw 0), encoded."""
    from mmdet3d.structures import rotation_3d_in_axis
    rois = pos_bboxes  # one RoI a ground truth
    roi_yaw = rois[..., 6] % (2 * math.pi)
    centres = rotation_3d_in_axis((pos_gt_bboxes[..., 0:3] - rois[..., 0:3]).unsqueeze(1),
                                  -roi_yaw, axis=2).squeeze(1)
    yaw = _canonical_yaw(pos_gt_bboxes[..., 6] - roi_yaw)
    gt = torch.cat([centres, pos_gt_bboxes[..., 3:6], yaw[..., None],
                    pos_gt_bboxes[..., 7:]], dim=-1).detach()
    anchors = rois.clone().detach()
    anchors[:, 0:3] = 0
    anchors[:, 6] = 0
    return head.bbox_coder.encode(anchors, gt)


def get_target_single(self, pos_bboxes: Tensor, pos_gt_bboxes: Tensor, ious: Tensor,
                      cfg: dict):
    """``PVRCNNBBoxHead._get_target_single`` without host reads (see module doc)."""
    positive, negative = ious > cfg.cls_pos_thr, ious < cfg.cls_neg_thr
    interval = ~positive & ~negative
    label = torch.where(interval, ious * 2 - 0.5, positive.float())
    label_weights = (label >= 0).float()
    num_pos = min(pos_gt_bboxes.size(0), ious.size(0))
    reg_mask = pos_bboxes.new_zeros(ious.size(0)).long()
    reg_mask[:num_pos] = 1
    bbox_weights = (reg_mask > 0).float()
    if num_pos > 0:
        bbox_targets = _box_targets(self, pos_bboxes, pos_gt_bboxes)
    else:
        bbox_targets = pos_gt_bboxes.new_empty((0, 7))
    return label, bbox_targets, pos_gt_bboxes, reg_mask, label_weights, bbox_weights


PATCH = declare(method_patch(
    'rcnn_bbox_targets', 'speed', 'mmdet3d.models.roi_heads.bbox_heads:PVRCNNBBoxHead',
    '_get_target_single', get_target_single, UPSTREAM,
    why="PV-RCNN's box-head targets wait 2-5 times a sample: torch.where, no wait"))
