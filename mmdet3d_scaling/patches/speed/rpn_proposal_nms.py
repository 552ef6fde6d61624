"""mmdet3d 1.4.0: ``PartA2RPNHead.class_agnostic_nms`` waits on the GPU six times a sample.

PV-RCNN's and Part-A2's RPN turn each sample's anchor predictions into proposals with
``class_agnostic_nms``, which indexes six tensors with the same boolean score mask, one
``nonzero`` (a host wait) per tensor. Counted on PV-RCNN on an H200: 48 of a micro-batch's
295 host reads (8 samples). The patch takes the mask's indices once and gathers every
tensor with them: one wait, then the same NMS, the same direction fix, the same
``nms_post`` cut by score and the same result fields, dtypes included (equality with the
original is tested in ``tests/patches/speed/test_rpn_proposal_nms.py``).
"""
import numpy as np
import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'


def _result(boxes: Tensor, scores: Tensor, labels: Tensor, cls_scores: Tensor,
            box_type: type, box_dim: int):
    from mmengine.structures import InstanceData
    result = InstanceData()
    result.bboxes_3d = box_type(boxes, box_dim=box_dim)
    result.scores_3d = scores
    result.labels_3d = labels
    result.cls_preds = cls_scores
    return result


def class_agnostic_nms(self, mlvl_bboxes: Tensor, mlvl_bboxes_for_nms: Tensor,
                       mlvl_max_scores: Tensor, mlvl_label_pred: Tensor,
                       mlvl_cls_score: Tensor, mlvl_dir_scores: Tensor, score_thr: float,
                       cfg, input_meta: dict):
    """``PartA2RPNHead.class_agnostic_nms`` with one host read for the score mask."""
    from mmdet3d.models.layers import nms_bev, nms_normal_bev
    box_type, box_dim = input_meta['box_type_3d'], self.box_code_size
    above = torch.nonzero(mlvl_max_scores > score_thr).squeeze(1)  # the one wait
    nms = nms_bev if cfg.use_rotate_nms else nms_normal_bev
    selected = nms(mlvl_bboxes_for_nms[above], mlvl_max_scores[above], cfg.nms_thr)
    if len(selected) == 0:
        empty = mlvl_bboxes.new_zeros
        return _result(empty([0, box_dim]), empty([0]), empty([0]),
                       empty([0, mlvl_cls_score.shape[-1]]), box_type, box_dim)
    return proposals(self, above[selected], mlvl_bboxes, mlvl_max_scores, mlvl_label_pred,
                     mlvl_cls_score, mlvl_dir_scores, cfg, input_meta)


def proposals(head, keep: Tensor, bboxes: Tensor, scores: Tensor, labels: Tensor,
              cls_scores: Tensor, dir_scores: Tensor, cfg, input_meta: dict):
    """``class_agnostic_nms``'s result for the kept indices (at least one): upstream's
    direction fix of the yaw and ``nms_post`` cut by score."""
    from mmdet3d.structures import limit_period
    boxes, scores = bboxes[keep], scores[keep]
    labels, cls_scores = labels[keep], cls_scores[keep]
    yaw = limit_period(boxes[..., 6] - head.dir_offset, head.dir_limit_offset, np.pi)
    boxes[..., 6] = yaw + head.dir_offset + np.pi * dir_scores[keep].to(boxes.dtype)
    if boxes.shape[0] > cfg.nms_post:
        order = scores.sort(descending=True)[1][:cfg.nms_post]
        boxes, labels = boxes[order, :], labels[order]
        scores, cls_scores = scores[order], cls_scores[order]
    return _result(boxes, scores, labels, cls_scores, input_meta['box_type_3d'],
                   head.box_code_size)

PATCH = declare(method_patch(
    'rpn_proposal_nms', 'speed', 'mmdet3d.models.dense_heads:PartA2RPNHead',
    'class_agnostic_nms', class_agnostic_nms, UPSTREAM,
    why="PartA2RPNHead's proposal NMS waits on the GPU six times a sample: one wait"))
