"""``TransFusionBBoxCoder``: boxes <-> TransFusion regression targets."""
from typing import Dict, List, Optional, Sequence

import torch
from mmdet.models.task_modules import BaseBBoxCoder
from torch import Tensor

from mmdet3d.registry import TASK_UTILS
from mmdet3d_scaling.registry import register


@register(TASK_UTILS)
class TransFusionBBoxCoder(BaseBBoxCoder):
    """Encode LiDAR boxes as TransFusion targets and decode head outputs.

    Code layout (``code_size`` 8 or 10): x, y in BEV feature-map cells; z of the
    gravity centre in metres; log(dx), log(dy), log(dz); sin(yaw), cos(yaw); and, for
    10, vx, vy. Boxes are bottom-centred, as mmdet3d's ``LiDARInstance3DBoxes``.

    Args:
        pc_range (list[float]): x_min, y_min of the point-cloud range (m).
        out_size_factor (int): voxel grid cells per BEV feature-map cell.
        voxel_size (list[float]): voxel x, y size (m).
        post_center_range (list[float], optional): x/y/z min then max (m); decoded
            boxes whose centre lies outside are dropped when filtering. Defaults to
            None (no range filter).
        score_threshold (float, optional): boxes scoring at most this are dropped when
            filtering; as upstream, 0 and None both mean no threshold. Defaults to None.
        code_size (int): 8 (no velocity) or 10. Defaults to 8.
    """

    def __init__(self,
                 pc_range: Sequence[float],
                 out_size_factor: int,
                 voxel_size: Sequence[float],
                 post_center_range: Optional[Sequence[float]] = None,
                 score_threshold: Optional[float] = None,
                 code_size: int = 8) -> None:
        super().__init__()
        if code_size not in (8, 10):
            raise ValueError(f'code_size={code_size} must be 8 (no velocity) or 10.')
        self.pc_range = list(pc_range)
        self.out_size_factor = out_size_factor
        self.voxel_size = list(voxel_size)
        self.post_center_range = post_center_range
        self.score_threshold = score_threshold
        self.code_size = code_size

    def _cell(self, axis: int) -> float:
        return self.out_size_factor * self.voxel_size[axis]

    def encode(self, dst_boxes: Tensor) -> Tensor:
        """``[N, 7 or 9]`` bottom-centred boxes -> ``[N, code_size]`` targets."""
        targets = dst_boxes.new_zeros(dst_boxes.shape[0], self.code_size)
        targets[:, 0] = (dst_boxes[:, 0] - self.pc_range[0]) / self._cell(0)
        targets[:, 1] = (dst_boxes[:, 1] - self.pc_range[1]) / self._cell(1)
        targets[:, 2] = dst_boxes[:, 2] + dst_boxes[:, 5] * 0.5  # bottom -> gravity
        targets[:, 3:6] = dst_boxes[:, 3:6].log()
        targets[:, 6] = torch.sin(dst_boxes[:, 6])
        targets[:, 7] = torch.cos(dst_boxes[:, 6])
        if self.code_size == 10:
            targets[:, 8:10] = dst_boxes[:, 7:9]
        return targets

    def decode(self,
               heatmap: Tensor,
               rot: Tensor,
               dim: Tensor,
               center: Tensor,
               height: Tensor,
               vel: Optional[Tensor],
               filter: bool = False) -> List[Dict[str, Tensor]]:
        """Decode head outputs (inputs are not modified).

        Args:
            heatmap (Tensor): ``[B, K, P]`` class scores.
            rot (Tensor): ``[B, 2, P]`` sin, cos of yaw.
            dim (Tensor): ``[B, 3, P]`` log sizes.
            center (Tensor): ``[B, 2, P]`` BEV centre in feature-map cells.
            height (Tensor): ``[B, 1, P]`` gravity-centre z (m).
            vel (Tensor, optional): ``[B, 2, P]`` velocity (m/s).
            filter (bool): apply ``score_threshold`` and ``post_center_range``.

        Returns:
            list[dict]: per sample, ``bboxes`` ``[P', 7 or 9]`` (bottom-centred),
            ``scores`` ``[P']`` and ``labels`` ``[P']``.
        """
        scores, labels = heatmap.max(dim=1)
        x = center[:, 0:1] * self._cell(0) + self.pc_range[0]
        y = center[:, 1:2] * self._cell(1) + self.pc_range[1]
        sizes = dim.exp()
        z = height - sizes[:, 2:3] * 0.5  # gravity -> bottom centre
        yaw = torch.atan2(rot[:, 0:1], rot[:, 1:2])
        parts = [x, y, z, sizes, yaw] + ([vel] if vel is not None else [])
        boxes = torch.cat(parts, dim=1).permute(0, 2, 1)  # [B, P, 7 or 9]

        if not filter:  # no boolean mask: indexing with one would wait for the GPU
            return [dict(bboxes=boxes[i], scores=scores[i], labels=labels[i])
                    for i in range(heatmap.shape[0])]
        keep = torch.ones_like(scores, dtype=torch.bool)
        if self.score_threshold:
            keep &= scores > self.score_threshold
        if self.post_center_range is not None:
            limits = boxes.new_tensor(self.post_center_range)
            keep &= (boxes[..., :3] >= limits[:3]).all(-1)
            keep &= (boxes[..., :3] <= limits[3:]).all(-1)
        return [
            dict(bboxes=boxes[i][keep[i]], scores=scores[i][keep[i]],
                 labels=labels[i][keep[i]]) for i in range(heatmap.shape[0])
        ]
