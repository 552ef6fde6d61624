"""Hard voxelization for BEVFusion: one sort a batch (CPU and any CUDA arch)."""
from typing import List, Sequence, Tuple, Union

import torch
from mmcv.ops import Voxelization
from torch import Tensor, nn

from ...ops import hard_voxelize_batch

IMPLEMENTATIONS = ('sort', 'mmcv')


class BEVFusionVoxelizer(nn.Module):
    """Hard voxelization with upstream BEVFusion's semantics and index order.

    Points fill voxels in input order; a voxel keeps its first ``max_num_points``
    points; voxels beyond ``max_voxels`` (train, test) are dropped. Indices come out as
    (batch, x, y, z), which is the order of ``BEVFusionSparseEncoder``'s
    ``sparse_shape`` (mmcv's op itself returns z, y, x).

    Args:
        voxel_size (list[float]): x, y, z voxel size (m).
        point_cloud_range (list[float]): x/y/z min then max (m).
        max_num_points (int): points kept per voxel (> 0).
        max_voxels (int | tuple[int, int]): voxels kept per sample in training and
            testing. Defaults to 20000.
        voxelize_reduce (bool): return the mean of each voxel's points ``[M, C]``
            instead of the padded points ``[M, max_num_points, C]``. Defaults to True.
        deterministic (bool): upstream's deterministic voxels (False: mmcv's
            non-deterministic CUDA kernel, whose voxel order varies run to run).
            Defaults to True.
        implementation (str): ``'sort'``: the whole batch in one call of
            :func:`mmdet3d_scaling.ops.hard_voxelize_batch` (mmcv's deterministic
            results exactly, without its quadratic CUDA kernel); ``'mmcv'``: mmcv's op
            sample by sample, as upstream. Defaults to ``'sort'``.
    """

    def __init__(self,
                 voxel_size: Sequence[float],
                 point_cloud_range: Sequence[float],
                 max_num_points: int,
                 max_voxels: Union[int, Sequence[int]] = 20000,
                 voxelize_reduce: bool = True,
                 deterministic: bool = True,
                 implementation: str = 'sort') -> None:
        super().__init__()
        if implementation not in IMPLEMENTATIONS:
            raise ValueError(f'voxelize_cfg implementation={implementation!r}: use one '
                             f'of {IMPLEMENTATIONS}.')
        if max_num_points is None or max_num_points <= 0:
            raise ValueError(
                f'voxelize_cfg max_num_points={max_num_points}: BEVFusion uses hard '
                'voxelization; give the number of points kept per voxel (10 officially).')
        if len(voxel_size) != 3 or len(point_cloud_range) != 6:
            raise ValueError(f'voxel_size={list(voxel_size)} needs 3 values and '
                             f'point_cloud_range={list(point_cloud_range)} 6.')
        if isinstance(max_voxels, int):
            max_voxels = (max_voxels, max_voxels)
        self.voxelize_reduce = voxelize_reduce
        self.implementation = implementation if deterministic else 'mmcv'
        self.voxel_size = [float(v) for v in voxel_size]
        self.point_cloud_range = [float(v) for v in point_cloud_range]
        self.max_num_points = max_num_points
        self.layer = Voxelization(list(voxel_size), list(point_cloud_range),
                                  max_num_points, tuple(max_voxels), deterministic)

    @property
    def grid_size(self) -> List[int]:
        return [int(v) for v in self.layer.grid_size]

    @torch.no_grad()
    def forward(self, points: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """Voxelize each sample's ``[N, C]`` points.

        Returns:
            tuple: features ``[M, C]`` (or ``[M, P, C]`` without reduce), indices
            ``[M, 4]`` int32 (batch, x, y, z), points per voxel ``[M]``.
        """
        if self.implementation == 'sort':
            max_voxels = self.layer.max_voxels[0 if self.training else 1]
            feats, zyx, sizes = hard_voxelize_batch(
                [p.float() for p in points], self.voxel_size, self.point_cloud_range,
                self.max_num_points, max_voxels)
            coords = torch.cat([zyx[:, :1], zyx[:, 1:].flip(1)], dim=1)
        else:
            feats, coords, sizes = self._mmcv(points)
        if self.voxelize_reduce:
            feats = (feats.sum(dim=1) / sizes.clamp(min=1).type_as(feats)[:, None])
        return feats.contiguous(), coords, sizes

    def _mmcv(self, points: List[Tensor]) -> Tuple[Tensor, Tensor, Tensor]:
        """mmcv's op, one sample at a time (``implementation='mmcv'``)."""
        feats, coords, sizes = [], [], []
        for b, pts in enumerate(points):
            voxels, zyx, num = self.layer(pts.float().contiguous())
            feats.append(voxels)
            batch = zyx.new_full((zyx.shape[0], 1), b)
            coords.append(torch.cat([batch, zyx.flip(1)], dim=1))
            sizes.append(num)
        return torch.cat(feats), torch.cat(coords).int(), torch.cat(sizes)
