"""mmcv's gather-GEMM-scatter sparse convolution in a few launches, without atomics.

mmcv 2.1's ``indice_conv_forward`` / ``indice_conv_backward`` (the op under its
``SubMConv3d``, ``SparseConv3d`` and ``SparseInverseConv3d``) loop over the kernel
offsets in C++: for each of the 27 offsets of a 3x3x3 kernel a gather, a GEMM and a
scatter-add, ~81 launches forward and ~160 backward a layer. Here the same sum is one
GEMM over an im2col-style matrix:

- ``source[k, o]``: the input row that feeds output row ``o`` through offset ``k``
  (``N``, a zero row, where none does), built from mmcv's ``indice_pairs`` by one
  scatter;
- forward: ``out = G @ W.view(K * C_in, C_out)`` with ``G[o] = cat_k x[source[k, o]]``;
- backward: ``grad_W = G^T @ grad_out`` (G gathered again) and
  ``grad_x = H @ W^T`` with ``H[i] = cat_k grad_out[target[k, i]]``, ``target`` the
  same map read the other way (each input row feeds an output row at most once an
  offset, so both maps are plain scatters and the sums need no atomics: the result does
  not depend on thread order).

Semantics kept from mmcv: ``inverse`` swaps the two rows of ``indice_pairs``; a
submanifold conv takes its first offset with the most pairs as the identity map (mmcv
computes it as ``x @ W[center]``); features and filters are float32 or float16, of one
dtype (mmcv's dispatch; float64 is accepted too, for tests). The result equals mmcv's up
to the order of a float sum.

Memory: ``G`` holds ``num_out x K x C_in`` numbers (e.g. 120k voxels x 27 x 16 x 4 B =
207 MB) and is not kept for backward; output rows are processed in chunks of at most
``MAX_CHUNK_NUMBERS`` numbers of ``G``.
"""
from typing import List, Tuple

import torch
from torch import Tensor

MAX_CHUNK_NUMBERS = 1 << 27  # 512 MB of float32 for one chunk of G (or H)
_DTYPES = (torch.float32, torch.float16, torch.float64)


def _pairs_rows(inverse: bool) -> Tuple[int, int]:
    """(input row, output row) of ``indice_pairs[k]``: mmcv swaps them for inverse."""
    return (1, 0) if inverse else (0, 1)


def _maps(indice_pairs: Tensor, counts: List[int], num_in: int, num_out: int,
          inverse: bool, subm: bool) -> Tuple[Tensor, Tensor]:
    """``source [K, num_out]`` (input row a pair feeds, ``num_in`` where none) and
    ``target [K, num_in]`` (output row, ``num_out`` where none), as int64."""
    kernel = indice_pairs.shape[0]
    device = indice_pairs.device
    src_row, dst_row = _pairs_rows(inverse)
    width = max(counts) if counts else 0
    pairs = indice_pairs[:, :, :width].long()
    valid = (torch.arange(width, device=device)[None, :]
             < torch.tensor(counts, device=device)[:, None])
    offset = torch.arange(kernel, device=device)[:, None]
    ins, outs = pairs[:, src_row], pairs[:, dst_row]
    # Invalid pairs write to one trash column past the end, dropped afterwards.
    source = torch.full((kernel, num_out + 1), num_in, dtype=torch.long, device=device)
    source[offset, torch.where(valid, outs, num_out)] = torch.where(valid, ins, num_in)
    target = torch.full((kernel, num_in + 1), num_out, dtype=torch.long, device=device)
    target[offset, torch.where(valid, ins, num_in)] = torch.where(valid, outs, num_out)
    source, target = source[:, :num_out], target[:, :num_in]
    if subm and counts:  # mmcv: the fullest offset is the identity, whatever its pairs
        center = counts.index(max(counts))
        source[center] = torch.arange(num_out, device=device)
        target[center] = torch.arange(num_in, device=device)
    return source, target


def _padded(x: Tensor) -> Tensor:
    """``x`` with a zero row appended: the row that absent pairs read."""
    return torch.cat([x, x.new_zeros(1, x.shape[1])])


