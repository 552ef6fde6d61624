"""mmcv 2.1.0 / mmdet3d 1.4.0: deterministic hard voxelization scans every earlier point.

mmcv's ``Voxelization`` and mmdet3d's ``VoxelizationByGridShape`` (the ``voxel_layer`` of
``Det3DDataPreprocessor``: PointPillars, SECOND, PV-RCNN, CenterPoint) call a module-level
``voxelization`` function. With ``deterministic=True`` (their default) its CUDA kernel
compares each point with every earlier point (``point_to_voxelidx_kernel``, quadratic in
the points of a sample) and numbers the voxels in one GPU thread
(``determin_voxel_num``); on BEVFusion's nuScenes scans that is 33 ms at 150k points and
73 ms at 300k on an H200.

The patch rebinds that function, in both modules, to one that gives the same voxels,
coordinates and counts (same order, same padding, same dtypes) from a stable sort of the
voxel keys (:func:`mmdet3d_scaling.ops.hard_voxelize`). Everything else goes to the
original unchanged: ``deterministic=False`` (mmcv's atomics kernel: fast, and its voxel
order is not reproducible anyway), dynamic voxelization (``max_num_points`` or
``max_voxels`` -1: already one elementwise kernel), and inputs the original rejects or
treats in its own way (CUDA points other than float32, bad arguments, other devices).
Tensor equality with mmcv's op is tested in ``tests/ops/test_voxelization.py`` and
through a real ``Det3DDataPreprocessor`` in ``tests/patches/speed/test_voxelization_layer.py``.
"""
from numbers import Integral
from typing import Any, Callable, List, Sequence

import torch
from torch import Tensor

from ...ops.voxelization import grid_shape, hard_voxelize
from ..patching import Change, Patch, declare, resolve_owner

UPSTREAM = ('mmcv==2.1.0', 'mmdet3d==1.4.0')
MODULES = ('mmcv.ops.voxelize', 'mmdet3d.models.data_preprocessors.voxelize')
_CPU_DTYPES = (torch.float32, torch.float16, torch.float64)  # mmcv's CPU dispatch


def _is_index(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _sizes_ok(voxel_size: Any, coors_range: Any) -> bool:
    if not all(isinstance(v, (list, tuple)) for v in (voxel_size, coors_range)):
        return False
    try:
        grid_shape(voxel_size, coors_range)
    except (ValueError, TypeError):
        return False
    return True


def handles(points: Any, voxel_size: Any, coors_range: Any, max_points: Any,
            max_voxels: Any, deterministic: Any) -> bool:
    """Whether the sort gives this call's result; otherwise the original runs."""
    if not deterministic or not _is_index(max_points) or not _is_index(max_voxels):
        return False
    if max_points < 1 or max_voxels < 0:  # -1: dynamic voxelization
        return False
    if not isinstance(points, Tensor) or points.dim() != 2 or points.shape[1] < 3:
        return False
    if points.device.type == 'cuda':
        dtype_ok = points.dtype == torch.float32  # the CUDA kernel reads float only
    else:
        dtype_ok = points.device.type == 'cpu' and points.dtype in _CPU_DTYPES
    return dtype_ok and _sizes_ok(voxel_size, coors_range)


def _replacement(original: Callable) -> Callable:
    def voxelization(points: Tensor, voxel_size: Sequence[float],
                     coors_range: Sequence[float], max_points: int = 35,
                     max_voxels: int = 20000, deterministic: bool = True):
        """mmcv's ``voxelization`` by a sort over voxel keys (see module doc)."""
        if not handles(points, voxel_size, coors_range, max_points, max_voxels,
                       deterministic):
            return original(points, voxel_size, coors_range, max_points, max_voxels,
                            deterministic)
        return hard_voxelize(points, list(voxel_size), list(coors_range),
                             int(max_points), int(max_voxels))

    voxelization.original = original
    return voxelization


def _changes() -> List[Change]:
    changes = []
    for name in MODULES:
        module = resolve_owner(name)
        changes.append(Change(module, 'voxelization', _replacement(module.voxelization)))
    return changes


PATCH = declare(Patch(
    name='voxelization_layer', kind='speed',
    targets=tuple(f'{m}.voxelization' for m in MODULES), upstream=UPSTREAM,
    why='deterministic hard voxelization compares every point with every earlier one '
        '(34 % of BEVFusion\'s GPU time): one sort, the same voxels',
    changes=_changes))
