"""mmdet3d 1.4.0: ``nms_bev`` (mmcv's ``nms_rotated``) computes the IoU of every box pair.

mmdet3d's rotated BEV NMS (PV-RCNN's and Part-A2's RPN proposals, once a sample in
training and testing; PV-RCNN's and Part-A2's box heads, CenterPoint, PointRCNN and the
test-time-augmentation merge at test time) calls mmcv's ``nms_rotated``, whose CUDA kernel
computes the rotated IoU of all n x n pairs (9,000 proposals a sample in PV-RCNN's
training: 81 M IoUs, 18 % of its GPU time on an H200) and copies an n x n/64 mask to the
host. The patch routes every module-level ``nms_bev`` of mmdet3d to
:func:`mmdet3d_scaling.ops.nms_bev`, which computes the IoU only of pairs whose bounds
overlap (the others have an IoU of exactly 0 in mmcv's code) and returns the same
indices in the same order (``tests/ops/test_nms_rotated.py``,
``tests/patches/speed/test_nms_bev.py``). Inputs outside its domain go to the original.
"""
import numbers
from typing import List, Optional

from torch import Tensor

from ..patching import Change, Patch, declare, resolve_owner

UPSTREAM = ('mmdet3d==1.4.0', 'mmcv==2.1.0')
#: the modules that bind mmdet3d's ``nms_bev`` (its own, then each importer's name)
MODULES = ('mmdet3d.models.layers.box3d_nms', 'mmdet3d.models.layers',
           'mmdet3d.models.dense_heads.parta2_rpn_head',
           'mmdet3d.models.dense_heads.point_rpn_head',
           'mmdet3d.models.dense_heads.centerpoint_head',
           'mmdet3d.models.roi_heads.bbox_heads.pv_rcnn_bbox_head',
           'mmdet3d.models.roi_heads.bbox_heads.parta2_bbox_head',
           'mmdet3d.models.roi_heads.bbox_heads.point_rcnn_bbox_head',
           'mmdet3d.models.test_time_augs.merge_augs')


#: below this many boxes (after ``pre_max_size``) on a GPU, mmcv's all-pairs kernel is
#: faster than the candidate-pair path and its host reads (one H200: 1,024 boxes x 8
#: samples 8.8 ms upstream vs 42 ms; 9,000 x 8 96 ms vs 43 ms,
#: docs/data/nms_rotated_h200.json); both give the same indices
CUDA_MIN_BOXES = 4096


def _size_ok(value) -> bool:
    return value is None or (isinstance(value, numbers.Integral) and value > 0)


def nms_bev(boxes: Tensor, scores: Tensor, thresh: float,
            pre_max_size: Optional[int] = None,
            post_max_size: Optional[int] = None) -> Tensor:
    """mmdet3d's ``nms_bev`` with IoUs only for pairs whose bounds overlap; the same
    indices. Empty inputs, non-positive sizes, malformed shapes (its (1, 0) answer to an
    empty NMS input, its errors) and, on a GPU, fewer than :data:`CUDA_MIN_BOXES` boxes
    go to the original."""
    from mmdet3d_scaling.ops import nms_bev as fast_nms_bev
    if (boxes.dim() != 2 or boxes.shape[1] != 5 or scores.shape != boxes.shape[:1]
            or boxes.shape[0] == 0 or not _size_ok(pre_max_size)
            or not _size_ok(post_max_size)
            or (boxes.is_cuda and min(boxes.shape[0], pre_max_size or boxes.shape[0])
                < CUDA_MIN_BOXES)):
        return nms_bev.original(boxes, scores, thresh, pre_max_size, post_max_size)
    return fast_nms_bev(boxes, scores, thresh, pre_max_size=pre_max_size,
                        post_max_size=post_max_size)


def _changes() -> List[Change]:
    return [Change(resolve_owner(m), 'nms_bev', nms_bev) for m in MODULES]


nms_bev.original = resolve_owner(MODULES[0]).nms_bev  # mmdet3d's, for fallbacks and tests


PATCH = declare(Patch(
    name='nms_bev', kind='speed', targets=tuple(f'{m}.nms_bev' for m in MODULES),
    upstream=UPSTREAM, changes=_changes,
    why='rotated NMS computes the IoU of all n x n box pairs (18 % of PV-RCNN GPU '
        'time): only pairs whose bounds overlap, same indices'))
