"""Sparse-conv weight layouts of mmcv and spconv 2.x, and a loader that converts.

- ``spconv`` (spconv 2.x): weights ``[out, kD, kH, kW, in]``;
- ``mmcv`` (mmcv's own sparse conv): weights ``[kD, kH, kW, in, out]``.

:func:`load_with_layout` is a sparse conv's ``_load_from_state_dict`` that reads a
checkpoint weight's layout off its shape (metadata ``version`` 2 = spconv only breaks a
tie) and converts it to the module's own; BEVFusion's encoder attaches it per module and
the ``sparse_conv_layout`` fix gives it to both backends' classes.
"""
from typing import Dict, Iterable, Optional, Tuple

from torch import Tensor, nn

SPCONV = 'spconv'
MMCV = 'mmcv'
BACKENDS = (SPCONV, MMCV)


def layout_shape(out_channels: int, kernel_size: Iterable[int], in_channels: int,
                 layout: str) -> Tuple[int, ...]:
    """The weight shape of a sparse conv in ``layout`` ('spconv' or 'mmcv')."""
    kernel = tuple(int(k) for k in kernel_size)
    if layout == SPCONV:
        return (out_channels, *kernel, in_channels)
    if layout == MMCV:
        return (*kernel, in_channels, out_channels)
    raise ValueError(f'layout={layout!r} is not one of {BACKENDS}.')


def to_layout(weight: Tensor, src: str, dst: str) -> Tensor:
    """Permute a sparse-conv weight from layout ``src`` to layout ``dst``."""
    if src == dst:
        return weight
    ndim = weight.dim()
    if src == MMCV and dst == SPCONV:  # [k..., in, out] -> [out, k..., in]
        return weight.permute(ndim - 1, *range(ndim - 1)).contiguous()
    if src == SPCONV and dst == MMCV:  # [out, k..., in] -> [k..., in, out]
        return weight.permute(*range(1, ndim), 0).contiguous()
    raise ValueError(f'unknown layouts {src!r} -> {dst!r}; use {BACKENDS}.')


def module_layout(conv: nn.Module) -> str:
    """The layout of ``conv``'s own weight, read off its shape."""
    kernel = tuple(conv.kernel_size)
    shape = tuple(conv.weight.shape)
    for layout in BACKENDS:
        if shape == layout_shape(conv.out_channels, kernel, conv.in_channels, layout):
            return layout
    raise ValueError(f'sparse conv {type(conv).__name__} has weight shape {shape}, '
                     f'which is neither spconv nor mmcv layout for kernel {kernel}, '
                     f'in={conv.in_channels}, out={conv.out_channels}.')


def checkpoint_layout(weight: Tensor, conv: nn.Module,
                      version: Optional[int] = None) -> Optional[str]:
    """The layout a checkpoint's ``weight`` for ``conv`` is in; None if neither fits.

    Decided by shape. Only when both layouts give the same shape (e.g. in = out =
    kernel) does the checkpoint's module metadata decide: version 2 means spconv 2.
    """
    kernel = tuple(conv.kernel_size)
    shape = tuple(weight.shape)
    fits = [layout for layout in BACKENDS
            if shape == layout_shape(conv.out_channels, kernel, conv.in_channels, layout)]
    if len(fits) == 1:
        return fits[0]
    if len(fits) == 2:
        return SPCONV if version == 2 else module_layout(conv)
    return None




def load_with_layout(self: nn.Module, state_dict: Dict[str, Tensor], prefix: str,
                      local_metadata: dict, strict: bool, missing_keys: list,
                      unexpected_keys: list, error_msgs: list) -> None:
    """``_load_from_state_dict`` of a sparse conv: convert the weight, then load."""
    key = prefix + 'weight'
    if key in state_dict:
        weight = state_dict[key]
        src = checkpoint_layout(weight, self, local_metadata.get('version'))
        if src is not None:
            state_dict[key] = to_layout(weight, src, module_layout(self))
        # else: torch reports the size mismatch with both shapes.
    nn.Module._load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                                    missing_keys, unexpected_keys, error_msgs)


__all__ = ['SPCONV', 'MMCV', 'BACKENDS', 'layout_shape', 'to_layout', 'module_layout',
           'checkpoint_layout', 'load_with_layout']
