"""BEVFusion's sparse 3D encoder (``BEVFusionSparseEncoder``) on spconv 2.x or mmcv.

Same structure, parameter names and shapes as mmdet3d 1.4's
``projects/BEVFusion/bevfusion/sparse_encoder.py`` (a SECOND-style sparse encoder whose
spatial order is (X, Y, Z), not mmdet3d's (Z, Y, X)), written here so that the backend
is an argument instead of a process-wide registry override, and so that checkpoints of
either backend's weight layout load (see :mod:`.sparse_backend`).
"""
from typing import List, Optional, Sequence, Tuple, Union

import torch
from mmcv.cnn import build_norm_layer
from torch import Tensor, nn

from mmdet3d.registry import MODELS
from mmdet3d_scaling.registry import register
from .sparse_backend import (SparseBackend, attach_layout_loader, get_backend,
                             sparse_conv_types, with_features)

IntOrTuple = Union[int, Tuple[int, int, int]]


class SparseSequential(nn.Sequential):
    """Sequential container for sparse tensors of either backend.

    Children that take a sparse tensor (sparse convs, blocks, nested containers) get
    the tensor; the others (norm, activation) get its feature matrix.
    """

    def forward(self, x):
        for module in self:
            if _takes_sparse(module):
                x = module(x)
            else:
                x = with_features(x, module(x.features))
        return x


class SparseBasicBlock(nn.Module):
    """Residual block of two 3x3x3 submanifold convs (names as mmdet3d's
    ``SparseBasicBlock``: conv1, bn1, conv2, bn2).

    Args:
        channels (int): input = output channels.
        backend (SparseBackend): sparse-conv classes to build with.
        norm_cfg (dict): norm layer config, e.g. ``dict(type='BN1d', eps=1e-3,
            momentum=0.01)``.
        indice_key (str, optional): submanifold indice key shared by the stage.
    """

    def __init__(self, channels: int, backend: SparseBackend, norm_cfg: dict,
                 indice_key: Optional[str] = None) -> None:
        super().__init__()
        self.conv1 = backend.subm_conv3d(
            channels, channels, 3, stride=1, padding=1, bias=False, indice_key=indice_key)
        self.bn1 = build_norm_layer(norm_cfg, channels)[1]
        self.conv2 = backend.subm_conv3d(
            channels, channels, 3, stride=1, padding=1, bias=False, indice_key=indice_key)
        self.bn2 = build_norm_layer(norm_cfg, channels)[1]
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x.features
        out = self.conv1(x)
        out = with_features(out, self.relu(self.bn1(out.features)))
        out = self.conv2(out)
        out = with_features(out, self.relu(self.bn2(out.features) + identity))
        return out


class _ThreadsForBackward(torch.autograd.Function):
    """Identity whose backward sets torch's intra-op threads to ``threads``.

    Placed at the encoder's output (backward: 1 thread) and input (backward: restore),
    it brackets the encoder's backward, which autograd runs between the two.
    """

    @staticmethod
    def forward(ctx, x: Tensor, threads: int, anchor: Tensor) -> Tensor:
        ctx.threads = threads
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        torch.set_num_threads(ctx.threads)
        return grad, None, None


