"""mmdet 3.3.0: ``MaxIoUAssigner`` makes the CPU wait for the GPU once per ground truth.

``MaxIoUAssigner.assign_wrt_overlaps`` (also behind mmdet3d's ``Max3DIoUAssigner``, which
SECOND, PointPillars, Part-A2 and PV-RCNN use for their anchors and RoIs) matches low
quality boxes in a Python loop over the ground truths whose ``if`` reads one value of a
GPU tensor each time, and finds the positive priors for their labels with ``nonzero``:
one host wait per ground-truth box and call, plus one. Counted on PV-RCNN's training
step (ObjectSample pastes up to 35 objects a scene): 60 of the step's waits a sample.
A host-bound model loses its CPU / GPU overlap at every one, and in DDP each is also a
point where the ranks wait for each other.

The patch replaces the method with one that computes the same assignment from whole-tensor
operations (``torch.where``, ``amax``, ``scatter_reduce``) and no host read: later ground
truths still win over earlier ones where the loop would overwrite, ties at a ground
truth's best IoU are matched the same way. Equality with the original, ties and
``gt_max_assign_all=False`` included, is tested in
``tests/patches/speed/test_max_iou_assigner.py``.
"""
from typing import Optional

import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet==3.3.0'


def _low_quality_matches(overlaps: Tensor, gt_max: Tensor, gt_argmax: Tensor,
                         min_pos_iou: float, assign_all: bool) -> Tensor:
    """Per prior, 1 + the last ground truth the low-quality loop would give it, or 0."""
    num_gts, num_priors = overlaps.shape
    ids = torch.arange(1, num_gts + 1, device=overlaps.device)
    ids = torch.where(gt_max >= min_pos_iou, ids, 0)  # gts under min_pos_iou match none
    if assign_all:  # every prior at the gt's best IoU, ties included
        at_best = overlaps == gt_max[:, None]
        return torch.where(at_best, ids[:, None].int(), 0).amax(dim=0).long()
    last = overlaps.new_zeros(num_priors, dtype=torch.long)
    return last.scatter_reduce(0, gt_argmax, ids, reduce='amax')


def assign_wrt_overlaps(self, overlaps: Tensor, gt_labels: Optional[Tensor]):
    """``MaxIoUAssigner.assign_wrt_overlaps`` without host reads (see module doc)."""
    from mmdet.models.task_modules.assigners.assign_result import AssignResult
    num_gts, num_priors = overlaps.shape
    if num_gts == 0 or num_priors == 0 or gt_labels is None:
        return assign_wrt_overlaps.original(self, overlaps, gt_labels)

    max_overlaps, argmax_overlaps = overlaps.max(dim=0)
    gt_max_overlaps, gt_argmax_overlaps = overlaps.max(dim=1)
    gt_inds = overlaps.new_full((num_priors, ), -1, dtype=torch.long)
    if isinstance(self.neg_iou_thr, float):
        negative = (max_overlaps >= 0) & (max_overlaps < self.neg_iou_thr)
    elif isinstance(self.neg_iou_thr, tuple):
        low, high = self.neg_iou_thr
        negative = (max_overlaps >= low) & (max_overlaps < high)
    else:
        negative = torch.zeros_like(max_overlaps, dtype=torch.bool)
    gt_inds = torch.where(negative, 0, gt_inds)
    gt_inds = torch.where(max_overlaps >= self.pos_iou_thr, argmax_overlaps + 1, gt_inds)
    if self.match_low_quality:
        matched = _low_quality_matches(overlaps, gt_max_overlaps, gt_argmax_overlaps,
                                       self.min_pos_iou, self.gt_max_assign_all)
        gt_inds = torch.where(matched > 0, matched, gt_inds)

    positive = gt_inds > 0
    labels = gt_labels[(gt_inds - 1).clamp(min=0)].to(torch.long)
    labels = torch.where(positive, labels, -1)
    return AssignResult(num_gts=num_gts, gt_inds=gt_inds, max_overlaps=max_overlaps,
                        labels=labels)


PATCH = declare(method_patch(
    'max_iou_assigner', 'speed', 'mmdet.models.task_modules.assigners:MaxIoUAssigner',
    'assign_wrt_overlaps', assign_wrt_overlaps, UPSTREAM,
    why='MaxIoUAssigner waits on the GPU once per ground truth: same result, no host read'))