def _row_chunks(rows: int, width: int) -> List[Tuple[int, int]]:
    step = max(1, MAX_CHUNK_NUMBERS // max(1, width))
    return [(s, min(rows, s + step)) for s in range(0, rows, step)]


def _gathered(x_padded: Tensor, index: Tensor, start: int, end: int) -> Tensor:
    """``[end - start, K * C]``: rows ``index[:, start:end]`` of ``x_padded``, offsets
    side by side."""
    part = index[:, start:end]
    kernel = part.shape[0]
    rows = x_padded.index_select(0, part.t().reshape(-1))
    return rows.view(end - start, kernel * x_padded.shape[1])


def _weights(filters: Tensor) -> Tuple[Tensor, int, int]:
    """mmcv's filter ``[k..., C_in, C_out]`` as ``[K, C_in, C_out]``."""
    c_in, c_out = filters.shape[-2], filters.shape[-1]
    return filters.reshape(-1, c_in, c_out), c_in, c_out


def conv_forward(features: Tensor, filters: Tensor, source: Tensor) -> Tensor:
    """``out[o] = sum_k x[source[k, o]] @ W[k]`` (absent pairs read a zero row)."""
    weight, c_in, c_out = _weights(filters)
    kernel, num_out = source.shape
    flat = weight.reshape(kernel * c_in, c_out)
    x_padded = _padded(features)
    out = features.new_empty(num_out, c_out)
    for start, end in _row_chunks(num_out, kernel * c_in):
        torch.mm(_gathered(x_padded, source, start, end), flat, out=out[start:end])
    return out


def conv_backward(features: Tensor, filters: Tensor, grad_out: Tensor, source: Tensor,
                  target: Tensor) -> Tuple[Tensor, Tensor]:
    """(grad of features, grad of filters in mmcv's layout)."""
    weight, c_in, c_out = _weights(filters)
    kernel, num_out = source.shape
    grad_out = grad_out.contiguous()
    x_padded = _padded(features)
    grad_w = features.new_zeros(kernel * c_in, c_out)
    for start, end in _row_chunks(num_out, kernel * c_in):
        grad_w.addmm_(_gathered(x_padded, source, start, end).t(), grad_out[start:end])
    flat_t = weight.transpose(1, 2).reshape(kernel * c_out, c_in)
    g_padded = _padded(grad_out)
    grad_x = features.new_empty(features.shape[0], c_in)
    for start, end in _row_chunks(features.shape[0], kernel * c_out):
        torch.mm(_gathered(g_padded, target, start, end), flat_t, out=grad_x[start:end])
    return grad_x, grad_w.view(filters.shape)


def _check_dtypes(features: Tensor, filters: Tensor) -> None:
    if features.dtype != filters.dtype or features.dtype not in _DTYPES:
        raise TypeError(
            f'sparse conv got features {features.dtype} and filters {filters.dtype}; '
            "mmcv's sparse conv takes float32 or float16 (this op float64 too), both "
            'the same: run the sparse encoder outside autocast or in one of those.')


class BatchedIndiceConv(torch.autograd.Function):
    """mmcv's ``SparseConvFunction`` / ``SubMConvFunction`` /
    ``SparseInverseConvFunction`` (same arguments, same result), batched over the kernel
    offsets. ``counts`` is read to the host once a call, as mmcv's own op does."""

    @staticmethod
    def forward(ctx, features: Tensor, filters: Tensor, indice_pairs: Tensor,
                indice_pair_num: Tensor, num_activate_out: int, inverse: bool,
                subm: bool) -> Tensor:
        _check_dtypes(features, filters)
        counts = [int(c) for c in indice_pair_num.tolist()]
        source, target = _maps(indice_pairs, counts, features.shape[0],
                               int(num_activate_out), inverse, subm)
        ctx.save_for_backward(features, filters, source, target)
        return conv_forward(features, filters, source)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        features, filters, source, target = ctx.saved_tensors
        grad_x, grad_w = conv_backward(features, filters, grad_out, source, target)
        return grad_x, grad_w, None, None, None, None, None


def indice_conv(features: Tensor, filters: Tensor, indice_pairs: Tensor,
                indice_pair_num: Tensor, num_activate_out: int) -> Tensor:
    """Drop-in for ``mmcv.ops.sparse_functional.indice_conv``."""
    return BatchedIndiceConv.apply(features, filters, indice_pairs, indice_pair_num,
                                   num_activate_out, False, False)


def indice_subm_conv(features: Tensor, filters: Tensor, indice_pairs: Tensor,
                     indice_pair_num: Tensor, num_activate_out: int) -> Tensor:
    """Drop-in for ``mmcv.ops.sparse_functional.indice_subm_conv``."""
    return BatchedIndiceConv.apply(features, filters, indice_pairs, indice_pair_num,
                                   num_activate_out, False, True)


def indice_inverse_conv(features: Tensor, filters: Tensor, indice_pairs: Tensor,
                        indice_pair_num: Tensor, num_activate_out: int) -> Tensor:
    """Drop-in for ``mmcv.ops.sparse_functional.indice_inverse_conv``."""
    return BatchedIndiceConv.apply(features, filters, indice_pairs, indice_pair_num,
                                   num_activate_out, True, False)


def reference_conv(features: Tensor, filters: Tensor, indice_pairs: Tensor,
                   indice_pair_num: Tensor, num_activate_out: int, inverse: bool = False,
                   subm: bool = False) -> Tensor:
    """mmcv's per-offset loop written out in torch (float64-friendly), for tests on
    machines where mmcv's CUDA op is absent."""
    weight, _, c_out = _weights(filters)
    counts = [int(c) for c in indice_pair_num.tolist()]
    src_row, dst_row = _pairs_rows(inverse)
    out = features.new_zeros(int(num_activate_out), c_out)
    center = counts.index(max(counts)) if subm and counts else -1
    if center >= 0:
        out = out + features @ weight[center]
    for k, n in enumerate(counts):
        if n <= 0 or k == center:
            continue
        ins = indice_pairs[k, src_row, :n].long()
        outs = indice_pairs[k, dst_row, :n].long()
        out = out.index_add(0, outs, features[ins] @ weight[k])
    return out
