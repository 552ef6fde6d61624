"""TransFusion's decoder layer (``TransformerDecoderLayer``) with learned positions."""
from typing import Optional

from mmdet.models.layers.transformer import DetrTransformerDecoderLayer
from torch import Tensor, nn

from mmdet3d.registry import MODELS
from mmdet3d_scaling.registry import register


class PositionEncodingLearned(nn.Module):
    """Learned absolute position embedding: conv1d-BN-ReLU-conv1d on coordinates.

    Args:
        input_channel (int): coordinate dims (2 for BEV x, y).
        num_pos_feats (int): embedding channels. Defaults to 288.
    """

    def __init__(self, input_channel: int, num_pos_feats: int = 288) -> None:
        super().__init__()
        self.position_embedding_head = nn.Sequential(
            nn.Conv1d(input_channel, num_pos_feats, kernel_size=1),
            nn.BatchNorm1d(num_pos_feats), nn.ReLU(inplace=True),
            nn.Conv1d(num_pos_feats, num_pos_feats, kernel_size=1))

    def forward(self, xyz: Tensor) -> Tensor:
        """``[B, N, input_channel]`` -> ``[B, num_pos_feats, N]``."""
        return self.position_embedding_head(xyz.transpose(1, 2).contiguous())


def _plus(x: Tensor, pos: Optional[Tensor]) -> Tensor:
    return x if pos is None else x + pos


@register(MODELS)
class TransformerDecoderLayer(DetrTransformerDecoderLayer):
    """DETR decoder layer whose attention values also carry the position embedding.

    Differences to mmdet's ``DetrTransformerDecoderLayer``: inputs and output are
    channel-first ``[B, C, N]``; positions are coordinates, embedded by
    :class:`PositionEncodingLearned` (``self_posembed`` for queries,
    ``cross_posembed`` for keys); the value of each attention is ``x + pos``.

    Args:
        pos_encoding_cfg (dict): kwargs of :class:`PositionEncodingLearned`.
            Defaults to ``dict(input_channel=2, num_pos_feats=128)``.
        **kwargs: ``DetrTransformerDecoderLayer`` args (self_attn_cfg,
            cross_attn_cfg, ffn_cfg, norm_cfg, init_cfg).
    """

    def __init__(self,
                 pos_encoding_cfg: dict = dict(input_channel=2, num_pos_feats=128),
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.self_posembed = PositionEncodingLearned(**pos_encoding_cfg)
        self.cross_posembed = PositionEncodingLearned(**pos_encoding_cfg)

    def forward(self,
                query: Tensor,
                key: Tensor = None,
                value: Tensor = None,
                query_pos: Tensor = None,
                key_pos: Tensor = None,
                self_attn_mask: Tensor = None,
                cross_attn_mask: Tensor = None,
                key_padding_mask: Tensor = None,
                **kwargs) -> Tensor:
        """Decode ``query`` ``[B, C, Q]`` against ``key`` ``[B, C, N]``.

        ``query_pos`` ``[B, Q, 2]`` and ``key_pos`` ``[B, N, 2]`` are coordinates;
        ``value`` is ignored (it is ``key``). Returns ``[B, C, Q]``.
        """
        qpos = None if query_pos is None else self.self_posembed(query_pos).transpose(1, 2)
        kpos = None if key_pos is None else self.cross_posembed(key_pos).transpose(1, 2)
        query = query.transpose(1, 2)
        key = key.transpose(1, 2)
        query = self.self_attn(query=query, key=query, value=_plus(query, qpos),
                               query_pos=qpos, key_pos=qpos, attn_mask=self_attn_mask,
                               **kwargs)
        query = self.norms[0](query)
        query = self.cross_attn(query=query, key=key, value=_plus(key, kpos),
                                query_pos=qpos, key_pos=kpos, attn_mask=cross_attn_mask,
                                key_padding_mask=key_padding_mask, **kwargs)
        query = self.norms[1](query)
        query = self.norms[2](self.ffn(query))
        return query.transpose(1, 2)
