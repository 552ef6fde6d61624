"""mmdet3d 1.4.0: ``Det3DDataPreprocessor.voxelize`` voxelizes a batch one sample at a time.

For ``voxel_type='hard'`` (SECOND, PointPillars, PV-RCNN, CenterPoint) the preprocessor
calls its voxel layer once per sample and then computes voxel centres, pads the batch
index and concatenates: some hundred small launches and several host reads per sample,
about 6 ms of host time each, with the GPU idle (48 ms of a PV-RCNN batch of 8 on an
H200).

The patch voxelizes the whole batch in one sort (the sample index is part of the key,
:func:`mmdet3d_scaling.ops.hard_voxelize_batch`) and computes the centres once: the same
``voxels``, ``coors``, ``num_points`` and ``voxel_centers``, bit for bit, as the loop over
mmcv's deterministic op. Everything else goes to the original: dynamic and cylindrical
voxelization, voxel layers of other classes, ``deterministic=False``, and inputs the
sort does not take (see :func:`.voxelization_layer.handles`). Tested against the
original through real preprocessors in ``tests/patches/speed/test_voxelize_batch.py``.
"""
from typing import Dict, List

from torch import Tensor

from ...ops.voxelization import hard_voxelize_batch
from ..patching import declare, method_patch
from .voxelization_layer import handles

UPSTREAM = 'mmdet3d==1.4.0'


def _stock_layers() -> tuple:
    from mmcv.ops import Voxelization
    from mmdet3d.models.data_preprocessors.voxelize import VoxelizationByGridShape
    return (Voxelization, VoxelizationByGridShape)


def _max_voxels(layer) -> int:
    """The voxel layer's limit in its mode (as its ``forward`` picks it)."""
    return layer.max_voxels[0 if layer.training else 1]


def batchable(preprocessor, points: List[Tensor]) -> bool:
    """Whether one batched sort gives what the per-sample loop gives."""
    layer = getattr(preprocessor, 'voxel_layer', None)
    if getattr(preprocessor, 'voxel_type', None) != 'hard' or not points:
        return False
    if type(layer) not in _stock_layers():  # a subclass may voxelize its own way
        return False
    if len({(p.shape[1:], p.dtype, p.device) for p in points
            if isinstance(p, Tensor)}) != 1:
        return False
    return all(handles(p, layer.voxel_size, layer.point_cloud_range,
                       layer.max_num_points, _max_voxels(layer), layer.deterministic)
               for p in points)


def voxelize(self, points: List[Tensor], data_samples) -> Dict[str, Tensor]:
    """``Det3DDataPreprocessor.voxelize`` with one sort for a hard-voxelized batch."""
    if not batchable(self, points):
        return voxelize.original(self, points, data_samples)
    layer = self.voxel_layer
    voxels, coors, num_points = hard_voxelize_batch(
        points, list(layer.voxel_size), list(layer.point_cloud_range),
        int(layer.max_num_points), int(_max_voxels(layer)))
    # the loop's formula, on all samples at once (elementwise: the same bits)
    centers = (coors[:, [3, 2, 1]] + 0.5) * voxels.new_tensor(layer.voxel_size) \
        + voxels.new_tensor(layer.point_cloud_range[0:3])
    return dict(num_points=num_points, voxel_centers=centers, voxels=voxels, coors=coors)


PATCH = declare(method_patch(
    'voxelize_batch', 'speed',
    'mmdet3d.models.data_preprocessors.data_preprocessor:Det3DDataPreprocessor',
    'voxelize', voxelize, UPSTREAM,
    why='hard voxelization runs sample by sample (~6 ms of host time each): one sort '
        'for the batch, the same voxels'))
