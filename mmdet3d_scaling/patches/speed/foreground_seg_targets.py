"""mmdet3d 1.4.0: PV-RCNN's foreground segmentation targets wait on the GPU per sample.

``ForegroundSegmentationHead.get_targets`` (PV-RCNN's point head) takes each sample's
keypoints with a boolean mask (a host wait) and labels them with three more boolean-mask
reads and writes (``labels[ignore] = -1``, ``gt_labels[box_idx[fg]]``,
``labels[fg] = ...``). Counted on PV-RCNN on an H200: 16 of a micro-batch's 160 host
reads, more once boxes hold keypoints.

The patch groups the keypoints by sample with one stable sort and reads the per-sample
counts once a batch, then labels each sample's points with the same two
``points_in_boxes_part`` calls (boxes and enlarged boxes) and ``torch.where`` in place
of the masked writes: the same labels (-1 ignore, 0 background, the class or 1), in the
same order. Equality with the original is tested in
``tests/patches/speed/test_foreground_seg_targets.py``.
"""
import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'


def _labels(head, xyz: Tensor, gt_boxes, gt_labels: Tensor) -> Tensor:
    """One sample's point labels, as ``_get_targets_single`` gives them."""
    box_idx = gt_boxes.points_in_boxes_part(xyz).long()
    enlarged_idx = gt_boxes.enlarged_box(head.extra_width).points_in_boxes_part(xyz).long()
    foreground = box_idx >= 0
    ignore = foreground ^ (enlarged_idx >= 0)
    labels = torch.where(ignore, -1, 0)
    if len(gt_labels) == 0:  # no box: no foreground (and nothing to gather)
        return labels
    fg_labels = 1 if head.num_classes == 1 else gt_labels[box_idx.clamp(min=0)].long()
    return torch.where(foreground, fg_labels, labels)


def get_targets(self, points_bxyz: Tensor, batch_gt_instances_3d) -> dict:
    """``ForegroundSegmentationHead.get_targets`` with one host read a batch."""
    batch = len(batch_gt_instances_3d)
    sample = points_bxyz[:, 0]
    # points of samples outside 0..batch-1 are left out, as upstream's masks leave them
    key = torch.where((sample >= 0) & (sample < batch), sample, batch).long()
    order = torch.argsort(key, stable=True)  # ascending within a sample, like a mask
    counts = torch.bincount(key, minlength=batch + 1).tolist()  # the one wait
    xyz = points_bxyz[order, 1:]
    labels = [
        _labels(self, points, gts.bboxes_3d, gts.labels_3d)
        for points, gts in zip(torch.split(xyz, counts)[:batch], batch_gt_instances_3d)]
    return dict(seg_targets=torch.cat(labels, dim=0))


PATCH = declare(method_patch(
    'foreground_seg_targets', 'speed', 'mmdet3d.models.roi_heads.mask_heads:ForegroundSegmentationHead',
    'get_targets', get_targets, UPSTREAM,
    why="PV-RCNN's point-head targets wait per sample: one wait a batch"))
