"""mmdet3d 1.4.0: PV-RCNN's RoI assignment waits on the GPU ~18 times a sample.

``PVRCNNRoIHead._assign_and_sample`` assigns each sample's proposals class by class:
per class it takes the proposals and the ground truths of that class with two boolean
masks on ``InstanceData`` (a host wait each), the ground truths' indices with
``nonzero`` (one more) and writes the class's assignment back through the proposal mask
three times (``x[mask] = values``: an index computed from the mask each time). With 3
classes that is ~18 host waits a sample.

With PV-RCNN's assigners (``Max3DIoUAssigner`` on ``BboxOverlaps3D``, one a class) the
patch assigns the whole batch at once: one 3D IoU of all ground truths with all
proposals (each pair computed on its own, as in a per-sample call; the same-sample
blocks kept), then per class the assigner's rules on the pairs of that class (the
shared ``assign_masked``: same negatives, positives, low-quality matches and ties) --
a few dozen operators a batch instead of ~50 a sample and class, and no host wait (on a
GPU: on a CPU, where mmcv's rotated IoU runs an operator a box pair and host reads are
free, the class split below is faster and used instead). Other per-class assigners get
the class split too: proposals and ground truths grouped by
label with one stable sort, every sample's per-class counts read at once, the
assigners themselves run on the same rows. Either way the same sampler follows (the IoU
piecewise sampler's counts for the whole batch, and the ground-truth counts, in one
host read, see ``iou_piecewise_sampler``). Side effect kept: like upstream, it replaces
each ground truth's ``bboxes_3d`` by its tensor. A single (not per-class) assigner goes
to the original. Equality of every ``SamplingResult`` field is tested in
``tests/patches/speed/test_roi_assign.py``.
"""
from typing import List

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.nn.utils.rnn import pad_sequence

from . import iou_piecewise_sampler
from . import _batched_assign
from ._batched_assign import assign_masked
from ..patching import declare, method_patch
from .instance_data_index import take_rows

UPSTREAM = 'mmdet3d==1.4.0'
# On a CPU mmcv's rotated IoU runs an operator a box pair and a host read costs nothing:
# there the class split (fewer pairs) is the faster path; the batched one is for GPUs.
BATCHED_ON_CPU = False


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


def _batchable(assigners) -> bool:
    """Per-class ``Max3DIoUAssigner``s on one 3D IoU: the batched path computes exactly
    what they would."""
    from mmdet3d.models.task_modules import Max3DIoUAssigner
    from mmdet3d.structures import BboxOverlaps3D
    calculators = [a.iou_calculator for a in assigners]
    return (all(type(a) is Max3DIoUAssigner for a in assigners)
            and all(type(c) is BboxOverlaps3D and c.coordinate == calculators[0].coordinate
                    for c in calculators))


def _assign_batch(assigners, proposal_list, gts_list):
    """Every sample's per-class assignment at once: the IoU of all ground truths with all
    proposals of the batch (its same-sample blocks kept), then the assigner's rules per
    class on the pairs of that class. No host wait; the ground-truth counts
    (``num_gts``) stay on the device, (B, )."""
    from mmdet.models.task_modules import AssignResult
    boxes = [p.bboxes_3d.tensor for p in proposal_list]
    device = boxes[0].device
    labels = pad_sequence([p.labels_3d.to(device) for p in proposal_list], batch_first=True,
                          padding_value=-1)
    gt_labels = pad_sequence([g.labels_3d.to(device) for g in gts_list], batch_first=True,
                             padding_value=-1)
    batch, num_props = labels.shape
    gt_inds = gt_labels.new_zeros((batch, num_props))  # 0: background
    max_overlaps = boxes[0].new_zeros((batch, num_props))
    if gt_labels.size(1) > 0 and num_props > 0:
        iou = _same_sample_iou(assigners[0].iou_calculator, boxes,
                               [g.bboxes_3d.to(device) for g in gts_list])
        for cls, assigner in enumerate(assigners):
            mine = labels == cls
            valid = (gt_labels == cls)[:, :, None] & mine[:, None, :]
            cls_inds, cls_overlaps = assign_masked(assigner, iou, valid)
            gt_inds = torch.where(mine, cls_inds.to(gt_inds.dtype), gt_inds)
            max_overlaps = torch.where(mine, cls_overlaps.to(max_overlaps.dtype),
                                       max_overlaps)
        matched = gt_labels.gather(1, (gt_inds - 1).clamp(min=0))
        assigned_labels = torch.where(gt_inds > 0, matched, -1)
    else:
        assigned_labels = torch.full_like(gt_inds, -1)
    num_gts = ((gt_labels >= 0) & (gt_labels < len(assigners))).sum(1)
    return [AssignResult(0, gt_inds[b, :len(rows)], max_overlaps[b, :len(rows)],
                         assigned_labels[b, :len(rows)])
            for b, rows in enumerate(boxes)], num_gts


