"""Voxelization by a sort over voxel keys, with mmcv 2.1's results exactly.

mmcv's deterministic hard voxelization (``mmcv.ops.Voxelization``, ``deterministic=True``)
finds, on the GPU, each point's earlier points in the same voxel by a scan over all
earlier points and then numbers the voxels in one serial thread; on the CPU it fills a
dense grid. Both give: voxels numbered by the first appearance of one of their points in
the input, each voxel holding its first ``max_num_points`` points in input order, voxels
beyond ``max_voxels`` dropped with their points, points outside the range dropped. Here
the same is computed from one stable sort of the voxel keys and cumulative sums, on the
CPU and on CUDA, with no loop over points or voxels and one host read (the voxel count,
which sizes the outputs; mmcv reads it too).

Coordinates are mmcv's arithmetic: ``floor((p - min) / size)`` in float32 (float64 for
float64 points; mmcv's CUDA kernel rounds that float64 quotient to float32 before
``floorf``), the range test ``0 <= c < grid`` per axis, and the grid size
``round((max - min) / size)`` in float32, rounding half away from zero as C's
``round``. Range and voxel size pass through float32 first, as mmcv stores them.
"""
import itertools
import math
import struct
from typing import List, Sequence, Tuple

import torch
from torch import Tensor

_INT32_MAX = 2**31 - 1


def _f32(value: float) -> float:
    """``value`` rounded to float32 (to nearest, ties to even)."""
    return struct.unpack('f', struct.pack('f', float(value)))[0]


def grid_shape(voxel_size: Sequence[float],
               point_cloud_range: Sequence[float]) -> Tuple[int, int, int]:
    """The voxel grid ``(x, y, z)`` as mmcv's kernels compute it.

    Args:
        voxel_size (Sequence[float]): x, y, z voxel size (m).
        point_cloud_range (Sequence[float]): x, y, z minimum then maximum (m).

    Returns:
        tuple[int, int, int]: voxels along x, y and z.

    Raises:
        ValueError: a wrong number of values, or a range that holds no voxel.
    """
    if len(voxel_size) != 3 or len(point_cloud_range) != 6:
        raise ValueError(f'voxel_size={list(voxel_size)} needs 3 values (x, y, z) and '
                         f'point_cloud_range={list(point_cloud_range)} 6 '
                         '(x, y, z minimum, then maximum).')
    size = [_f32(v) for v in voxel_size]
    pcr = [_f32(v) for v in point_cloud_range]
    # float32 arithmetic as mmcv's C++: an operation on two float32 values done in
    # float64 and rounded once to float32 is the float32 operation's result
    quotient = [_f32(_f32(pcr[i + 3] - pcr[i]) / size[i]) for i in range(3)]
    grid = tuple(int(math.copysign(math.floor(abs(q) + 0.5), q)) for q in quotient)
    if min(grid) <= 0:
        raise ValueError(f'point_cloud_range={list(point_cloud_range)} with voxel_size='
                         f'{list(voxel_size)} gives a grid of {list(grid)} voxels (x, y, '
                         'z): every maximum must exceed its minimum by at least half a '
                         'voxel.')
    return grid  # type: ignore[return-value]


def _check_points(points: Tensor) -> None:
    if not isinstance(points, Tensor) or points.dim() != 2 or points.shape[1] < 3:
        shape = tuple(points.shape) if isinstance(points, Tensor) else type(points)
        raise ValueError(f'points of shape {shape}: voxelization needs a [N, C] tensor '
                         'with C >= 3 (x, y, z, then any features).')
    if not points.is_floating_point():
        raise TypeError(f'points of dtype {points.dtype}: voxelization needs floating '
                        'point coordinates; convert with points.float().')


