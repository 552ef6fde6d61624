"""Exact faster versions of upstream ops, in pure PyTorch over mmcv's compiled kernels.

Each function returns what the upstream op returns (its tests compare with the real
upstream op). This package imports nothing from the rest of ``mmdet3d_scaling``; the
``speed`` patches in ``mmdet3d_scaling/compat/`` route upstream calls through it.
"""
from .nms_rotated import nms_bev, nms_rotated

__all__ = ['nms_rotated', 'nms_bev']
