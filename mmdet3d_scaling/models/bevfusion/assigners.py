"""Target assignment for ``TransFusionHead``: match costs and 3D assigners.

Registered in ``TASK_UTILS`` under upstream's names: ``BBoxBEVL1Cost``,
``IoU3DCost``, ``HungarianAssigner3D`` and ``HeuristicAssigner3D``.
"""
from typing import Optional, Tuple

import numpy as np
import torch
from mmdet.models.task_modules import AssignResult, BaseAssigner
from mmengine.structures import InstanceData
from torch import Tensor

from mmdet3d.registry import TASK_UTILS
from mmdet3d.structures import LiDARInstance3DBoxes
from mmdet3d.structures.ops import BboxOverlaps3D
from mmdet3d_scaling.registry import register


class _SlicedBevBoxes(LiDARInstance3DBoxes):
    """LiDAR boxes whose ``bev`` is built from slices: mmdet3d indexes with a Python
    list, which copies the index to the GPU and waits for it (two host waits an IoU)."""

    @property
    def bev(self) -> Tensor:
        t = self.tensor
        return torch.cat([t[:, 0:2], t[:, 3:5], t[:, 6:7]], dim=1)


def lidar_iou_3d(bboxes1: Tensor, bboxes2: Tensor) -> Tensor:
    """``BboxOverlaps3D(coordinate='lidar')(bboxes1, bboxes2)``: mmdet3d's own
    ``overlaps`` on the same values, without its host waits."""
    b1 = _SlicedBevBoxes(bboxes1, box_dim=bboxes1.shape[-1])
    b2 = _SlicedBevBoxes(bboxes2, box_dim=bboxes2.shape[-1])
    return _SlicedBevBoxes.overlaps(b1, b2, mode='iou')


def _device_constant(cache: dict, values, like: Tensor) -> Tensor:
    """``like.new_tensor(values)``, made once per device and dtype: each new tensor
    from Python values is a blocking host-to-device copy."""
    key = (like.device, like.dtype)
    if key not in cache:
        cache[key] = like.new_tensor(values)
    return cache[key]


@register(TASK_UTILS)
class BBoxBEVL1Cost:
    """L1 distance of BEV centres, normalised by the point-cloud range.

    Args:
        weight (float): cost weight.
    """

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self._ranges: dict = {}

    def __call__(self, bboxes: Tensor, gt_bboxes: Tensor, train_cfg: dict) -> Tensor:
        """``[P, >=2]`` and ``[G, >=2]`` boxes -> ``[P, G]`` weighted cost."""
        ranges = self._ranges.setdefault(tuple(train_cfg['point_cloud_range']), {})
        pcr = _device_constant(ranges, train_cfg['point_cloud_range'], bboxes)
        start, extent = pcr[0:2], pcr[3:5] - pcr[0:2]
        pred = (bboxes[:, :2] - start) / extent
        gt = (gt_bboxes[:, :2] - start) / extent
        return torch.cdist(pred, gt, p=1) * self.weight


@register(TASK_UTILS)
class IoU3DCost:
    """Negative IoU as a cost.

    Args:
        weight (float): cost weight.
    """

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def __call__(self, iou: Tensor) -> Tensor:
        return -iou * self.weight