class _SingleThreadedSpconvCPU:
    """Run spconv 2.3's CPU kernels with one intra-op thread, forward and backward.

    With more threads, spconv 2.3.8's CPU submanifold conv gave wrong results for some
    channel counts (SubMConv3d 32 -> 32 on 7k voxels: 0.13 max abs difference between 1
    and 2 threads, the 1-thread result matching a dense-conv reference to 3e-7).
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and torch.get_num_threads() > 1
        self.threads = torch.get_num_threads()

    def wrap_input(self, feats: Tensor) -> Tensor:
        if not self.enabled or not torch.is_grad_enabled():
            return feats
        anchor = feats.new_zeros(0, requires_grad=True)  # puts the node in the graph
        return _ThreadsForBackward.apply(feats, self.threads, anchor)

    def wrap_output(self, out: Tensor) -> Tensor:
        if not self.enabled or not out.requires_grad:
            return out
        return _ThreadsForBackward.apply(out, 1, None)

    def __enter__(self):
        if self.enabled:
            torch.set_num_threads(1)
        return self

    def __exit__(self, *exc) -> None:
        if self.enabled:
            torch.set_num_threads(self.threads)


def _takes_sparse(module: nn.Module) -> bool:
    return isinstance(module, (SparseSequential, SparseBasicBlock, *sparse_conv_types()))


def _conv_module(backend: SparseBackend, in_channels: int, out_channels: int,
                 kernel_size: IntOrTuple, norm_cfg: dict, *, stride: IntOrTuple = 1,
                 padding: IntOrTuple = 0, indice_key: Optional[str] = None,
                 subm: bool = True,
                 order: Sequence[str] = ('conv', 'norm', 'act')) -> SparseSequential:
    """conv (+ norm) (+ ReLU) in ``order``, children named 0, 1, 2 as in mmdet3d's
    ``make_sparse_convmodule``."""
    conv_cls = backend.subm_conv3d if subm else backend.sparse_conv3d
    layers = []
    for kind in order:
        if kind == 'conv':
            layers.append(conv_cls(in_channels, out_channels, kernel_size, stride=stride,
                                   padding=padding, bias=False, indice_key=indice_key))
        elif kind == 'norm':
            layers.append(build_norm_layer(norm_cfg, out_channels)[1])
        elif kind == 'act':
            layers.append(nn.ReLU(inplace=True))
    return SparseSequential(*layers)


@register(MODELS)
class BEVFusionSparseEncoder(nn.Module):
    """Sparse voxel encoder of BEVFusion; output is a BEV map ``[B, C*Z', X', Y']``.

    Args:
        in_channels (int): voxel feature channels (5 for nuScenes x, y, z, i, t).
        sparse_shape (list[int]): voxel grid (X, Y, Z), e.g. [1440, 1440, 41].
        order (tuple[str]): order of conv / norm / act of the input layer; when it does
            not start with 'conv', the input layer is a bare conv (pre-activation).
            Defaults to ('conv', 'norm', 'act').
        norm_cfg (dict): norm layer config. Defaults to
            ``dict(type='BN1d', eps=1e-3, momentum=0.01)``.
        base_channels (int): channels of the input layer. Defaults to 16.
        output_channels (int): channels of the output layer. Defaults to 128.
        encoder_channels (tuple[tuple[int]]): channels of each block, per stage.
        encoder_paddings (tuple[tuple]): padding of each block, per stage (used by the
            strided convs for ``block_type='basicblock'``).
        block_type (str): 'conv_module' (SECOND) or 'basicblock' (residual blocks, the
            official BEVFusion setting). Defaults to 'conv_module'.
        return_middle_feats (bool): also return every stage's sparse output.
            Defaults to False.
        sparse_backend (str): 'auto' (mmdet3d's choice: spconv 2.x if installed, else
            mmcv), 'spconv' or 'mmcv'. Defaults to 'auto'.
    """

    def __init__(self,
                 in_channels: int,
                 sparse_shape: Sequence[int],
                 order: Tuple[str, ...] = ('conv', 'norm', 'act'),
                 norm_cfg: dict = dict(type='BN1d', eps=1e-3, momentum=0.01),
                 base_channels: int = 16,
                 output_channels: int = 128,
                 encoder_channels: Sequence[Sequence[int]] = ((16, ), (32, 32, 32),
                                                              (64, 64, 64), (64, 64, 64)),
                 encoder_paddings: Sequence[Sequence] = ((1, ), (1, 1, 1), (1, 1, 1),
                                                         ((0, 1, 1), 1, 1)),
                 block_type: str = 'conv_module',
                 return_middle_feats: bool = False,
                 sparse_backend: str = 'auto') -> None:
        super().__init__()
        self._check_args(sparse_shape, order, block_type, encoder_channels,
                         encoder_paddings)
        self.in_channels = in_channels
        self.sparse_shape = list(sparse_shape)
        self.order = tuple(order)
        self.base_channels = base_channels
        self.output_channels = output_channels
        self.encoder_channels = encoder_channels
        self.encoder_paddings = encoder_paddings
        self.block_type = block_type
        self.return_middle_feats = return_middle_feats
        self.backend = get_backend(sparse_backend)
        self.stage_num = len(encoder_channels)

        b = self.backend
        input_order = self.order if self.order[0] == 'conv' else ('conv', )
        self.conv_input = _conv_module(b, in_channels, base_channels, 3, norm_cfg,
                                       padding=1, indice_key='subm1', order=input_order)
        out_channels = self._make_encoder_layers(norm_cfg)
        self.conv_out = _conv_module(b, out_channels, output_channels, (1, 1, 3), norm_cfg,
                                     stride=(1, 1, 2), padding=0,
                                     indice_key='spconv_down2', subm=False)
        attach_layout_loader(self)

    @staticmethod
    def _check_args(sparse_shape, order, block_type, channels, paddings) -> None:
        if len(sparse_shape) != 3:
            raise ValueError(f'sparse_shape={list(sparse_shape)} must be the voxel grid '
                             '(X, Y, Z), e.g. [1440, 1440, 41].')
        if tuple(sorted(order)) != ('act', 'conv', 'norm'):
            raise ValueError(f'order={order} must be a permutation of '
                             "('conv', 'norm', 'act').")
        if block_type not in ('conv_module', 'basicblock'):
            raise ValueError(f"block_type={block_type!r} must be 'conv_module' or "
                             "'basicblock'.")
        if len(channels) != len(paddings) or any(
                len(tuple(c)) != len(tuple(p)) for c, p in zip(channels, paddings)):
            raise ValueError(f'encoder_paddings={paddings} must have one entry per '
                             f'block of encoder_channels={channels}.')

    def _make_encoder_layers(self, norm_cfg: dict) -> int:
        """Build ``encoder_layers.encoder_layer{i}``; return their output channels."""
        b = self.backend
        self.encoder_layers = SparseSequential()
        in_channels = self.base_channels
        last_stage = len(self.encoder_channels) - 1
        for i, blocks in enumerate(self.encoder_channels):
            blocks = tuple(blocks)
            stage = []
            for j, out_channels in enumerate(blocks):
                padding = tuple(self.encoder_paddings[i])[j]
                if self.block_type == 'basicblock':
                    if j == len(blocks) - 1 and i != last_stage:  # strided conv ends stage
                        stage.append(_conv_module(
                            b, in_channels, out_channels, 3, norm_cfg, stride=2,
                            padding=padding, indice_key=f'spconv{i + 1}', subm=False))
                    else:
                        if in_channels != out_channels:
                            raise ValueError(
                                f'encoder_channels={self.encoder_channels}: residual '
                                f'block {j} of stage {i + 1} changes channels '
                                f'{in_channels} -> {out_channels}; in a basicblock '
                                'encoder only the last block of a stage may.')
                        stage.append(SparseBasicBlock(out_channels, b, norm_cfg,
                                                      indice_key=f'subm{i + 1}'))
                elif i != 0 and j == 0:  # conv_module: strided conv starts stage
                    stage.append(_conv_module(
                        b, in_channels, out_channels, 3, norm_cfg, stride=2,
                        padding=padding, indice_key=f'spconv{i + 1}', subm=False))
                else:
                    stage.append(_conv_module(
                        b, in_channels, out_channels, 3, norm_cfg, padding=padding,
                        indice_key=f'subm{i + 1}'))
                in_channels = out_channels
            self.encoder_layers.add_module(f'encoder_layer{i + 1}',
                                           SparseSequential(*stage))
        return in_channels

    def forward(self, voxel_features: Tensor, coors: Tensor,
                batch_size: int) -> Union[Tensor, Tuple[Tensor, List]]:
        """Encode voxels into a BEV feature map.

        Args:
            voxel_features (Tensor): ``[M, C]`` features of M voxels.
            coors (Tensor): ``[M, 4]`` voxel indices (batch, x, y, z).
            batch_size (int): number of samples.

        Returns:
            Tensor: ``[B, C_out * Z', X', Y']`` (and the stages' sparse outputs when
            ``return_middle_feats``).
        """
        guard = _SingleThreadedSpconvCPU(self.backend.name == 'spconv'
                                         and not voxel_features.is_cuda)
        with guard:
            x = self.backend.tensor(guard.wrap_input(voxel_features), coors.int(),
                                    self.sparse_shape, int(batch_size))
            x = self.conv_input(x)
            stage_outputs = []
            for stage in self.encoder_layers:
                x = stage(x)
                stage_outputs.append(x)
            dense = self.conv_out(stage_outputs[-1]).dense()  # [B, C, X, Y, Z]
            n, c, h, w, d = dense.shape
            bev = dense.permute(0, 1, 4, 2, 3).reshape(n, c * d, h, w)
        bev = guard.wrap_output(bev)
        if self.return_middle_feats:
            return bev, stage_outputs
        return bev


__all__ = ['BEVFusionSparseEncoder', 'SparseBasicBlock', 'SparseSequential']
