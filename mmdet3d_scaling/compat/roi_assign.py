"""mmdet3d 1.4.0: PV-RCNN's RoI assignment waits on the GPU ~18 times a sample.

``PVRCNNRoIHead._assign_and_sample`` assigns each sample's proposals class by class:
per class it takes the proposals and the ground truths of that class with two boolean
masks on ``InstanceData`` (a host wait each), the ground truths' indices with
``nonzero`` (one more) and writes the class's assignment back through the proposal mask
three times (``x[mask] = values``: an index computed from the mask each time). With 3
classes that is ~18 host waits a sample.

The shim groups proposals and ground truths by label with one stable sort each and
reads every sample's per-class counts at once (one host wait a batch), then runs the
same per-class assigner on the same rows (gathered by index, in the same ascending
order a mask gives), combines the results with the same arithmetic and samples with the
same sampler (the IoU piecewise sampler's counts for the whole batch in one more host
read, see ``iou_piecewise_sampler``). Side effect kept: like upstream, it replaces each
ground truth's ``bboxes_3d`` by its tensor. A single (not per-class) assigner goes to the original.
Equality of every ``SamplingResult`` field is tested in
``tests/compat/test_roi_assign.py``.
"""
from typing import List

import torch
from torch import Tensor
from torch.nn import functional as F

from . import iou_piecewise_sampler
from ._patch import replace_method
from .instance_data_index import take_rows

UPSTREAM = 'mmdet3d 1.4.0'


def _by_label(labels: Tensor, num_classes: int):
    """Row indices sorted by label (stable: ascending within a label), and the rows per
    label 0..num_classes-1 (other labels counted last, never used)."""
    key = labels.long().clamp(-1, num_classes)
    key = torch.where(key < 0, num_classes, key)
    order = torch.argsort(key, stable=True)
    counts = torch.bincount(key, minlength=num_classes + 1)
    return order, counts


def _split(order: Tensor, counts: List[int], num_classes: int) -> List[Tensor]:
    return list(torch.split(order, counts))[:num_classes]


def _assign_per_class(assigners, proposals, gts, pred_rows, gt_rows):
    """The per-class assignment of one sample, combined as upstream combines it."""
    from mmdet.models.task_modules import AssignResult
    num = len(proposals)
    gt_labels = gts.labels_3d
    gt_inds = gt_labels.new_full((num, ), 0)  # 0: background
    max_overlaps = proposals.bboxes_3d.tensor.new_zeros(num)
    labels = gt_labels.new_full((num, ), -1)
    num_gts = 0
    for assigner, preds, gt_idx in zip(assigners, pred_rows, gt_rows):
        result = assigner.assign(take_rows(proposals, preds), take_rows(gts, gt_idx))
        num_gts += result.num_gts
        # result.gt_inds: -1 ignore, 0 background, k the class's k-th gt (1-based) ->
        # -1, 0, or the sample's 1-based gt index
        to_sample = F.pad(gt_idx.to(gt_labels.device) + 2, (2, 0))
        to_sample[1] = 1
        gt_inds[preds] = (to_sample[result.gt_inds + 1] - 1).to(gt_inds.dtype)
        max_overlaps[preds] = result.max_overlaps.to(max_overlaps.dtype)
        labels[preds] = result.labels.to(labels.dtype)
    return AssignResult(num_gts, gt_inds, max_overlaps, labels)


def assign_and_sample(self, proposal_list, batch_gt_instances_3d):
    """``PVRCNNRoIHead._assign_and_sample`` with one host wait a batch for the class
    split (see the module doc)."""
    assigners = self.bbox_assigner
    if not isinstance(assigners, list):
        return assign_and_sample.original(self, proposal_list, batch_gt_instances_3d)
    num_classes = len(assigners)
    splits = [(_by_label(p.labels_3d, num_classes), _by_label(g.labels_3d, num_classes))
              for p, g in zip(proposal_list, batch_gt_instances_3d)]
    if not splits:
        return []
    counts = torch.stack([c.to(splits[0][0][1].device) for pair in splits
                          for _, c in pair]).tolist()  # the one host wait
    to_sample = []
    for i, (proposals, gts) in enumerate(zip(proposal_list, batch_gt_instances_3d)):
        (pred_order, _), (gt_order, _) = splits[i]
        pred_rows = _split(pred_order, counts[2 * i], num_classes)
        gt_rows = _split(gt_order, counts[2 * i + 1], num_classes)
        gts.bboxes_3d = gts.bboxes_3d.tensor  # as upstream: later steps expect a tensor
        boxes = proposals.bboxes_3d
        gt_boxes = gts.bboxes_3d.to(boxes.device)
        assign = _assign_per_class(assigners, proposals, gts, pred_rows, gt_rows)
        to_sample.append((assign, boxes.tensor, gt_boxes, gts.labels_3d))
    return _sample_batch(self.bbox_sampler, to_sample)


def _sample_batch(sampler, to_sample: list) -> list:
    """Sample every sample's RoIs; with the IoU piecewise sampler's shim in place, its
    counts for the whole batch come in one host read (no sampling order changes: the
    assignment draws no random numbers)."""
    if not (to_sample and type(sampler).sample is iou_piecewise_sampler.sample
            and iou_piecewise_sampler.batchable(sampler)):
        return [sampler.sample(*args) for args in to_sample]
    counts = torch.stack([iou_piecewise_sampler.piece_counts(sampler, assign)
                          for assign, *_ in to_sample]).tolist()  # the one wait
    return [iou_piecewise_sampler.sample_with_counts(sampler, assign, boxes, gt_boxes, n)
            for (assign, boxes, gt_boxes, _), n in zip(to_sample, counts)]


def apply() -> bool:
    from mmdet3d.models.roi_heads import PVRCNNRoiHead
    return replace_method(PVRCNNRoiHead, '_assign_and_sample', assign_and_sample)
