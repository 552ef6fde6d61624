"""mmcv 2.1: the stacked ``grouping_operation``'s backward, without per-channel atomics.

mmcv's ``stack_group_points_backward`` kernel gives every (point, channel, sample) its
own thread and ``atomicAdd``s one float into ``grad_features[idx, channel]``: a warp's
threads write 32 different rows (stride C) and, where a ball holds fewer points than
``nsample`` (ball query repeats the first neighbour to fill the slots), the same
address over and over. Profiled on an H200 this one kernel took 126 of PV-RCNN's
~420 ms of GPU time per micro-batch of 8 (10 calls: VoxelSetAbstraction and the RoI
grid pooling).

Here the forward stays mmcv's kernel; the backward becomes one ``index_add_`` of
contiguous feature rows, (M * nsample, C) -> (N, C), with each stacked index shifted
to its sample's segment on the GPU (``repeat_interleave`` with a known output size: no
host read). The gradient is the same sum of the same terms (float addition order may
differ, as with any atomics); an index beyond its sample's segment, which the forward
reads as 0, gets no gradient (the kernel would add it to another sample's row; mmdet3d's
ball query never yields one). Non-stacked calls and CPU tensors go to what was bound
before (mmcv's op or :mod:`point_ops_cpu`'s twin).
"""
from typing import Any, Callable, List, Optional, Tuple

import torch

from ..patching import Change, Patch, declare

UPSTREAM = ('mmcv==2.1.0', 'mmdet3d==1.4.0')
TARGET = 'mmdet3d.models.layers.pointnet_modules.stack_point_sa_module'


def stack_grouping_backward(grad_out: torch.Tensor, indices: torch.Tensor,
                            features_batch_cnt: torch.Tensor,
                            indices_batch_cnt: torch.Tensor,
                            num_features: int,
                            dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """Gradient of the stacked grouping: (M, C, K) grad of the grouped features and the
    (M, K) segment-local indices -> (num_features, C) grad of the stacked features, in
    ``dtype`` (the features'; default: the gradient's)."""
    m, c, k = grad_out.shape
    starts = torch.cumsum(features_batch_cnt, 0) - features_batch_cnt
    ends = starts + features_batch_cnt
    segment_start = torch.repeat_interleave(starts, indices_batch_cnt, output_size=m)
    segment_end = torch.repeat_interleave(ends, indices_batch_cnt, output_size=m)
    rows = indices.long() + segment_start[:, None].long()  # (M, K)
    valid = (rows < segment_end[:, None]) & (indices >= 0)
    rows = torch.where(valid, rows, torch.zeros_like(rows))
    dtype = dtype or grad_out.dtype
    src = grad_out.permute(0, 2, 1).to(dtype) * valid[..., None].to(dtype)  # (M, K, C)
    grad = grad_out.new_zeros(num_features, c, dtype=dtype)
    if m and k:
        grad.index_add_(0, rows.reshape(-1), src.reshape(-1, c))
    return grad


class StackGrouping(torch.autograd.Function):
    """mmcv's stacked grouping forward; :func:`stack_grouping_backward` backward."""

    @staticmethod
    def forward(ctx: Any, features: torch.Tensor, indices: torch.Tensor,
                features_batch_cnt: torch.Tensor,
                indices_batch_cnt: torch.Tensor) -> torch.Tensor:
        from mmcv.ops.group_points import GroupingOperation
        out = GroupingOperation.forward(ctx, features, indices, features_batch_cnt,
                                        indices_batch_cnt)
        ctx.save_for_backward(indices, features_batch_cnt, indices_batch_cnt)
        ctx.num_features, ctx.dtype = features.shape[0], features.dtype
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        indices, features_batch_cnt, indices_batch_cnt = ctx.saved_tensors
        grad = stack_grouping_backward(grad_out.contiguous(), indices, features_batch_cnt,
                                       indices_batch_cnt, ctx.num_features, ctx.dtype)
        return grad, None, None, None


def _grouping(before: Callable) -> Callable:
    def grouping_operation(features: torch.Tensor, indices: torch.Tensor,
                           features_batch_cnt: Optional[torch.Tensor] = None,
                           indices_batch_cnt: Optional[torch.Tensor] = None
                           ) -> torch.Tensor:
        if (features.is_cuda and features_batch_cnt is not None
                and indices_batch_cnt is not None):
            return StackGrouping.apply(features, indices, features_batch_cnt,
                                       indices_batch_cnt)
        return before(features, indices, features_batch_cnt, indices_batch_cnt)
    grouping_operation._grouping_backward = True  # type: ignore[attr-defined]
    grouping_operation._before = before  # type: ignore[attr-defined]
    # CPU tensors still reach point_ops_cpu's twin: keep its marks (its apply() stays
    # idempotent, its upstream op stays findable)
    for mark in ('_point_ops_cpu', '_upstream'):
        if hasattr(before, mark):
            setattr(grouping_operation, mark, getattr(before, mark))
    return grouping_operation


def _changes() -> List[Change]:
    import importlib
    module = importlib.import_module(TARGET)
    return [Change(module, 'grouping_operation', _grouping(module.grouping_operation))]


PATCH = declare(Patch(
    name='grouping_backward', kind='speed', targets=(f'{TARGET}.grouping_operation',),
    upstream=UPSTREAM, changes=_changes,
    why="stacked grouping's backward uses per-channel atomics (30 % of PV-RCNN's GPU "
        'time): one index_add_ of feature rows'))
