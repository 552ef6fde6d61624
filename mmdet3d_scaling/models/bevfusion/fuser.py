"""ConvFuser: concatenate camera and LiDAR BEV maps, then 3x3 Conv-BN-ReLU.

State-dict compatible with mmdet3d's ``projects/BEVFusion`` ``ConvFuser``
(``0.weight``, ``1.{weight,bias,running_mean,running_var}``).
"""
from typing import Sequence

import torch
from torch import Tensor, nn

from mmdet3d.registry import MODELS
from ...registry import register


@register(MODELS)
class ConvFuser(nn.Sequential):
    """Fuse BEV feature maps of equal size by concatenation and a 3x3 conv.

    Args:
        in_channels: channels of each input map, in the order they are passed
            (BEVFusion: camera first, then LiDAR, e.g. ``[80, 256]``).
        out_channels: channels of the fused map.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: int) -> None:
        self.in_channels = list(in_channels)
        self.out_channels = out_channels
        super().__init__(
            nn.Conv2d(sum(self.in_channels), out_channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(out_channels), nn.ReLU(True))

    def forward(self, inputs: Sequence[Tensor]) -> Tensor:
        channels = [x.shape[1] for x in inputs]
        if channels != self.in_channels:
            raise ValueError(f'ConvFuser was built for inputs with channels '
                             f'{self.in_channels}, got {channels}; check the config\'s '
                             'fusion_layer.in_channels (camera first, then LiDAR).')
        return super().forward(torch.cat(list(inputs), dim=1))
