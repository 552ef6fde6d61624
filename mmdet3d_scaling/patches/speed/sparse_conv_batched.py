"""mmcv 2.1.0: its sparse convolution launches a gather, a GEMM and a scatter per offset.

mmcv's ``SubMConv3d``, ``SparseConv3d`` and ``SparseInverseConv3d`` (mmdet3d's sparse
encoders when spconv 2.x is not installed: SECOND, PV-RCNN, Part-A2, CenterPoint,
BEVFusion with ``sparse_backend='mmcv'``) call ``indice_subm_conv`` / ``indice_conv`` /
``indice_inverse_conv`` of ``mmcv.ops.sparse_functional``, whose C++ loops over the 27
offsets of a 3x3x3 kernel: ~80 launches forward and ~160 backward a layer (6,509 in
BEVFusion's backward). The patch rebinds the three functions to
:mod:`mmdet3d_scaling.ops.sparse_conv`: one gather and one GEMM over all offsets
(forward), two of each backward, no atomics. Same arguments, same result up to the order
of a float sum (tested against mmcv's op on CUDA in
``tests/patches/speed/test_sparse_conv_batched.py``); calls on devices other than CUDA
go to mmcv unchanged.

Opt-in only (``patches=['sparse_conv_batched']``, not part of the ``speed`` set): on an
H200 it cuts a BEVFusion encoder step from 8,505 kernels to 2,517 but takes 666 ms
instead of mmcv's 232 (SECOND: 4,482 -> 896 kernels, 72 -> 97 ms), and a BEVFusion
training step runs at 5.6 instead of 10.9 samples/s (docs/benchmarks.md, "Sparse
convolution"). The im2col matrix holds every offset of every output row, present or
not; spconv 2.x (implicit GEMM) is the fast path: 59 ms for the same encoder in bf16.
"""
from typing import Callable, List

from torch import Tensor

from ...ops import sparse_conv as batched
from ..patching import Change, Patch, declare, resolve_owner

UPSTREAM = 'mmcv==2.1.0'
MODULE = 'mmcv.ops.sparse_functional'
FUNCTIONS = ('indice_conv', 'indice_subm_conv', 'indice_inverse_conv')


def _replacement(name: str, original: Callable) -> Callable:
    fast = getattr(batched, name)

    def conv(features: Tensor, filters: Tensor, indice_pairs: Tensor,
             indice_pair_num: Tensor, num_activate_out: int) -> Tensor:
        if features.device.type != 'cuda':  # mmcv's op runs on CUDA (and MLU) only
            return original(features, filters, indice_pairs, indice_pair_num,
                            num_activate_out)
        return fast(features, filters, indice_pairs, indice_pair_num, num_activate_out)

    conv.__name__ = conv.__qualname__ = name
    conv.__doc__ = f'``{MODULE}.{name}`` batched over the kernel offsets.'
    conv.original = original
    return conv


def _changes() -> List[Change]:
    module = resolve_owner(MODULE)
    return [Change(module, name, _replacement(name, getattr(module, name)))
            for name in FUNCTIONS]


PATCH = declare(Patch(
    name='sparse_conv_batched', kind='speed',
    targets=tuple(f'{MODULE}.{f}' for f in FUNCTIONS), upstream=UPSTREAM,
    why="mmcv's sparse conv launches a gather, GEMM and scatter per kernel offset: one "
        'gather and one GEMM over all offsets, no atomics',
    changes=_changes, in_set=False))
