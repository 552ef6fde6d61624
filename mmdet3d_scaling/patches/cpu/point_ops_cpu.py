"""mmcv 2.1: PV-RCNN's point operators on the CPU.

mmcv compiles ``furthest_point_sample``, the stacked ``ball_query`` /
``grouping_operation`` and ``points_in_boxes_part`` for CUDA only; on CPU tensors they
fail ("implementation for device cpu not found", "Torch not compiled with CUDA
enabled"). PV-RCNN needs all four (``VoxelSetAbstraction``, ``StackedSAModuleMSG``,
``ForegroundSegmentationHead``), so it could not even run a forward pass without a GPU.
The patch rebinds the names mmdet3d imported to dispatchers: CUDA tensors go to mmcv's op
unchanged, CPU tensors to a PyTorch twin with the CUDA kernel's semantics (read from
mmcv 2.1.0's ``csrc/common/cuda/*_kernel.cuh``). The twins are for tests, smoke runs
and profiling on a CPU; they are plain loops and tensor ops, not fast.
"""
from typing import Any, Callable, List, Optional

import torch

from ..patching import Change, Patch, declare

UPSTREAM = ('mmcv==2.1.0', 'mmdet3d==1.4.0')

# module -> names it imported from mmcv.ops that have no CPU kernel
TARGETS = {
    'mmdet3d.models.middle_encoders.voxel_set_abstraction': ('furthest_point_sample',),
    'mmdet3d.models.layers.pointnet_modules.stack_point_sa_module':
        ('ball_query', 'grouping_operation'),
    'mmdet3d.structures.bbox_3d.base_box3d': ('points_in_boxes_part',),
}


def furthest_point_sample_cpu(points_xyz: torch.Tensor, num_points: int) -> torch.Tensor:
    """(B, N, 3) -> (B, num_points) int32 indices; starts at point 0, then repeatedly the
    point farthest from all chosen ones (squared distance; ties: the lowest index)."""
    batch, n, _ = points_xyz.shape
    xyz = points_xyz.detach().float()
    idx = torch.zeros(batch, num_points, dtype=torch.int32)
    if num_points <= 0 or n == 0:
        return idx
    nearest = torch.full((batch, n), 1e10)
    rows = torch.arange(batch)
    last = torch.zeros(batch, dtype=torch.long)
    for j in range(1, num_points):
        d = ((xyz - xyz[rows, last][:, None]) ** 2).sum(-1)
        nearest = torch.minimum(nearest, d)
        last = nearest.argmax(1)
        idx[:, j] = last.int()
    return idx


def _segments(counts: torch.Tensor) -> torch.Tensor:
    """Start offset of every segment of a stacked tensor, from its per-sample counts."""
    counts = counts.long()
    return torch.cumsum(counts, 0) - counts


def stack_ball_query_cpu(max_radius: float, sample_num: int, xyz: torch.Tensor,
                         center_xyz: torch.Tensor, xyz_batch_cnt: torch.Tensor,
                         center_xyz_batch_cnt: torch.Tensor) -> torch.Tensor:
    """Stacked ball query: (M, sample_num) int32 indices *within each sample's
    segment* of the first ``sample_num`` points closer than ``max_radius`` (strictly),
    in point order; unused slots repeat the first hit; a ball with no point has -1 in
    slot 0 and 0 elsewhere."""
    idx = torch.zeros(center_xyz.shape[0], sample_num, dtype=torch.int32)
    starts, cstarts = _segments(xyz_batch_cnt), _segments(center_xyz_batch_cnt)
    radius2 = float(max_radius) ** 2
    for b in range(len(xyz_batch_cnt)):
        pts = xyz[starts[b]:starts[b] + int(xyz_batch_cnt[b])].detach().float()
        first_center = int(cstarts[b])
        for lo in range(0, int(center_xyz_batch_cnt[b]), _CHUNK):
            hi = min(lo + _CHUNK, int(center_xyz_batch_cnt[b]))
            centers = center_xyz[first_center + lo:first_center + hi].detach().float()
            # the kernel's arithmetic: sum of squared coordinate differences, strict <
            inside = ((centers[:, None, :] - pts[None, :, :]) ** 2).sum(-1) < radius2
            idx[first_center + lo:first_center + hi] = _first_hits(inside, sample_num)
    return idx


_CHUNK = 256  # ball centres a step: bounds the (centres x points x 3) temporary


def _first_hits(inside: torch.Tensor, sample_num: int) -> torch.Tensor:
    """Per row of a (rows, points) hit mask: the first ``sample_num`` hit columns,
    padded with the first hit; -1 then zeros for a row without hits."""
    out = torch.zeros(inside.shape[0], sample_num, dtype=torch.int32)
    hits = inside.sum(1)
    if inside.shape[1]:
        out[:] = inside.int().argmax(1)[:, None].int()  # the first hit (0 if none)
        rank = torch.cumsum(inside.int(), 1) * inside  # 1-based rank of each hit
        row, col = torch.nonzero((rank > 0) & (rank <= sample_num), as_tuple=True)
        out[row, rank[row, col] - 1] = col.int()
    out[hits == 0] = 0
    out[hits == 0, 0] = -1
    return out