def _same_sample_iou(calculator, boxes: List[Tensor], gt_boxes: List[Tensor]) -> Tensor:
    """(B, G, P): each sample's (padded) ground truths against its (padded) proposals,
    taken from one IoU of the whole batch's (each pair computed on its own, as in a
    per-sample call), or sample by sample where that IoU would exceed ``MAX_PAIRS``.
    Padding rows are unit boxes, never matched."""
    props = pad_sequence(boxes, batch_first=True, padding_value=1.)
    gts = pad_sequence(gt_boxes, batch_first=True, padding_value=1.)
    (batch, num_props, code), num_gts = props.shape, gts.size(1)
    if batch * batch * num_gts * num_props > _batched_assign.MAX_PAIRS:  # one by one
        return torch.stack([calculator(g, p) for g, p in zip(gts, props)])
    iou = calculator(gts.reshape(-1, code), props.reshape(-1, code))
    return torch.diagonal(iou.view(batch, num_gts, batch, num_props), dim1=0,
                          dim2=2).permute(2, 0, 1)


def _assign_split(assigners, proposal_list, gts_list):
    """Any per-class assigners: each sample's classes split with one host wait a batch,
    then the assigners themselves."""
    num_classes = len(assigners)
    splits = [(_by_label(p.labels_3d, num_classes), _by_label(g.labels_3d, num_classes))
              for p, g in zip(proposal_list, gts_list)]
    counts = torch.stack([c.to(splits[0][0][1].device) for pair in splits
                          for _, c in pair]).tolist()  # the one host wait
    assigns = []
    for i, (proposals, gts) in enumerate(zip(proposal_list, gts_list)):
        (pred_order, _), (gt_order, _) = splits[i]
        pred_rows = _split(pred_order, counts[2 * i], num_classes)
        gt_rows = _split(gt_order, counts[2 * i + 1], num_classes)
        assigns.append(_assign_per_class(assigners, proposals, gts, pred_rows, gt_rows))
    return assigns, [a.num_gts for a in assigns]


def assign_and_sample(self, proposal_list, batch_gt_instances_3d):
    """``PVRCNNRoIHead._assign_and_sample`` with one host wait a batch (see the module
    doc)."""
    assigners = self.bbox_assigner
    if not isinstance(assigners, list):
        return assign_and_sample.original(self, proposal_list, batch_gt_instances_3d)
    if not proposal_list:
        return []
    for gts in batch_gt_instances_3d:
        gts.bboxes_3d = gts.bboxes_3d.tensor  # as upstream: later steps expect a tensor
    on_cpu = proposal_list[0].bboxes_3d.tensor.device.type == 'cpu'
    batched = _batchable(assigners) and (BATCHED_ON_CPU or not on_cpu)
    assign = _assign_batch if batched else _assign_split
    assigns, num_gts = assign(assigners, proposal_list, batch_gt_instances_3d)
    to_sample = [(a, p.bboxes_3d.tensor, g.bboxes_3d.to(p.bboxes_3d.device), g.labels_3d)
                 for a, p, g in zip(assigns, proposal_list, batch_gt_instances_3d)]
    return _sample_batch(self.bbox_sampler, to_sample, num_gts)


def _sample_batch(sampler, to_sample: list, num_gts) -> list:
    """Sample every sample's RoIs. ``num_gts`` (ints, or a device tensor still to read)
    goes into the assign results first. With the IoU piecewise sampler's patch in place,
    its counts for the whole batch come in the same single host read (no sampling order
    changes: the assignment draws no random numbers)."""
    on_device = isinstance(num_gts, Tensor)
    batched = (type(sampler).sample is iou_piecewise_sampler.sample
               and iou_piecewise_sampler.batchable(sampler))
    counts = None
    if batched:
        counts = torch.stack([iou_piecewise_sampler.piece_counts(sampler, assign)
                              for assign, *_ in to_sample])
        if on_device:
            counts = torch.cat([counts, num_gts[:, None].to(counts)], dim=1)
        counts = counts.tolist()  # the one wait
        if on_device:
            num_gts, counts = [c[-1] for c in counts], [c[:-1] for c in counts]
    elif on_device:
        num_gts = num_gts.tolist()  # the one wait
    for (assign, *_), n in zip(to_sample, num_gts):
        assign.num_gts = n
    if not batched:
        return [sampler.sample(*args) for args in to_sample]
    return [iou_piecewise_sampler.sample_with_counts(sampler, assign, boxes, gt_boxes, n)
            for (assign, boxes, gt_boxes, _), n in zip(to_sample, counts)]


PATCH = declare(method_patch(
    'roi_assign', 'speed', 'mmdet3d.models.roi_heads:PVRCNNRoiHead',
    '_assign_and_sample', assign_and_sample, UPSTREAM,
    why="PV-RCNN's per-class RoI assignment waits ~18 times a sample: one wait a batch"))