def _row(values: Sequence[float], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``[1, len(values)]`` float32-rounded constants on ``device``; the copy from
    pageable memory is staged at once, so non_blocking spares a stream sync."""
    row = torch.tensor([list(values)], dtype=torch.float32).to(dtype)
    return row.to(device, non_blocking=True)


def _cells(points: Tensor, voxel_size: Sequence[float],
           point_cloud_range: Sequence[float]) -> Tuple[Tensor, Tensor]:
    """``[N, 3]`` float cells (x, y, z) and ``[N, 3]`` bool: that axis in the grid."""
    _check_points(points)
    grid = grid_shape(voxel_size, point_cloud_range)
    wide = points.dtype == torch.float64
    dtype = torch.float64 if wide else torch.float32
    # [1, 3] tensors on the device: a true division (torch's CUDA kernel multiplies by
    # the reciprocal when the divisor is a CPU scalar, which can change the last bit)
    low = _row(point_cloud_range[:3], dtype, points.device)
    size = _row(voxel_size, dtype, points.device)
    quotient = (points[:, :3].to(dtype) - low) / size
    if wide and points.is_cuda:
        quotient = quotient.float()  # mmcv's CUDA kernel: floorf of the double quotient
    cell = torch.floor(quotient)
    if points.is_cuda:  # the CUDA float -> int conversion gives 0 for NaN
        cell = torch.nan_to_num(cell, nan=0.0, posinf=math.inf, neginf=-math.inf)
    upper = _row(grid, cell.dtype, cell.device)
    return cell, (cell >= 0) & (cell < upper)  # NaN fails both: out, as on the CPU


def point_voxel_coors(points: Tensor, voxel_size: Sequence[float],
                      point_cloud_range: Sequence[float]) -> Tuple[Tensor, Tensor]:
    """Each point's voxel ``(z, y, x)`` and whether it lies in the range.

    Args:
        points (Tensor): ``[N, C]`` points, x, y, z first.
        voxel_size (Sequence[float]): x, y, z voxel size (m).
        point_cloud_range (Sequence[float]): x, y, z minimum then maximum (m).

    Returns:
        tuple[Tensor, Tensor]: ``[N, 3]`` int64 z, y, x (0 where out of range) and
        ``[N]`` bool, true in range.
    """
    cell, inside = _cells(points, voxel_size, point_cloud_range)
    valid = inside.all(dim=1)
    xyz = torch.where(valid[:, None], cell, 0).long()
    return xyz.flip(1), valid


def dynamic_voxelize(points: Tensor, voxel_size: Sequence[float],
                     point_cloud_range: Sequence[float]) -> Tensor:
    """mmcv's dynamic voxelization (``max_num_points=-1``): one voxel per point.

    Args:
        points (Tensor): ``[N, C]`` points, x, y, z first.
        voxel_size (Sequence[float]): x, y, z voxel size (m).
        point_cloud_range (Sequence[float]): x, y, z minimum then maximum (m).

    Returns:
        Tensor: ``[N, 3]`` int32 z, y, x. A point out of range gets a row of -1 on the
        CPU; on CUDA, as mmcv's kernel writes it, -1 from the first column up to the
        first axis (x, then y, then z) out of range and 0 after it: ``[-1, 0, 0]`` for
        x, ``[-1, -1, 0]`` for y, ``[-1, -1, -1]`` for z.
    """
    cell, inside = _cells(points, voxel_size, point_cloud_range)
    valid = inside.all(dim=1)
    zyx = torch.where(valid[:, None], cell, 0).flip(1).int()
    if not points.is_cuda:
        return torch.where(valid[:, None], zyx, -1)
    first_out = (~inside).int().argmax(dim=1)  # 0 = x, 1 = y, 2 = z
    column = torch.arange(3, device=points.device)
    partial = torch.where(column[None] <= first_out[:, None], -1, 0).int()
    return torch.where(valid[:, None], zyx, partial)


def _check_limits(max_num_points: int, max_voxels: int) -> None:
    if isinstance(max_num_points, bool) or not isinstance(max_num_points, int) \
            or max_num_points < 1:
        raise ValueError(f'max_num_points={max_num_points!r}: hard voxelization keeps '
                         'a positive number of points per voxel; for one voxel per point '
                         'use dynamic_voxelize.')
    if isinstance(max_voxels, bool) or not isinstance(max_voxels, int) or max_voxels < 0:
        raise ValueError(f'max_voxels={max_voxels!r}: give the number of voxels kept '
                         '(an int >= 0); for one voxel per point use dynamic_voxelize.')


def _hard(points: Tensor, sample: Tensor, lengths: List[int],
          voxel_size: Sequence[float], point_cloud_range: Sequence[float],
          max_num_points: int, max_voxels: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Hard voxelization of points tagged by sample (see :func:`hard_voxelize_batch`)."""
    n, channels = points.shape
    device = points.device
    gx, gy, gz = grid_shape(voxel_size, point_cloud_range)
    zyx, valid = point_voxel_coors(points, voxel_size, point_cloud_range)
    cells = gx * gy * gz
    num_samples = len(lengths)
    key = ((sample * gz + zyx[:, 0]) * gy + zyx[:, 1]) * gx + zyx[:, 2]
    outside = cells * num_samples  # sorts after every voxel
    key = torch.where(valid, key, outside)
    if outside <= _INT32_MAX:
        key = key.int()  # a 32-bit sort is faster
    # stable: within a voxel, points stay in input order
    sorted_key, perm = torch.sort(key, stable=True)
    pos = torch.arange(n, device=device)
    opens = torch.ones(n, dtype=torch.bool, device=device)
    opens[1:] = sorted_key[1:] != sorted_key[:-1]
    start = torch.where(opens, pos, 0).cummax(dim=0).values
    rank = pos - start  # place of the point in its voxel, input order
    valid_sorted = valid[perm]
    # voxels numbered by the first appearance of one of their points in the input
    first = torch.zeros(n, dtype=torch.bool, device=device)
    first.scatter_(0, perm, opens & valid_sorted)
    opened = first.cumsum(0)
    voxel = opened[perm[start]] - 1
    # per sample: voxels before it, voxels it keeps
    # (prefix sums at the sample bounds, not index_add_: no atomics, so nothing for
    # torch.use_deterministic_algorithms to refuse)
    opened = torch.cat([opened.new_zeros(1), opened])
    bounds = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.long)
    bounds = bounds.to(device, non_blocking=True)
    count = opened[bounds[1:]] - opened[bounds[:-1]]
    kept = count.clamp(max=max_voxels)
    before = count.cumsum(0) - count
    kept_before = kept.cumsum(0) - kept
    total = int(kept.sum())  # the one host read: sizes the outputs
    sample_sorted = sample[perm]
    local = voxel - before[sample_sorted]
    keep_voxel = valid_sorted & (local < max_voxels)
    keep_point = keep_voxel & (rank < max_num_points)
    # dropped points write into one spare row (index ``total``), cut off at the end
    row = torch.where(keep_voxel, local + kept_before[sample_sorted], total)
    point_row = torch.where(keep_point, row, total)
    slot = torch.where(keep_point, rank, 0)
    voxels = points.new_zeros((total + 1, max_num_points, channels))
    flat = point_row * max_num_points + slot  # one index: faster than two on the CPU
    voxels.view(-1, channels).index_copy_(0, flat, points[perm])
    opener_row = torch.where(keep_voxel & (rank == 0), row, total)
    coors = torch.cat([sample[:, None], zyx], dim=1)[perm].int()
    voxel_coors = torch.zeros((total + 1, 4), dtype=torch.int32, device=device)
    voxel_coors[opener_row] = coors
    last = torch.ones(n, dtype=torch.bool, device=device)
    last[:-1] = opens[1:]
    closer_row = torch.where(keep_voxel & last, row, total)
    num_points = torch.zeros(total + 1, dtype=torch.int32, device=device)
    num_points[closer_row] = (rank + 1).clamp(max=max_num_points).int()
    return voxels[:total], voxel_coors[:total], num_points[:total]


