"""PyTorch (over mmcv's compiled kernels) versions of upstream ops that return exactly what
the upstream op returns, faster; their tests compare with the real upstream op.

This package imports nothing from the rest of ``mmdet3d_scaling``: models, the ``speed``
patches (``mmdet3d_scaling/patches/speed/``) and benchmarks import from it.
"""
from .rotated_nms import nms_bev, nms_rotated
from .voxelization import (dynamic_voxelize, grid_shape, hard_voxelize,
                           hard_voxelize_batch, point_voxel_coors)

__all__ = ['dynamic_voxelize', 'grid_shape', 'hard_voxelize', 'hard_voxelize_batch',
           'point_voxel_coors', 'nms_bev', 'nms_rotated']
