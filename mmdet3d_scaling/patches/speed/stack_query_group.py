"""mmdet3d 1.4.0: ``StackQueryAndGroup.forward`` waits on the GPU at every call.

PV-RCNN's set abstraction (``VoxelSetAbstraction`` and the RoI grid pooling, 12 calls a
training micro-batch) groups neighbours with ``StackQueryAndGroup``, whose forward
starts with two ``assert``s comparing a tensor sum with a shape (two host reads), then
zeroes the empty balls by boolean-mask assignment (``x[mask] = 0``). Counted on PV-RCNN
on an H200: the asserts are 24 of a micro-batch's 295 host reads.

The patch computes the same grouping with the checks kept but queued on the device
(``torch._assert_async``: on a CPU it raises at once with the message; on a GPU a
failed check stops the run with a device-side assert at the next synchronisation) and
the empty balls zeroed with ``masked_fill`` (which never needs the mask's indices). Same outputs and
gradients (``tests/patches/speed/test_stack_query_group.py``); ball query and grouping are
looked up in mmdet3d's module at call time, so the other patches on them apply.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'
MODULE = 'mmdet3d.models.layers.pointnet_modules.stack_point_sa_module'


def _check_counts(points: Tensor, counts: Tensor, name: str) -> None:
    torch._assert_async(
        counts.sum() == points.shape[0],
        f'StackQueryAndGroup: {name} holds {points.shape[0]} points but its batch '
        f'counts do not add up to that')


def forward(self, xyz: Tensor, xyz_batch_cnt: Tensor, new_xyz: Tensor,
            new_xyz_batch_cnt: Tensor,
            features: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``StackQueryAndGroup.forward`` without host reads (see the module doc)."""
    import importlib
    ops = importlib.import_module(MODULE)  # the names the other patches rebind
    if features is None and not self.use_xyz:
        raise ValueError('StackQueryAndGroup: use_xyz=False needs point features; '
                         'set use_xyz=True or pass features')
    _check_counts(xyz, xyz_batch_cnt, 'xyz')
    _check_counts(new_xyz, new_xyz_batch_cnt, 'new_xyz')
    idx = ops.ball_query(0, self.radius, self.sample_nums, xyz, new_xyz, xyz_batch_cnt,
                         new_xyz_batch_cnt)  # (M, nsample), -1 where a ball is empty
    empty = (idx[:, 0] == -1)[:, None]
    idx = idx.masked_fill(empty, 0)
    empty = empty[..., None]  # (M, 1, 1) against (M, C, nsample)
    grouped_xyz = ops.grouping_operation(xyz, idx, xyz_batch_cnt, new_xyz_batch_cnt)
    grouped_xyz = (grouped_xyz - new_xyz.unsqueeze(-1)).masked_fill(empty, 0)
    if features is None:
        return grouped_xyz, idx
    grouped = ops.grouping_operation(features, idx, xyz_batch_cnt, new_xyz_batch_cnt)
    grouped = grouped.masked_fill(empty, 0)
    if self.use_xyz:
        grouped = torch.cat([grouped_xyz, grouped], dim=1)  # (M, 3 + C, nsample)
    return grouped, idx


PATCH = declare(method_patch(
    'stack_query_group', 'speed', 'mmdet3d.models.layers.pointnet_modules.stack_point_sa_module:StackQueryAndGroup',
    'forward', forward, UPSTREAM,
    why='StackQueryAndGroup asserts on GPU sums and mask-assigns: checks queued, masked_fill'))