def _empty(points: Tensor, max_num_points: int, coor_dims: int):
    return (points.new_zeros((0, max_num_points, points.shape[1])),
            torch.zeros((0, coor_dims), dtype=torch.int32, device=points.device),
            torch.zeros(0, dtype=torch.int32, device=points.device))


@torch.no_grad()
def hard_voxelize(points: Tensor, voxel_size: Sequence[float],
                  point_cloud_range: Sequence[float], max_num_points: int,
                  max_voxels: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Hard voxelization of one sample, equal to mmcv's deterministic op.

    Args:
        points (Tensor): ``[N, C]`` points (x, y, z, then features), CPU or CUDA.
        voxel_size (Sequence[float]): x, y, z voxel size (m).
        point_cloud_range (Sequence[float]): x, y, z minimum then maximum (m).
        max_num_points (int): points kept per voxel, the first in input order (>= 1).
        max_voxels (int): voxels kept, in order of first appearance (>= 0).

    Returns:
        tuple[Tensor, Tensor, Tensor]: voxels ``[M, max_num_points, C]`` (points'
        dtype, zero-padded), coordinates ``[M, 3]`` int32 (z, y, x), points per voxel
        ``[M]`` int32.
    """
    _check_points(points)
    _check_limits(max_num_points, max_voxels)
    grid_shape(voxel_size, point_cloud_range)
    if points.shape[0] == 0:
        return _empty(points, max_num_points, 3)
    sample = torch.zeros(points.shape[0], dtype=torch.long, device=points.device)
    voxels, coors, num = _hard(points, sample, [points.shape[0]], voxel_size, point_cloud_range,
                               max_num_points, max_voxels)
    return voxels, coors[:, 1:].contiguous(), num


@torch.no_grad()
def hard_voxelize_batch(points: Sequence[Tensor], voxel_size: Sequence[float],
                        point_cloud_range: Sequence[float], max_num_points: int,
                        max_voxels: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Hard voxelization of several samples in one call (the sample index is part of
    the sort key), equal to :func:`hard_voxelize` per sample, concatenated.

    Args:
        points (Sequence[Tensor]): one ``[N_i, C]`` tensor a sample, same ``C``, dtype
            and device.
        voxel_size (Sequence[float]): x, y, z voxel size (m).
        point_cloud_range (Sequence[float]): x, y, z minimum then maximum (m).
        max_num_points (int): points kept per voxel (>= 1).
        max_voxels (int): voxels kept per sample (>= 0).

    Returns:
        tuple[Tensor, Tensor, Tensor]: voxels ``[M, max_num_points, C]``, coordinates
        ``[M, 4]`` int32 (sample, z, y, x; mmdet3d's batched order), points per voxel
        ``[M]`` int32; sample 0's voxels first.
    """
    points = list(points)
    if not points:
        raise ValueError('hard_voxelize_batch got no samples: pass a list of [N, C] '
                         'point tensors, one a sample.')
    for pts in points:
        _check_points(pts)
    kinds = {(p.shape[1], p.dtype, p.device) for p in points}
    if len(kinds) > 1:
        raise ValueError('the samples differ in (channels, dtype, device): '
                         f'{sorted(map(str, kinds))}; give every sample the same.')
    _check_limits(max_num_points, max_voxels)
    grid_shape(voxel_size, point_cloud_range)
    lengths: List[int] = [p.shape[0] for p in points]
    total = sum(lengths)
    if total == 0:
        return _empty(points[0], max_num_points, 4)
    device = points[0].device
    sample = torch.cat([torch.full((n,), i, dtype=torch.long, device=device)
                        for i, n in enumerate(lengths)])
    return _hard(torch.cat(points), sample, lengths, voxel_size, point_cloud_range,
                 max_num_points, max_voxels)