def stack_grouping_operation_cpu(features: torch.Tensor, indices: torch.Tensor,
                                 features_batch_cnt: torch.Tensor,
                                 indices_batch_cnt: torch.Tensor) -> torch.Tensor:
    """Stacked grouping: (N, C) features, (M, K) segment-local indices -> (M, C, K);
    an index beyond its sample's segment gives 0 (as the kernel leaves it). Autograd
    flows through the gather."""
    starts = _segments(features_batch_cnt)
    ends = starts + features_batch_cnt.long()
    sample = torch.repeat_interleave(torch.arange(len(indices_batch_cnt)),
                                     indices_batch_cnt.long())
    gidx = indices.long() + starts[sample][:, None]
    valid = (gidx < ends[sample][:, None]) & (gidx >= 0)
    if features.shape[0] == 0:
        return features.new_zeros(indices.shape[0], features.shape[1], indices.shape[1])
    picked = features[gidx.clamp(0, features.shape[0] - 1)]  # (M, K, C)
    picked = picked * valid[..., None].to(picked.dtype)
    return picked.permute(0, 2, 1).contiguous()


def points_in_boxes_part_cpu(points: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """(B, M, 3) points, (B, T, 7) boxes -> (B, M) index of the first box holding each
    point, -1 for none; from mmcv's CPU ``points_in_boxes_cpu`` (all boxes)."""
    from mmcv.ops import points_in_boxes_cpu
    if boxes.shape[1] == 0:
        return points.new_full(points.shape[:2], -1, dtype=torch.int32)
    inside = points_in_boxes_cpu(points.float(), boxes.float())  # (B, M, T)
    first = inside.int().argmax(-1)
    return torch.where(inside.any(-1), first, torch.full_like(first, -1)).int()


def _ball_query_cpu(min_radius: float, max_radius: float, sample_num: int,
                    xyz: torch.Tensor, center_xyz: torch.Tensor,
                    xyz_batch_cnt: Optional[torch.Tensor] = None,
                    center_xyz_batch_cnt: Optional[torch.Tensor] = None) -> torch.Tensor:
    if xyz_batch_cnt is None or center_xyz_batch_cnt is None or min_radius > 0:
        raise NotImplementedError(
            'point_ops_cpu: on a CPU only the stacked ball_query with min_radius 0 (as '
            'PV-RCNN uses it) has a PyTorch twin; got min_radius='
            f'{min_radius}, batch counts given: {xyz_batch_cnt is not None}. Run on a GPU.')
    return stack_ball_query_cpu(max_radius, sample_num, xyz, center_xyz, xyz_batch_cnt,
                                center_xyz_batch_cnt)


def _grouping_operation_cpu(features: torch.Tensor, indices: torch.Tensor,
                            features_batch_cnt: Optional[torch.Tensor] = None,
                            indices_batch_cnt: Optional[torch.Tensor] = None
                            ) -> torch.Tensor:
    if features_batch_cnt is None or indices_batch_cnt is None:
        raise NotImplementedError(
            'point_ops_cpu: on a CPU only the stacked grouping_operation (batch counts '
            'given, as PV-RCNN uses it) has a PyTorch twin. Run on a GPU.')
    return stack_grouping_operation_cpu(features, indices, features_batch_cnt,
                                        indices_batch_cnt)


CPU_TWINS = {
    'furthest_point_sample': furthest_point_sample_cpu,
    'ball_query': _ball_query_cpu,
    'grouping_operation': _grouping_operation_cpu,
    'points_in_boxes_part': points_in_boxes_part_cpu,
}


def _dispatching(name: str, upstream: Callable, cpu: Callable) -> Callable:
    def op(*args: Any, **kwargs: Any) -> Any:
        tensors = [a for a in list(args) + list(kwargs.values())
                   if isinstance(a, torch.Tensor)]
        if any(t.is_cuda for t in tensors):
            return upstream(*args, **kwargs)
        return cpu(*args, **kwargs)
    op.__name__ = op.__qualname__ = name
    op.__doc__ = (f'mmcv.ops.{name} on CUDA tensors, the PyTorch twin '
                  f'{cpu.__name__} of {__name__} on CPU tensors.')
    op._point_ops_cpu = True  # type: ignore[attr-defined]
    op._upstream = upstream  # type: ignore[attr-defined]
    return op


def _changes() -> List[Change]:
    import importlib
    changes = []
    for module_name, names in TARGETS.items():
        module = importlib.import_module(module_name)
        changes += [Change(module, name, _dispatching(name, getattr(module, name),
                                                      CPU_TWINS[name])) for name in names]
    return changes


PATCH = declare(Patch(
    name='point_ops_cpu', kind='cpu',
    targets=tuple(f'{m}.{n}' for m, names in TARGETS.items() for n in names),
    upstream=UPSTREAM, changes=_changes,
    why="FPS, stacked ball query / grouping and points_in_boxes_part are CUDA-only: "
        "PyTorch twins for CPU tensors (PV-RCNN on a CPU)"))
