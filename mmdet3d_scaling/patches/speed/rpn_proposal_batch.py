"""mmdet3d 1.4.0: ``PartA2RPNHead`` decodes and suppresses its proposals sample by sample.

PV-RCNN's and Part-A2's RPN (``predict_by_feat``, in training and testing) decodes each
sample's anchors (``_predict_by_feat_single``: top-k by score, box decoding, BEV boxes
with one host wait for the column index, ~60 kernels) and calls ``class_agnostic_nms``
for it: a score threshold, a rotated NMS over ~9,000 boxes, the direction fix and the
``nms_post`` cut, with their host reads, eight times a PV-RCNN batch of 8. The rotated
NMS of the whole batch in one grouped call takes 10.3 ms on an H200 against 43.4 ms for
the eight calls (docs/data/nms_rotated_h200.json).

The patch decodes the whole batch at once with the same row-wise operations (sigmoid,
max over classes and directions, the same box coder and box type), keeping only the
top-k selection per sample, as mmdet3d calls it, and the per-sample quirk that the
top-k path keeps the sigmoid scores and the other path the raw logits as ``cls_preds``.
It then runs the NMS of all samples in one call of :func:`mmdet3d_scaling.ops.nms_bev`
with the sample as the group (boxes of different samples never suppress each other;
each sample keeps what mmdet3d's ``nms_bev`` keeps for it, in its order), and finishes
each sample as ``class_agnostic_nms`` does. Three host reads a batch instead of several
a sample. It runs only where the result is the same by construction: sigmoid scores,
mmdet3d's ``DeltaXYZWLHRBBoxCoder`` and box types, rotated NMS (``use_rotate_nms``),
mmdet3d's own ``_predict_by_feat_single`` and ``class_agnostic_nms`` (or the
``rpn_proposal_nms`` patch of it), and a box above the score threshold in every sample;
otherwise the decoding, or the decoding and the NMS, run sample by sample as in mmdet3d.
Equality with the loop is tested in ``tests/patches/speed/test_rpn_proposal_batch.py``.
"""
from typing import Any, List, Optional, Sequence

import torch
from torch import Tensor

from ..patching import declare, method_patch
from .rpn_proposal_nms import class_agnostic_nms as one_wait_nms
from .rpn_proposal_nms import proposals

UPSTREAM = 'mmdet3d==1.4.0'


def _own_code(head) -> bool:
    """The head decodes and finishes proposals with mmdet3d's code (or our patch's)."""
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


def _decodable(head, cls_scores: Sequence[Tensor], bbox_preds: Sequence[Tensor],
               dir_cls_preds: Optional[Sequence[Tensor]], metas, cfg) -> bool:
    """Whether :func:`decode_the_batch` computes what mmdet3d's per-sample loop does."""
    from mmdet3d.models.task_modules import DeltaXYZWLHRBBoxCoder
    from mmdet3d.structures import (CameraInstance3DBoxes, DepthInstance3DBoxes,
                                    LiDARInstance3DBoxes)
    if cfg is None or dir_cls_preds is None or not metas or not head.use_sigmoid_cls:
        return False
    box_types = {meta.get('box_type_3d') for meta in metas}
    own_types = {CameraInstance3DBoxes, DepthInstance3DBoxes, LiDARInstance3DBoxes}
    return (type(head.bbox_coder) is DeltaXYZWLHRBBoxCoder and len(box_types) == 1
            and box_types <= own_types
            and len(cls_scores) == len(bbox_preds) == len(dir_cls_preds)
            and all(c.size(0) == len(metas) and c.shape[-2:] == b.shape[-2:] == d.shape[-2:]
                    for c, b, d in zip(cls_scores, bbox_preds, dir_cls_preds)))


def _rows(prediction: Tensor, width: int) -> Tensor:
    """(B, A * width, H, W) -> (B, H * W * A, width): each sample's rows in mmdet3d's
    order (its ``permute(1, 2, 0).reshape(-1, width)`` of one sample)."""
    return prediction.detach().permute(0, 2, 3, 1).reshape(prediction.size(0), -1, width)


