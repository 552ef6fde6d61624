"""mmdet3d 1.4.0: the anchor heads' targets wait on the GPU ~9 times a sample.

``AnchorTrainMixin.anchor_target_3d`` (Anchor3DHead: SECOND, PointPillars, Part-A2 and
PV-RCNN's RPN) assigns anchors sample by sample and class by class: with
``assign_per_class`` the class's ground truths are taken with two boolean masks (a host
wait each), the pseudo sampler reads its counts (one more) and ``len(pos_inds)`` decides
on the encoding, about 9 waits and ~200 small kernels a sample with 3 classes. Counted on
PV-RCNN's GPU training step: 72 of a micro-batch's 160 host reads.

The patch computes the same targets for the whole batch at once, class by class: ground
truths padded to the batch's largest count (padding, and with ``assign_per_class`` the
other classes' rows, masked out of the IoU), the same nearest-BEV IoU and the same
max-IoU assignment rules as ``Max3DIoUAssigner`` (negatives, positives, low-quality
matches with the same winner on ties), targets encoded by the head's own box coder and
direction rule, and the positive and negative counts read once a batch (batches whose
IoU would exceed ``_batched_assign.MAX_PAIRS`` pairs a class go a few samples at a
time). It handles the common case -- a ``Max3DIoUAssigner`` with
``BboxOverlapsNearest3D`` a class, the pseudo sampler, one tensor of anchors shared by
all samples, no ignored boxes -- and hands anything else to the original. Without
``assign_per_class`` upstream replaces each non-empty sample's ``bboxes_3d`` by its
tensor; so does the patch. Equality of every target and the losses with the original is
tested in ``tests/patches/speed/test_anchor_targets.py``.
"""
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from ._batched_assign import assign_masked, real_rows, sample_chunks
from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'


def _batchable(head, anchor_list, gts, gts_ignore) -> bool:
    """Whether the batched path computes exactly what the original would."""
    from mmdet3d.models.task_modules import Max3DIoUAssigner, PseudoSampler
    from mmdet3d.structures import BboxOverlapsNearest3D
    assigners = head.bbox_assigner
    if not (isinstance(assigners, list) and anchor_list):
        return False
    levels = anchor_list[0]
    if not isinstance(levels, (list, tuple)) or not all(
            isinstance(a, Tensor) for a in levels):
        return False  # class-aware anchors of different sizes (nested lists)
    if any(len(a) != len(levels) or any(x is not y for x, y in zip(a, levels))
           for a in anchor_list):
        return False  # anchors that may differ between samples
    if type(head.bbox_sampler) is not PseudoSampler:
        return False
    if not all(type(a) is Max3DIoUAssigner
               and type(a.iou_calculator) is BboxOverlapsNearest3D for a in assigners):
        return False
    if gts_ignore is not None and any(g is not None for g in gts_ignore):
        return False
    code_size = levels[0].size(-1)
    if any(g.labels_3d is None or _box_tensor(g).size(-1) != code_size for g in gts):
        return False
    shapes = {a.shape[1:] for a in levels}
    return (levels[0].dim() == 6 and len(shapes) == 1
            and levels[0].size(-3) == len(assigners))


def _box_tensor(gt) -> Tensor:
    boxes = gt.bboxes_3d
    return boxes if isinstance(boxes, Tensor) else boxes.tensor


def _nearest_bev_iou(coordinate: str, gt_boxes: Tensor, anchors: Tensor) -> Tensor:
    """``BboxOverlapsNearest3D``'s IoU of each sample's ground truths (B, G, code) with
    the anchors (A, code): (B, G, A), computed as the calculator computes it."""
    from mmdet.structures.bbox import bbox_overlaps
    from mmdet3d.structures import get_box_type
    box_type, _ = get_box_type(coordinate)
    batch, num_gts, code = gt_boxes.shape
    gt_bev = box_type(gt_boxes.reshape(-1, code), box_dim=code).nearest_bev
    anchor_bev = box_type(anchors, box_dim=code).nearest_bev
    return bbox_overlaps(gt_bev.view(batch, num_gts, 4),
                         anchor_bev.expand(batch, -1, -1))


def _class_targets(head, anchors: Tensor, gt_boxes: Tensor, gt_labels: Tensor,
                   gt_inds: Tensor, num_classes: int) -> Tuple[Tensor, ...]:
    """One class's targets, (B, A[, code]) each, as ``anchor_target_single_assigner``
    writes them (encoded for every anchor, kept where positive)."""
    from mmdet3d.models.dense_heads.train_mixins import get_direction_target
    batch, num_anchors = gt_inds.shape
    code = anchors.size(-1)
    positive, negative = gt_inds > 0, gt_inds == 0
    labels = torch.full_like(gt_inds, num_classes)
    bbox_targets = anchors.new_zeros(batch, num_anchors, code)
    dir_targets = torch.zeros_like(gt_inds)
    if gt_boxes.size(1) > 0:  # else no positives: all stays as initialised
        rows = (gt_inds - 1).clamp(min=0)
        which = torch.arange(batch, device=rows.device)[:, None]
        flat_anchors = anchors.expand(batch, -1, -1).reshape(-1, code)
        encoded = head.bbox_coder.encode(flat_anchors,
                                         gt_boxes[which, rows].reshape(-1, code))
        directions = get_direction_target(flat_anchors, encoded, head.dir_offset,
                                          head.dir_limit_offset, one_hot=False)
        bbox_targets = torch.where(positive[..., None],
                                   encoded.view(batch, num_anchors, code), bbox_targets)
        dir_targets = torch.where(positive, directions.view(batch, num_anchors),
                                  dir_targets)
        labels = torch.where(positive, gt_labels[which, rows], labels)
    pos_weight = head.train_cfg.pos_weight
    label_weights = torch.where(positive, 1.0 if pos_weight <= 0 else pos_weight,
                                negative.float())
    weights = positive.to(anchors.dtype)
    return (labels, label_weights, bbox_targets,
            weights[..., None].expand(-1, -1, code).clone(), dir_targets,
            positive.float())


