"""Sparse-convolution backends (spconv 2.x, mmcv) and their weight layouts.

BEVFusion's LiDAR encoder runs on either backend:

- ``spconv`` (spconv 2.x, CPU or CUDA): conv weights ``[out, kD, kH, kW, in]``;
- ``mmcv`` (mmcv's own sparse conv, CUDA only): conv weights ``[kD, kH, kW, in, out]``.

A checkpoint written with one backend therefore does not load into the other by name
and shape alone. The layouts and the converting loader live in
:mod:`mmdet3d_scaling.ops.sparse_layout` (re-exported here); :func:`attach_layout_loader`
gives it to every sparse conv of a module (the ``sparse_conv_layout`` fix gives it to
both backends' classes on import).
"""
import functools
import types
from typing import Dict, Iterator, NamedTuple, Tuple

from torch import Tensor, nn

from ...ops.sparse_layout import (BACKENDS, MMCV, SPCONV, checkpoint_layout,
                                  layout_shape, load_with_layout, module_layout,
                                  to_layout)


class SparseBackend(NamedTuple):
    """The classes of one sparse-conv backend."""
    name: str
    tensor: type  # SparseConvTensor
    subm_conv3d: type
    sparse_conv3d: type
    conv_base: type  # base class of every sparse conv of the backend


def _spconv_backend() -> SparseBackend:
    from spconv.pytorch import SparseConv3d, SparseConvTensor, SubMConv3d
    from spconv.pytorch.conv import SparseConvolution
    return SparseBackend(SPCONV, SparseConvTensor, SubMConv3d, SparseConv3d,
                         SparseConvolution)


def _mmcv_backend() -> SparseBackend:
    from mmcv.ops import SparseConv3d, SparseConvTensor, SubMConv3d
    from mmcv.ops.sparse_conv import SparseConvolution
    return SparseBackend(MMCV, SparseConvTensor, SubMConv3d, SparseConv3d,
                         SparseConvolution)


def default_backend_name() -> str:
    """The backend mmdet3d itself uses: spconv 2.x when installed, else mmcv."""
    from mmdet3d.models.layers.spconv import IS_SPCONV2_AVAILABLE
    return SPCONV if IS_SPCONV2_AVAILABLE else MMCV


def get_backend(name: str = 'auto') -> SparseBackend:
    """Resolve ``'auto'``, ``'spconv'`` or ``'mmcv'`` to the backend's classes."""
    if name == 'auto':
        name = default_backend_name()
    if name == SPCONV:
        try:
            return _spconv_backend()
        except ImportError as err:
            raise ImportError(
                "sparse_backend='spconv' needs spconv 2.x (pip install spconv-cu1xx, or "
                "spconv for the CPU); or use sparse_backend='mmcv' (CUDA only).") from err
    if name == MMCV:
        return _mmcv_backend()
    raise ValueError(f"sparse_backend={name!r} is not one of 'auto', "
                     f"{', '.join(repr(b) for b in BACKENDS)}.")


@functools.lru_cache(maxsize=None)
def sparse_conv_types() -> Tuple[type, ...]:
    """Base classes of sparse convs of every backend importable here."""
    found = []
    for make in (_spconv_backend, _mmcv_backend):
        try:
            found.append(make().conv_base)
        except ImportError:
            pass
    return tuple(found)


def iter_sparse_convs(root: nn.Module) -> Iterator[Tuple[str, nn.Module]]:
    """(name, module) of every sparse conv below ``root``."""
    types_ = sparse_conv_types()
    for name, module in root.named_modules():
        if types_ and isinstance(module, types_):
            yield name, module


def attach_layout_loader(root: nn.Module) -> int:
    """Give every sparse conv below ``root`` the layout-converting loader.

    Returns:
        int: how many sparse convs got it.
    """
    count = 0
    for _, conv in iter_sparse_convs(root):
        conv._load_from_state_dict = types.MethodType(load_with_layout, conv)
        count += 1
    return count


def convert_state_dict_layout(state_dict: Dict[str, Tensor], model: nn.Module,
                              layout: str) -> Dict[str, Tensor]:
    """Offline conversion: a copy of ``state_dict`` with ``model``'s sparse-conv
    weights in ``layout`` ('spconv' or 'mmcv'), e.g. to publish a checkpoint for the
    other backend. Keys must be named as in ``model.state_dict()``.
    """
    if layout not in BACKENDS:
        raise ValueError(f'layout={layout!r} is not one of {BACKENDS}.')
    out = dict(state_dict)
    metadata = getattr(state_dict, '_metadata', None) or {}
    for name, conv in iter_sparse_convs(model):
        key = f'{name}.weight' if name else 'weight'
        if key not in out:
            continue
        version = metadata.get(name, {}).get('version')
        src = checkpoint_layout(out[key], conv, version)
        if src is None:
            raise ValueError(f'{key}: shape {tuple(out[key].shape)} fits neither sparse '
                             f'conv layout of the model (kernel {tuple(conv.kernel_size)}'
                             f', in={conv.in_channels}, out={conv.out_channels}).')
        out[key] = to_layout(out[key], src, layout)
    return out


def is_sparse_tensor(x: object) -> bool:
    """Whether ``x`` is a SparseConvTensor of any backend."""
    return hasattr(x, 'features') and hasattr(x, 'indices') and hasattr(x, 'dense')


def with_features(x, features: Tensor):
    """``x`` with its features replaced (spconv 2 is functional, mmcv mutable)."""
    if hasattr(x, 'replace_feature'):
        return x.replace_feature(features)
    x.features = features
    return x


__all__ = [
    'SPCONV', 'MMCV', 'BACKENDS', 'SparseBackend', 'get_backend', 'default_backend_name',
    'sparse_conv_types', 'layout_shape', 'to_layout', 'module_layout',
    'checkpoint_layout', 'attach_layout_loader', 'iter_sparse_convs', 'load_with_layout',
    'convert_state_dict_layout', 'is_sparse_tensor', 'with_features'
]
