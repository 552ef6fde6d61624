"""Pure PyTorch kernels (CPU and CUDA) that return exactly what an upstream op returns.

This package imports nothing from the rest of ``mmdet3d_scaling``: models, patches and
benchmarks import from it.
"""
from .voxelization import (dynamic_voxelize, grid_shape, hard_voxelize,
                           hard_voxelize_batch, point_voxel_coors)

__all__ = ['dynamic_voxelize', 'grid_shape', 'hard_voxelize', 'hard_voxelize_batch',
           'point_voxel_coors']
