"""BEVFusion without torchpack and without a compiled extension of ours.

Registered under the type names of mmdet3d 1.4's ``projects/BEVFusion`` so that its
configs run with ``custom_imports = dict(imports=['mmdet3d_scaling'])``; state dicts
match the official checkpoints (sparse-conv weights in spconv or mmcv layout).
"""
from .assigners import (BBoxBEVL1Cost, HeuristicAssigner3D, HungarianAssigner3D,
                        IoU3DCost)
from .bbox_coder import TransFusionBBoxCoder
from .bevfusion import BEVFusion
from .bevfusion_necks import GeneralizedLSSFPN
from .data_preprocessor import BEVFusionDataPreprocessor
from .depth_lss import DepthLSSTransform, LSSTransform
from .fuser import ConvFuser
from .sparse_backend import convert_state_dict_layout
from .sparse_encoder import BEVFusionSparseEncoder
from .transformer import TransformerDecoderLayer
from .transfusion_head import TransFusionHead
from .voxelize import BEVFusionVoxelizer

__all__ = [
    'BEVFusion', 'BEVFusionSparseEncoder', 'BEVFusionVoxelizer', 'TransFusionHead',
    'TransformerDecoderLayer', 'TransFusionBBoxCoder', 'HungarianAssigner3D',
    'HeuristicAssigner3D', 'BBoxBEVL1Cost', 'IoU3DCost', 'convert_state_dict_layout',
    'GeneralizedLSSFPN', 'LSSTransform', 'DepthLSSTransform', 'ConvFuser',
    'BEVFusionDataPreprocessor'
]