def solve_matching(cost: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """scipy's minimum-cost matching of a ``[P, G]`` host cost matrix: matched rows
    (ascending) and their columns, as int64 arrays."""
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError as err:
        raise ImportError('HungarianAssigner3D needs scipy: pip install scipy') from err
    rows, cols = linear_sum_assignment(cost)
    return rows.astype(np.int64), cols.astype(np.int64)


@register(TASK_UTILS)
class HungarianAssigner3D(BaseAssigner):
    """One-to-one matching of proposals to ground truth (Hungarian algorithm).

    cost = cls_cost(logits, labels) + reg_cost(BEV centres) + iou_cost(3D IoU).

    Args:
        cls_cost (dict): classification cost, e.g. ``mmdet.FocalLossCost``.
        reg_cost (dict): ``BBoxBEVL1Cost`` config.
        iou_cost (dict): ``IoU3DCost`` config.
        iou_calculator (dict): 3D IoU, e.g. ``BboxOverlaps3D(coordinate='lidar')``.
    """

    def __init__(self,
                 cls_cost: dict = dict(type='mmdet.ClassificationCost', weight=1.),
                 reg_cost: dict = dict(type='BBoxBEVL1Cost', weight=1.0),
                 iou_cost: dict = dict(type='IoU3DCost', weight=1.0),
                 iou_calculator: dict = dict(type='BboxOverlaps3D',
                                             coordinate='lidar')) -> None:
        self.cls_cost = TASK_UTILS.build(cls_cost)
        self.reg_cost = TASK_UTILS.build(reg_cost)
        self.iou_cost = TASK_UTILS.build(iou_cost)
        self.iou_calculator = TASK_UTILS.build(iou_calculator)
        # mmdet3d's LiDAR IoU without its host waits (same values, tests compare)
        self._iou = lidar_iou_3d if (type(self.iou_calculator) is BboxOverlaps3D and
                                     self.iou_calculator.coordinate == 'lidar') \
            else self.iou_calculator

    def match_cost(self, bboxes: Tensor, gt_bboxes: Tensor, gt_labels: Tensor,
                   cls_pred: Tensor, train_cfg: dict) -> Tuple[Tensor, Tensor]:
        """``[P, G]`` match cost and 3D IoU of proposals and gt boxes (on their
        device, no host read); arguments as :meth:`assign`."""
        if len(gt_bboxes) == 0 or len(bboxes) == 0:
            empty = bboxes.new_zeros(len(bboxes), len(gt_bboxes))
            return empty, empty
        cls_cost = self.cls_cost(InstanceData(scores=cls_pred[0].T),
                                 InstanceData(labels=gt_labels))
        reg_cost = self.reg_cost(bboxes, gt_bboxes, train_cfg)
        iou = self._iou(bboxes, gt_bboxes)
        return cls_cost + reg_cost + self.iou_cost(iou), iou

    def assign(self, bboxes: Tensor, gt_bboxes: Tensor, gt_labels: Tensor,
               cls_pred: Tensor, train_cfg: dict) -> AssignResult:
        """Assign ``[P, D]`` decoded proposals to ``[G, D]`` gt boxes.

        Args:
            cls_pred (Tensor): ``[1, K, P]`` class logits of the proposals.
            train_cfg (dict): the head's train_cfg (needs ``point_cloud_range``).

        Returns:
            AssignResult: gt_inds 0 = background, i+1 = gt i; max_overlaps = IoU with
            the matched gt (0 for background).
        """
        num_gts, num_bboxes = gt_bboxes.size(0), bboxes.size(0)
        gt_inds = bboxes.new_zeros(num_bboxes, dtype=torch.long)
        labels = bboxes.new_full((num_bboxes, ), -1, dtype=torch.long)
        overlaps = bboxes.new_zeros(num_bboxes)
        if num_gts == 0 or num_bboxes == 0:  # every proposal is background
            return AssignResult(num_gts, gt_inds, overlaps, labels=labels)

        cost, iou = self.match_cost(bboxes, gt_bboxes, gt_labels, cls_pred, train_cfg)
        rows, cols = solve_matching(cost.detach().cpu().numpy())
        rows = torch.from_numpy(rows).to(bboxes.device)
        cols = torch.from_numpy(cols).to(bboxes.device)
        gt_inds[rows] = cols + 1
        labels[rows] = gt_labels[cols]
        overlaps[rows] = iou[rows, cols].to(overlaps.dtype)
        return AssignResult(num_gts, gt_inds, overlaps, labels=labels)


@register(TASK_UTILS)
class HeuristicAssigner3D(BaseAssigner):
    """Assign each gt box to its nearest proposal in BEV (optionally same class).

    Args:
        dist_thre (float): largest BEV centre distance of a match (m). Defaults to 100.
        iou_calculator (dict): 3D IoU config for ``max_overlaps``.
    """

    def __init__(self, dist_thre: float = 100,
                 iou_calculator: dict = dict(type='BboxOverlaps3D',
                                             coordinate='lidar')) -> None:
        self.dist_thre = dist_thre
        self.iou_calculator = TASK_UTILS.build(iou_calculator)

    def assign(self,
               bboxes: Tensor,
               gt_bboxes: Tensor,
               gt_bboxes_ignore: Optional[Tensor] = None,
               gt_labels: Optional[Tensor] = None,
               query_labels: Optional[Tensor] = None) -> AssignResult:
        """Assign ``[P, D]`` proposals; ``query_labels`` ``[P]`` restricts matches to
        proposals of the gt's class (needs ``gt_labels``)."""
        num_gts, num_bboxes = len(gt_bboxes), len(bboxes)
        gt_inds = bboxes.new_zeros(num_bboxes, dtype=torch.long)
        labels = bboxes.new_full((num_bboxes, ), -1, dtype=torch.long)
        overlaps = bboxes.new_zeros(num_bboxes)
        if num_gts == 0 or num_bboxes == 0:
            return AssignResult(num_gts, gt_inds, overlaps, labels=labels)

        dist = torch.cdist(gt_bboxes[:, :2].to(bboxes.dtype), bboxes[:, :2])  # [G, P]
        if query_labels is not None:
            if gt_labels is None:
                raise ValueError('HeuristicAssigner3D: query_labels need gt_labels.')
            dist = dist + (query_labels[None] != gt_labels[:, None]) * self.dist_thre
        nearest_dist, nearest = dist.min(dim=1)
        best = bboxes.new_full((num_bboxes, ), float('inf'))
        for g in range(num_gts):  # a proposal keeps its closest gt
            p = nearest[g]
            if nearest_dist[g] <= self.dist_thre and nearest_dist[g] < best[p]:
                best[p] = nearest_dist[g]
                gt_inds[p] = g + 1
                if gt_labels is not None:
                    labels[p] = gt_labels[g]
        matched = torch.nonzero(gt_inds > 0).squeeze(1)
        if matched.numel():
            iou = self.iou_calculator(gt_bboxes[gt_inds[matched] - 1], bboxes[matched])
            overlaps[matched] = iou.diag().to(overlaps.dtype)
        return AssignResult(num_gts, gt_inds, overlaps, labels=labels)


__all__ = ['BBoxBEVL1Cost', 'IoU3DCost', 'HungarianAssigner3D', 'HeuristicAssigner3D']
