"""mmdet3d 1.4.0: the boxes' ``bev``, ``nearest_bev`` and LiDAR ``corners`` wait on the GPU.

``BaseInstance3DBoxes.bev`` picks its columns with a Python list
(``tensor[:, [0, 1, 3, 4, 6]]``), ``nearest_bev`` once more (``[:, [0, 1, 3, 2]]``), and
``LiDARInstance3DBoxes.corners`` builds its unit box on the host and copies it, reorders
it by a list and subtracts a ``new_tensor``: every list index and every such tensor is a
copy from pageable host memory, and each makes the host wait until the GPU has run all
it was given. The anchor heads' assigners and losses, the RPN's proposals and the RoI
head's corner loss call them per sample and class: counted on PV-RCNN on an H100 (batch
8), 19 of a micro-batch's ~100 waits.

The patch takes the same columns with slices and one ``torch.cat`` (a kernel, no copy
from the host), and the LiDAR unit box from a per-(device, dtype) constant made once.
The values are the same bit for bit (the same elements, the same float operations in
the same order: ``tests/patches/speed/test_box_geometry.py``), and so are the gradients.
Camera boxes keep their own ``bev`` (it is not the base class's).
"""
import functools

import numpy as np
import torch
from torch import Tensor

from ...utils.device_copy import to_device
from ..patching import Change, Patch, declare

UPSTREAM = 'mmdet3d==1.4.0'
BASE = 'mmdet3d.structures.bbox_3d.base_box3d'
LIDAR = 'mmdet3d.structures.bbox_3d.lidar_box3d'

# mmdet3d's LiDAR unit box: corners (x0y0z0, x0y0z1, x0y1z1, x0y1z0, x1y0z0, x1y0z1,
# x1y1z1, x1y1z0) relative to the bottom centre (0.5, 0.5, 0); exact in any float type
_UNIT_CORNERS = [[-0.5, -0.5, 0.0], [-0.5, -0.5, 1.0], [-0.5, 0.5, 1.0], [-0.5, 0.5, 0.0],
                 [0.5, -0.5, 0.0], [0.5, -0.5, 1.0], [0.5, 0.5, 1.0], [0.5, 0.5, 0.0]]


@functools.lru_cache(maxsize=None)
def unit_corners(device: torch.device, dtype: torch.dtype) -> Tensor:
    """``(8, 3)`` unit-box corners on ``device`` (copied there once per device and dtype)."""
    return to_device(torch.tensor(_UNIT_CORNERS, dtype=dtype), device)


def bev(self) -> Tensor:
    """``(N, 5)`` BEV boxes: x, y, x size, y size, yaw (upstream's columns 0, 1, 3, 4, 6)."""
    t = self.tensor
    return torch.cat([t[:, 0:2], t[:, 3:5], t[:, 6:7]], dim=1)


def nearest_bev(self) -> Tensor:
    """``(N, 4)`` axis-aligned BEV boxes (x1, y1, x2, y2): a box turned by more than 45
    degrees swaps its sizes, as upstream's ``nearest_bev``."""
    from mmdet3d.structures.bbox_3d.utils import limit_period
    rotated = self.bev
    normed = torch.abs(limit_period(rotated[:, -1], 0.5, np.pi))
    swapped = torch.cat([rotated[:, 0:2], rotated[:, 3:4], rotated[:, 2:3]], dim=1)
    xywh = torch.where((normed > np.pi / 4)[..., None], swapped, rotated[:, :4])
    centres, sizes = xywh[:, :2], xywh[:, 2:]
    return torch.cat([centres - sizes / 2, centres + sizes / 2], dim=-1)


def lidar_corners(self) -> Tensor:
    """``(N, 8, 3)`` corners of LiDAR boxes, upstream's order and arithmetic."""
    import importlib
    if self.tensor.numel() == 0:
        return torch.empty([0, 8, 3], device=self.tensor.device)
    dims = self.dims
    corners = dims.view([-1, 1, 3]) * unit_corners(dims.device, dims.dtype).reshape(
        [1, 8, 3])
    rotate = importlib.import_module(LIDAR).rotation_3d_in_axis  # as bound there now
    corners = rotate(corners, self.tensor[:, 6], axis=self.YAW_AXIS)
    corners += self.tensor[:, :3].view(-1, 1, 3)
    return corners


def _changes():
    from mmdet3d.structures.bbox_3d.base_box3d import BaseInstance3DBoxes
    from mmdet3d.structures.bbox_3d.lidar_box3d import LiDARInstance3DBoxes
    return [Change(BaseInstance3DBoxes, 'bev', property(bev)),
            Change(BaseInstance3DBoxes, 'nearest_bev', property(nearest_bev)),
            Change(LiDARInstance3DBoxes, 'corners', property(lidar_corners))]


PATCH = declare(Patch(
    name='box_geometry', kind='speed',
    targets=(f'{BASE}.BaseInstance3DBoxes.bev', f'{BASE}.BaseInstance3DBoxes.nearest_bev',
             f'{LIDAR}.LiDARInstance3DBoxes.corners'),
    upstream=UPSTREAM,
    why="the boxes' bev / nearest_bev / LiDAR corners index with Python lists and copy "
        'host tensors, a wait for the GPU each: slices, a cached unit box',
    changes=_changes))
