"""GeneralizedLSSFPN: BEVFusion's image neck (upsample, concatenate, 1x1 + 3x3 conv).

State-dict compatible with mmdet3d's ``projects/BEVFusion`` neck of the same name
(``lateral_convs.i.{conv,bn}``, ``fpn_convs.i.{conv,bn}``); ``with_cp`` adds gradient
checkpointing per output level.
"""
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn import ConvModule
from mmengine.model import BaseModule
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from mmdet3d.registry import MODELS
from ...registry import register


@register(MODELS)
class GeneralizedLSSFPN(BaseModule):
    """Top-down FPN that concatenates (rather than adds) the upsampled coarser level.

    Level ``i`` (from coarse to fine): ``cat(x_i, up(y_{i+1}))`` -> 1x1 ConvModule ->
    3x3 ConvModule, where ``y_{last}`` is the last input itself. Outputs the
    ``len(in_channels) - 1`` finer levels, each with ``out_channels`` channels.

    Args:
        in_channels: channels of each input level (fine to coarse).
        out_channels: channels of every output level.
        num_outs: kept for config compatibility (upstream ignores it too).
        start_level: first input level used. Default 0.
        end_level: last input level (exclusive) or -1 for all. Default -1.
        no_norm_on_lateral: no norm in the 1x1 convs. Default False.
        conv_cfg, norm_cfg, act_cfg: mmcv ConvModule configs. Defaults None,
            ``dict(type='BN2d')``, ``dict(type='ReLU')``.
        upsample_cfg: ``F.interpolate`` kwargs. Default bilinear, align_corners=True.
        with_cp: gradient checkpointing of every level. Default False.
        init_cfg: mmengine init config. Default None.
    """

    def __init__(self,
                 in_channels: Sequence[int],
                 out_channels: int,
                 num_outs: int,
                 start_level: int = 0,
                 end_level: int = -1,
                 no_norm_on_lateral: bool = False,
                 conv_cfg: Optional[dict] = None,
                 norm_cfg: Optional[dict] = dict(type='BN2d'),
                 act_cfg: Optional[dict] = dict(type='ReLU'),
                 upsample_cfg: dict = dict(mode='bilinear', align_corners=True),
                 with_cp: bool = False,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if not isinstance(in_channels, (list, tuple)) or len(in_channels) < 2:
            raise ValueError('GeneralizedLSSFPN needs in_channels as a list of at least '
                             f'two levels, got {in_channels!r}.')
        self.in_channels = list(in_channels)
        self.out_channels = out_channels
        self.num_ins = len(in_channels)
        self.num_outs = num_outs
        self.no_norm_on_lateral = no_norm_on_lateral
        self.upsample_cfg = dict(upsample_cfg)
        self.with_cp = with_cp
        if end_level == -1:
            self.backbone_end_level = self.num_ins - 1
        else:
            if end_level > self.num_ins or num_outs != end_level - start_level:
                raise ValueError(f'end_level={end_level} needs end_level <= '
                                 f'{self.num_ins} and num_outs == end_level - '
                                 f'start_level, got num_outs={num_outs}.')
            self.backbone_end_level = end_level
        self.start_level = start_level
        self.end_level = end_level
        self.lateral_convs = nn.ModuleList()
        self.fpn_convs = nn.ModuleList()
        for i in range(start_level, self.backbone_end_level):
            extra = (in_channels[i + 1]
                     if i == self.backbone_end_level - 1 else out_channels)
            self.lateral_convs.append(
                ConvModule(in_channels[i] + extra, out_channels, 1, conv_cfg=conv_cfg,
                           norm_cfg=None if no_norm_on_lateral else norm_cfg,
                           act_cfg=act_cfg, inplace=False))
            self.fpn_convs.append(
                ConvModule(out_channels, out_channels, 3, padding=1, conv_cfg=conv_cfg,
                           norm_cfg=norm_cfg, act_cfg=act_cfg, inplace=False))

    def _level(self, i: int, fine: Tensor, coarse: Tensor) -> Tensor:
        up = F.interpolate(coarse, size=fine.shape[2:], **self.upsample_cfg)
        return self.fpn_convs[i](self.lateral_convs[i](torch.cat([fine, up], dim=1)))

    def forward(self, inputs: Sequence[Tensor]) -> Tuple[Tensor, ...]:
        if len(inputs) != len(self.in_channels):
            raise ValueError(f'GeneralizedLSSFPN expects {len(self.in_channels)} '
                             f'feature levels, got {len(inputs)}.')
        laterals: List[Tensor] = [inputs[i + self.start_level] for i in range(len(inputs))]
        used = len(laterals) - 1
        use_cp = self.with_cp and self.training and torch.is_grad_enabled()
        for i in range(used - 1, -1, -1):
            if use_cp:
                laterals[i] = checkpoint(self._level, i, laterals[i], laterals[i + 1],
                                         use_reentrant=False)
            else:
                laterals[i] = self._level(i, laterals[i], laterals[i + 1])
        return tuple(laterals[:used])
