"""mmdet3d 1.4.0: ``PartA2RPNHead`` runs its proposal NMS once per sample.

PV-RCNN's and Part-A2's RPN (``predict_by_feat``, in training and testing) decodes each
sample's anchors and calls ``class_agnostic_nms`` for it: a score threshold, a rotated
NMS over ~9,000 boxes, the direction fix and the ``nms_post`` cut, with their host reads,
eight times a PV-RCNN batch of 8. The rotated NMS of the whole batch in one grouped call
takes 10.3 ms on an H200 against 43.4 ms for the eight calls
(docs/data/nms_rotated_h200.json).

The patch lets mmdet3d's ``predict_by_feat`` decode every sample as it does, collects the
arguments of each ``class_agnostic_nms`` call instead of running it, and then runs the
NMS of all samples in one call of :func:`mmdet3d_scaling.ops.nms_bev` with the sample as
the group (boxes of different samples never suppress each other; each sample keeps what
mmdet3d's ``nms_bev`` keeps for it, in its order), and finishes each sample as
``class_agnostic_nms`` does. Three host reads a batch instead of several a sample. It
runs only where the result is the same by construction: rotated NMS
(``use_rotate_nms``), mmdet3d's own ``_predict_by_feat_single`` and
``class_agnostic_nms`` (or the ``rpn_proposal_nms`` patch of it), and a box above the
score threshold in every sample; otherwise mmdet3d's loop runs. Equality with the loop is
tested in ``tests/patches/speed/test_rpn_proposal_batch.py``.
"""
from typing import Any, List

import torch

from ..patching import declare, method_patch
from .rpn_proposal_nms import class_agnostic_nms as one_wait_nms
from .rpn_proposal_nms import proposals

UPSTREAM = 'mmdet3d 1.4.0'


def _own_code(head) -> bool:
    """The head decodes and finishes proposals with mmdet3d's code (or our shim's)."""
    from mmdet3d.models.dense_heads import PartA2RPNHead as rpn
    cls = type(head)
    nms = getattr(cls.class_agnostic_nms, 'original', cls.class_agnostic_nms)
    return (cls._predict_by_feat_single is rpn._predict_by_feat_single
            and nms in (one_wait_nms.original, rpn.class_agnostic_nms)
            and 'class_agnostic_nms' not in vars(head))


def nms_of_the_batch(head, calls: List[tuple]) -> List[Any]:
    """Each call's ``class_agnostic_nms`` result, with one NMS for all of them."""
    from mmdet3d_scaling.ops import nms_bev
    thresholds = [(c[6], c[7].nms_thr) for c in calls]
    masks = [c[2] > score_thr for c, (score_thr, _) in zip(calls, thresholds)]
    counts = torch.stack([m.sum() for m in masks]).tolist()  # host read 1
    if (len(set(thresholds)) != 1 or min(counts) == 0
            or not all(c[7].use_rotate_nms for c in calls)):
        return [one_wait_nms(head, *c) for c in calls]  # sample by sample, as mmdet3d
    device = masks[0].device
    above = torch.cat(masks).nonzero().squeeze(1)  # host read 2 (sizes known: counts)
    sizes = torch.tensor([len(m) for m in masks], device=device)
    starts = torch.cumsum(sizes, 0) - sizes
    sample = torch.repeat_interleave(torch.arange(len(calls), device=device),
                                     torch.tensor(counts, device=device),
                                     output_size=sum(counts))
    boxes = torch.cat([c[1] for c in calls])[above]
    scores = torch.cat([c[2] for c in calls])[above]
    keep = nms_bev(boxes, scores, thresholds[0][1], groups=sample)
    kept = torch.bincount(sample[keep], minlength=len(calls)).tolist()  # host read 3
    local = above[keep] - starts[sample[keep]]
    results = []
    for call, keep_i in zip(calls, local.split(kept)):
        bboxes, _, scores_i, labels, cls_scores, dir_scores, _, cfg, meta = call
        results.append(proposals(head, keep_i, bboxes, scores_i, labels, cls_scores,
                                 dir_scores, cfg, meta))
    return results


def predict_by_feat(self, *args, **kwargs):
    """``predict_by_feat`` with the proposal NMS of all samples in one call."""
    if not _own_code(self):
        return predict_by_feat.original(self, *args, **kwargs)
    calls: List[tuple] = []

    def collect(*nms_args):
        calls.append(nms_args)
        return len(calls) - 1

    self.class_agnostic_nms = collect  # the instance's, for this call only
    try:
        tickets = predict_by_feat.original(self, *args, **kwargs)
    finally:
        del self.class_agnostic_nms
    results = nms_of_the_batch(self, calls) if calls else []
    return [results[t] for t in tickets]


PATCH = declare(method_patch(
    'rpn_proposal_batch', 'speed', 'mmdet3d.models.dense_heads:PartA2RPNHead',
    'predict_by_feat', predict_by_feat, UPSTREAM,
    why="PartA2RPNHead's proposal NMS runs sample by sample: one grouped NMS for the "
        'batch, the same proposals'))
