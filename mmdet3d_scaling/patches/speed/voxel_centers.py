"""mmdet3d 1.4.0: ``VoxelSetAbstraction.get_voxel_centers`` waits on the GPU three times.

PV-RCNN's point encoder turns each sparse level's voxel indices into centres (four
levels a micro-batch). Upstream reorders the index columns with a Python list
(``coors[:, [3, 2, 1]]``) and makes the voxel size and the range origin with
``torch.tensor(..., device=cuda)``: three copies from pageable host memory, each a wait
until the GPU has run everything queued (12 of a micro-batch's ~100 waits, counted on
an H100 at batch 8).

The patch reverses the columns with a slice and ``flip`` and makes the two small
vectors as upstream makes them (float32, times the scale factor) on the host, then
sends them in one pinned, non-blocking copy. The same centres bit for bit
(``tests/patches/speed/test_voxel_centers.py``).
"""
import torch
from torch import Tensor

from ...utils.device_copy import to_device
from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'
MODULE = 'mmdet3d.models.middle_encoders.voxel_set_abstraction'


def get_voxel_centers(self, coors: Tensor, scale_factor: float) -> Tensor:
    """``(N, 3)`` x, y, z centres of voxels whose ``coors`` are (batch, z, y, x)."""
    if coors.dim() != 2 or coors.shape[1] != 4:
        raise ValueError(f'get_voxel_centers: coors of shape {tuple(coors.shape)}; '
                         'expected (N, 4) rows of (batch, z, y, x)')
    centres = coors[:, 1:4].flip(1).float()  # (x, y, z)
    host = torch.tensor([list(self.voxel_size), list(self.point_cloud_range[0:3])]).float()
    host[0] *= scale_factor  # upstream's float32 product
    voxel_size, origin = to_device(host, centres.device)  # one copy for both
    return (centres + 0.5) * voxel_size + origin


PATCH = declare(method_patch(
    'voxel_centers', 'speed', f'{MODULE}:VoxelSetAbstraction', 'get_voxel_centers',
    get_voxel_centers, UPSTREAM,
    why="PV-RCNN's voxel centres copy a list index and two host tensors to the GPU, a "
        'wait each: a flip and two pinned, non-blocking copies'))