def decode_the_batch(head, cls_scores: Sequence[Tensor], bbox_preds: Sequence[Tensor],
                     dir_cls_preds: Sequence[Tensor], metas: List[dict],
                     cfg) -> List[tuple]:
    """The arguments mmdet3d's ``_predict_by_feat_single`` hands ``class_agnostic_nms``,
    for every sample, decoded for the batch at once (row-wise operations on the same
    rows; the top-k selection per sample, as mmdet3d calls it)."""
    from mmdet3d.structures import xywhr2xyxyr
    batch, code, nms_pre = len(metas), head.box_code_size, cfg.get('nms_pre', -1)
    priors = head.prior_generator.grid_anchors([c.shape[-2:] for c in cls_scores],
                                               device=cls_scores[0].device)
    levels = []
    for cls_score, bbox_pred, dir_pred, anchors in zip(cls_scores, bbox_preds,
                                                        dir_cls_preds, priors):
        anchors = anchors.reshape(-1, code)
        directions = torch.max(_rows(dir_pred, 2), dim=-1)[1]
        cls_preds = _rows(cls_score, head.num_classes)  # raw logits unless top-k below
        scores = cls_preds.sigmoid()
        deltas = _rows(bbox_pred, code)
        max_scores, labels = scores.max(dim=-1)
        if 0 < nms_pre < scores.size(1):
            top = [sample_scores.topk(nms_pre) for sample_scores in max_scores]
            max_scores = torch.stack([values for values, _ in top])
            picked = torch.stack([indices for _, indices in top])
            rows = torch.arange(batch, device=picked.device)[:, None]
            anchors, deltas = anchors[picked], deltas[rows, picked]
            cls_preds = scores[rows, picked]  # mmdet3d keeps the sigmoid scores here
            directions, labels = directions[rows, picked], labels[rows, picked]
        else:
            anchors = anchors.expand(batch, -1, -1)
        boxes = head.bbox_coder.decode(anchors.reshape(-1, code), deltas.reshape(-1, code))
        levels.append((boxes.view(batch, -1, code), max_scores, labels, directions,
                       cls_preds))
    boxes, max_scores, labels, directions, cls_preds = [
        torch.cat(parts, dim=1) for parts in zip(*levels)]
    box_type = metas[0]['box_type_3d']
    for_nms = xywhr2xyxyr(box_type(boxes.reshape(-1, code), box_dim=code).bev)
    for_nms = for_nms.view(batch, boxes.size(1), -1)
    score_thr = cfg.get('score_thr', 0)
    return [(boxes[i], for_nms[i], max_scores[i], labels[i], cls_preds[i], directions[i],
             score_thr, cfg, metas[i]) for i in range(batch)]


def predict_by_feat(self, cls_scores, bbox_preds, dir_cls_preds=None,
                    batch_input_metas=None, cfg=None, rescale=False, **kwargs):
    """``predict_by_feat`` with the batch decoded at once and the proposal NMS of all
    samples in one call."""
    args = (cls_scores, bbox_preds, dir_cls_preds)
    if not _own_code(self):
        return predict_by_feat.original(self, *args, batch_input_metas=batch_input_metas,
                                        cfg=cfg, rescale=rescale, **kwargs)
    if not kwargs and _decodable(self, *args, batch_input_metas, cfg):
        return nms_of_the_batch(self, decode_the_batch(self, *args, batch_input_metas, cfg))
    calls: List[tuple] = []

    def collect(*nms_args):
        calls.append(nms_args)
        return len(calls) - 1

    self.class_agnostic_nms = collect  # the instance's, for this call only
    try:
        tickets = predict_by_feat.original(self, *args, batch_input_metas=batch_input_metas,
                                           cfg=cfg, rescale=rescale, **kwargs)
    finally:
        del self.class_agnostic_nms
    results = nms_of_the_batch(self, calls) if calls else []
    return [results[t] for t in tickets]


PATCH = declare(method_patch(
    'rpn_proposal_batch', 'speed', 'mmdet3d.models.dense_heads:PartA2RPNHead',
    'predict_by_feat', predict_by_feat, UPSTREAM,
    why="PartA2RPNHead decodes and suppresses proposals sample by sample: the batch "
        'decoded at once and one grouped NMS, the same proposals'))
