"""Data transforms of mmdet3d_scaling."""
from .bevfusion import (BEVFusionGlobalRotScaleTrans, BEVFusionRandomFlip3D,
                        BEVLoadMultiViewImageFromFiles, GridMask, ImageAug3D)
from .check_finite_inputs import CheckFiniteInputs

__all__ = [
    'BEVFusionGlobalRotScaleTrans', 'BEVFusionRandomFlip3D',
    'BEVLoadMultiViewImageFromFiles', 'GridMask', 'ImageAug3D',
    'CheckFiniteInputs'
]
