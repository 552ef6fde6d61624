"""mmdet3d 1.4.0: ``StackedSAModuleMSG`` runs its point MLPs as 1x1 convolutions on a
one-sample image.

PV-RCNN's set abstraction (``VoxelSetAbstraction``'s layers and the RoI grid pooling)
turns the grouped features ``(M, C, nsample)`` into a ``(1, C, M, nsample)`` image and
runs ``Conv2d(1x1) -> BatchNorm2d -> ReLU`` on it. With a batch of one, cuDNN's
BatchNorm reduces each channel over millions of positions in a few thread blocks: on an
H200 its kernels were 46 ms of a PV-RCNN micro-batch's 193 ms of kernels (batch 8; the
RoI grid pool's ``(1, 64, 221184, 16)`` alone 6.9 ms a call forward + backward,
docs/data/same_call_2026-12-04/bn_pv_rcnn.txt), and cuDNN first converts the permuted input's layout
(``nchwToNhwc``, 4 ms).

The patch runs the same layers on the features as rows ``(M * nsample, C)``: the 1x1
convolution is a matrix product with the same weight (``F.linear`` on its ``(Cout, Cin)``
view), BatchNorm normalises the same per-channel statistics with the module's own
parameters and running statistics (PyTorch's kernels for channel-last rows, which split
the reduction over the whole GPU), the activation is element-wise, and the pooling over
``nsample`` is the same max (or mean). Same outputs, gradients and running statistics as
upstream within float tolerance (summation order differs;
``tests/patches/speed/test_point_mlp_rows.py``). A module whose MLP has anything else
(another convolution, norm or activation type) runs upstream's forward.
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..patching import declare, method_patch

UPSTREAM = 'mmdet3d==1.4.0'
MODULE = 'mmdet3d.models.layers.pointnet_modules.stack_point_sa_module'

# element-wise: the same on rows as on the image
_ACTIVATIONS = (nn.ReLU, nn.LeakyReLU, nn.ReLU6, nn.ELU, nn.GELU, nn.SiLU, nn.Sigmoid,
                nn.Tanh)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _is_pointwise_conv(conv: nn.Module) -> bool:
    return (type(conv) is nn.Conv2d and conv.kernel_size == (1, 1)
            and conv.stride == (1, 1) and conv.padding in ((0, 0), 'valid')
            and conv.dilation == (1, 1) and conv.groups == 1)


def runs_as_rows(layer: nn.Module) -> bool:
    """Whether ``layer`` (an mmcv ``ConvModule``) is a 1x1 convolution with an optional
    BatchNorm and element-wise activation, which this patch computes on rows."""
    if not all(hasattr(layer, a) for a in ('conv', 'order', 'with_norm',
                                           'with_activation')):
        return False
    if getattr(layer, 'with_explicit_padding', False) or not _is_pointwise_conv(layer.conv):
        return False
    if layer.with_norm and type(layer.norm) not in _NORMS:
        return False
    return not layer.with_activation or type(layer.activate) in _ACTIVATIONS


def batch_norm_rows(bn: _BatchNorm, rows: Tensor) -> Tensor:
    """``bn`` applied to ``(rows, C)`` features as it applies to an image's pixels,
    running statistics and ``num_batches_tracked`` updated as its own forward does."""
    if type(bn) in (nn.BatchNorm1d, nn.SyncBatchNorm):
        return bn(rows)  # both take (N, C)
    momentum = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        if bn.momentum is None:  # cumulative average, as torch's forward
            momentum = 1.0 / float(bn.num_batches_tracked)
    batch_stats = bn.training or (bn.running_mean is None and bn.running_var is None)
    keep = not bn.training or bn.track_running_stats
    return F.batch_norm(rows, bn.running_mean if keep else None,
                        bn.running_var if keep else None, bn.weight, bn.bias,
                        batch_stats, momentum, bn.eps)


def conv_module_rows(layer: nn.Module, rows: Tensor) -> Tensor:
    """A ``ConvModule`` (see :func:`runs_as_rows`) on ``(rows, Cin)`` -> ``(rows, Cout)``."""
    for step in layer.order:
        if step == 'conv':
            weight = layer.conv.weight
            rows = F.linear(rows, weight.view(weight.shape[0], weight.shape[1]),
                            layer.conv.bias)
        elif step == 'norm' and layer.with_norm:
            rows = batch_norm_rows(layer.norm, rows)
        elif step == 'act' and layer.with_activation:
            rows = layer.activate(rows)
    return rows


def forward(self, xyz: Tensor, xyz_batch_cnt: Tensor, new_xyz: Tensor,
            new_xyz_batch_cnt: Tensor,
            features: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    """``StackedSAModuleMSG.forward`` with the MLPs on rows (see the module doc)."""
    if self.pool_mod not in ('max', 'avg') or not all(
            runs_as_rows(layer) for mlp in self.mlps for layer in mlp):
        return forward.original(self, xyz, xyz_batch_cnt, new_xyz, new_xyz_batch_cnt,
                                features)
    pooled: List[Tensor] = []
    for grouper, mlp in zip(self.groupers, self.mlps):
        grouped, _ = grouper(xyz, xyz_batch_cnt, new_xyz, new_xyz_batch_cnt,
                             features)  # (M, Cin, nsample)
        m, _, k = grouped.shape
        rows = grouped.transpose(1, 2).reshape(m * k, -1)  # (M * nsample, Cin)
        for layer in mlp:
            rows = conv_module_rows(layer, rows)
        rows = rows.view(m, k, -1)
        # max(...).values as upstream: one neighbour of a tie gets the gradient
        pooled.append(rows.max(dim=1).values if self.pool_mod == 'max'
                      else rows.mean(dim=1))  # (M, Cout)
    return new_xyz, torch.cat(pooled, dim=1)


PATCH = declare(method_patch(
    'point_mlp_rows', 'speed', f'{MODULE}:StackedSAModuleMSG', 'forward', forward,
    UPSTREAM,
    why="PV-RCNN's point MLPs run as 1x1 convs on a one-sample image, where cuDNN's "
        'BatchNorm is 46 ms of kernels at batch 8: the same layers on rows'))