def _batch_targets(head, anchors: Tensor, gts: Sequence, num_classes: int):
    """Targets of the whole batch (B, N[, code]) in the original's anchor order, and
    the positive and negative counts a sample (2, B), still on the device."""
    batch, code = len(gts), anchors.size(-1)
    feat_size = anchors.shape[:3].numel()
    rot_angles = anchors.size(-2)
    gt_boxes = pad_sequence([_box_tensor(g).to(anchors.device) for g in gts],
                            batch_first=True)
    gt_labels = pad_sequence([g.labels_3d.to(anchors.device) for g in gts],
                             batch_first=True, padding_value=-1)
    real = real_rows([g.labels_3d for g in gts]).to(anchors.device)
    per_class, counts = [], anchors.new_zeros(2, batch, dtype=torch.long)
    for cls, assigner in enumerate(head.bbox_assigner):
        class_anchors = anchors[..., cls, :, :].reshape(-1, code)
        # per class: the class's ground truths; else every class's anchors see them all
        valid = real & (gt_labels == cls) if head.assign_per_class else real
        if gt_boxes.size(1) > 0:
            coordinate = assigner.iou_calculator.coordinate
            gt_inds = torch.cat([assign_masked(
                assigner, _nearest_bev_iou(coordinate, gt_boxes[part], class_anchors),
                valid[part, :, None])[0] for part in sample_chunks(
                    batch, gt_boxes.size(1) * len(class_anchors))])
        else:
            gt_inds = anchors.new_zeros(batch, len(class_anchors), dtype=torch.long)
        counts += torch.stack([(gt_inds > 0).sum(1), (gt_inds == 0).sum(1)])
        targets = _class_targets(head, class_anchors, gt_boxes, gt_labels, gt_inds,
                                 num_classes)
        # (B, feat, 1, rot[, code]): the classes go between feature cell and rotation
        per_class.append([t.reshape(batch, feat_size, 1, rot_angles, *t.shape[2:])
                          for t in targets])
    merged = [torch.cat(parts, dim=2).reshape(batch, -1, *parts[0].shape[4:])
              for parts in zip(*per_class)]
    return merged, counts


def _to_levels(target: Tensor, num_level_anchors: List[int]) -> List[Tensor]:
    return list(torch.split(target, num_level_anchors, dim=1))


def anchor_target_3d(self, anchor_list, batch_gt_instances_3d, batch_input_metas,
                     batch_gt_instances_ignore: Optional[list] = None, label_channels=1,
                     num_classes=1, sampling=True):
    """``AnchorTrainMixin.anchor_target_3d`` for the whole batch at once, one host read
    (see the module doc)."""
    if not _batchable(self, anchor_list, batch_gt_instances_3d,
                      batch_gt_instances_ignore):
        return anchor_target_3d.original(
            self, anchor_list, batch_gt_instances_3d, batch_input_metas,
            batch_gt_instances_ignore=batch_gt_instances_ignore,
            label_channels=label_channels, num_classes=num_classes, sampling=sampling)
    assert len(anchor_list) == len(batch_input_metas)
    levels = anchor_list[0]
    num_level_anchors = [a.view(-1, self.box_code_size).size(0) for a in levels]
    anchors = torch.cat(levels)
    if not self.assign_per_class:  # as upstream, which hands the instances themselves on
        for gts in batch_gt_instances_3d:
            if len(gts.bboxes_3d) > 0 and not isinstance(gts.bboxes_3d, Tensor):
                gts.bboxes_3d = gts.bboxes_3d.tensor.to(anchors.device)
    targets, counts = _batch_targets(self, anchors, batch_gt_instances_3d, num_classes)
    positives, negatives = counts.tolist()  # the one host wait
    num_total_pos = sum(max(n, 1) for n in positives)
    num_total_neg = sum(max(n, 1) for n in negatives)
    return (*[_to_levels(t, num_level_anchors) for t in targets], num_total_pos,
            num_total_neg)


PATCH = declare(method_patch(
    'anchor_targets', 'speed', 'mmdet3d.models.dense_heads.train_mixins:AnchorTrainMixin',
    'anchor_target_3d', anchor_target_3d, UPSTREAM,
    why="anchor heads' per-class targets wait ~9 times a sample: whole batch, one wait"))
