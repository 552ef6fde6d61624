"""BEV pooling in plain PyTorch: sum frustum features into a voxel grid.

Replaces mmdet3d's ``projects/BEVFusion`` ``bev_pool_ext`` CUDA extension, with no
compiled code of ours. Three ways to pool, all with the same result:

* ``index_add`` (default): one scatter-add (``Tensor.index_add_``, atomics on CUDA);
  backward is a gather. Fastest; the summation order, hence the last bits, may vary
  between runs on CUDA.
* ``sorted`` (``deterministic=True``): sort points by cell, then a segment sum
  (``torch.segment_reduce``) in a fixed order; no atomics, bit-reproducible.
* the lean path, :func:`pool_depth_context`: pools ``depth x context`` directly by
  precomputed cell indices without materialising the ``M x D x H x W x C`` frustum
  tensor (the BEVPoolv2 idea): a Triton kernel on CUDA when Triton is installed,
  otherwise an exact PyTorch fallback that works through the depth bins in chunks.

Cells are addressed by a flat index ``((b * D + z) * H + x) * W + y`` (upstream's
``bev_pool(feats, coords, B, D, H, W)`` layout, output ``B x C x D x H x W``). Points
outside the grid are sent to spare "dump" rows past the last cell and dropped, so no
boolean filtering (a host sync) is needed; the functions here never call ``.item()``
or branch on tensor values. Low-precision inputs (fp16/bf16) are summed in fp32 and
returned in their own dtype.
"""
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from . import bev_pool_triton

# Spare rows that collect out-of-grid points. Several of them spread the atomics of
# the scatter-add path so they don't all hit one address.
NUM_DUMP_ROWS = 256
# Rows per fp32 conversion chunk when scatter-adding fp16/bf16 features.
_LOW_PRECISION_CHUNK = 1 << 20
POOL_METHODS = ('index_add', 'sorted')


def _check_method(method: str) -> None:
    if method not in POOL_METHODS:
        raise ValueError(f'bev_pool method {method!r} is not one of {POOL_METHODS}; '
                         'use "index_add" (fast) or "sorted" (deterministic).')


def cell_index(coords: Tensor, grid: Sequence[int]) -> Tensor:
    """Flat cell index of integer voxel coordinates, dump rows for points outside.

    Args:
        coords: ``(..., 4)`` integer ``(x, y, z, batch)`` voxel coordinates
            (upstream's ``geom_feats`` layout).
        grid: ``(B, D, H, W)``: batch size, cells along z, x and y.

    Returns:
        ``int64`` tensor of ``coords.shape[:-1]``: ``((b*D + z)*H + x)*W + y`` inside
        the grid; ``B*D*H*W + k`` (``0 <= k < NUM_DUMP_ROWS``) outside.
    """
    B, D, H, W = (int(v) for v in grid)
    coords = coords.long()
    # Few, large kernels: one bounds test and one dot product over (x, y, z, b).
    # Non-blocking copies of the small constants: a blocking one would sync.
    consts = torch.tensor([[H, W, D, B], [W, 1, H * W, D * H * W]])
    upper, strides = consts.to(coords.device, non_blocking=True).unbind(0)
    inside = ((coords >= 0) & (coords < upper)).all(-1)
    flat = (coords * strides).sum(-1)
    return _dump_outside(flat, inside, B * D * H * W)


def _dump_outside(flat: Tensor, inside: Tensor, num_cells: int) -> Tensor:
    # Any int64 & (2^k - 1) lies in [0, 2^k): spreads outside points over the dump rows.
    return torch.where(inside, flat, (flat & (NUM_DUMP_ROWS - 1)) + num_cells)


def geometry_cell_index(geom: Tensor, lower: Tensor, step: Tensor,
                        grid_xyz: Sequence[int]) -> Tensor:
    """Flat cell index of metric frustum points ``geom`` (``B x ... x 3``, x/y/z).

    Voxel coordinates are ``((geom - lower) / step)`` truncated toward zero, as
    upstream's ``.long()`` does. ``grid_xyz`` is ``(nx, ny, nz)``.
    """
    B = geom.shape[0]
    nx, ny, nz = (int(v) for v in grid_xyz)
    vox = ((geom - lower) / step).long()
    batch = torch.arange(B, device=geom.device).view((B, ) + (1, ) * (geom.dim() - 1))
    coords = torch.cat((vox, batch.expand(*geom.shape[:-1], 1)), dim=-1)
    return cell_index(coords, (B, nz, nx, ny))


def acc_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """Summation dtype: fp32, or fp64 when an input is fp64."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def _add_rows_(out: Tensor, index: Tensor, feats: Tensor) -> None:
    # scatter_add_ with a broadcast index beats index_add_ (H200: 0.43 vs 0.98 ms at
    # 1.8 M x 80; the CPU index_add_ loops over row slices).
    out.scatter_add_(0, index.unsqueeze(1).expand(-1, feats.shape[1]), feats)


def gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """``src[index]`` for a 2-D ``src`` (the backward of the scatter-add), bit-exact.

    A Triton row-copy kernel on CUDA when Triton is installed, else ``index_select``.
    """
    if bev_pool_triton.available(src) and index.numel() > 0 and src.shape[1] > 0:
        return bev_pool_triton.gather_rows(src, index)
    return src.index_select(0, index)


def _scatter_add_rows(feats: Tensor, index: Tensor, num_rows: int) -> Tensor:
    """``out[index[i]] += feats[i]`` in fp32/fp64, ``num_rows`` rows (CUDA: atomics)."""
    dtype = acc_dtype(feats.dtype)
    out = feats.new_zeros((num_rows, feats.shape[1]), dtype=dtype)
    if feats.dtype == dtype:
        _add_rows_(out, index, feats)
        return out
    for start in range(0, feats.shape[0], _LOW_PRECISION_CHUNK):
        stop = start + _LOW_PRECISION_CHUNK
        _add_rows_(out, index[start:stop], feats[start:stop].to(dtype))
    return out


def _segment_sum_rows(feats: Tensor, index: Tensor, num_rows: int) -> Tensor:
    """Same sums as :func:`_scatter_add_rows` without atomics, in a fixed order."""
    out_shape = (num_rows, feats.shape[1])
    dtype = acc_dtype(feats.dtype)
    if feats.shape[0] == 0:
        return feats.new_zeros(out_shape, dtype=dtype)
    order = torch.argsort(index, stable=True)
    sorted_index = index.index_select(0, order)
    bounds = torch.arange(num_rows + 1, device=index.device, dtype=sorted_index.dtype)
    offsets = torch.searchsorted(sorted_index, bounds)
    sorted_feats = gather_rows(feats, order).to(dtype)
    return torch.segment_reduce(
        sorted_feats, 'sum', offsets=offsets, axis=0, unsafe=True)


def pool_rows(feats: Tensor, index: Tensor, num_rows: int, method: str) -> Tensor:
    """Sums (fp32, fp64 for fp64 input) of ``feats`` rows grouped by ``index``."""
    _check_method(method)
    if method == 'sorted':
        return _segment_sum_rows(feats, index, num_rows)
    return _scatter_add_rows(feats, index, num_rows)


class _PoolFrustum(torch.autograd.Function):
    """Sum ``(P, C)`` features into cells; backward gathers the cell gradients."""

    @staticmethod
    def forward(ctx, feats: Tensor, index: Tensor, num_cells: int,
                method: str) -> Tensor:
        out = pool_rows(feats, index, num_cells + NUM_DUMP_ROWS, method)
        ctx.save_for_backward(index)
        ctx.num_cells = num_cells
        ctx.mark_non_differentiable(index)
        return out[:num_cells].to(feats.dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        index, = ctx.saved_tensors
        padded = torch.cat((grad_out, grad_out.new_zeros(NUM_DUMP_ROWS, grad_out.shape[1])))
        return gather_rows(padded, index), None, None, None


def pool_frustum(feats: Tensor, index: Tensor, num_cells: int,
                 deterministic: bool = False) -> Tensor:
    """Pool materialised frustum features by precomputed flat cell indices.

    Args:
        feats: ``(P, C)`` features (fp32, fp16 or bf16).
        index: ``(P,)`` int64 flat cell index (:func:`cell_index`).
        num_cells: number of real cells; indices ``>= num_cells`` are dropped.
        deterministic: sort-based segment sum instead of the scatter-add.

    Returns:
        ``(num_cells, C)`` sums in ``feats.dtype``.
    """
    if feats.dim() != 2 or index.shape != feats.shape[:1]:
        raise ValueError(f'pool_frustum needs feats (P, C) and index (P,), got '
                         f'{tuple(feats.shape)} and {tuple(index.shape)}.')
    method = 'sorted' if deterministic else 'index_add'
    return _PoolFrustum.apply(feats, index, num_cells, method)


def bev_pool(feats: Tensor, coords: Tensor, B: int, D: int, H: int, W: int,
             deterministic: bool = False) -> Tensor:
    """Drop-in for upstream's ``bev_pool`` (same arguments and output layout).

    Args:
        feats: ``(P, C)`` point features.
        coords: ``(P, 4)`` integer ``(x, y, z, batch)`` voxel coordinates; points
            outside ``[0, H) x [0, W) x [0, D) x [0, B)`` are ignored.
        B, D, H, W: batch size and number of cells along z, x, y.
        deterministic: use the sort-based path (no atomics).

    Returns:
        ``(B, C, D, H, W)`` pooled features in ``feats.dtype``.
    """
    if coords.dim() != 2 or coords.shape[1] != 4 or coords.shape[0] != feats.shape[0]:
        raise ValueError(f'bev_pool needs coords of shape (P, 4) matching feats '
                         f'(P, C); got {tuple(coords.shape)} and {tuple(feats.shape)}.')
    B, D, H, W = int(B), int(D), int(H), int(W)
    index = cell_index(coords, (B, D, H, W))
    out = pool_frustum(feats, index, B * D * H * W, deterministic)
    return out.view(B, D, H, W, -1).permute(0, 4, 1, 2, 3).contiguous()


# ----------------------------------------------------------------------------------
# Lean path: depth x context without the frustum tensor.
# ----------------------------------------------------------------------------------


def _depth_chunks(num_depth: int, chunk: int):
    for start in range(0, num_depth, chunk):
        yield start, min(start + chunk, num_depth)


def _lean_forward_torch(depth: Tensor, context: Tensor, index: Tensor, num_rows: int,
                        method: str, chunk: int) -> Tensor:
    """Cell sums of ``depth[m,d,h,w] * context[m,h,w,:]``, ``chunk`` bins at a time."""
    C = context.shape[-1]
    dtype = acc_dtype(depth.dtype, context.dtype)
    out = context.new_zeros((num_rows, C), dtype=dtype)
    ctx_acc = context.to(dtype).unsqueeze(1)
    for d0, d1 in _depth_chunks(depth.shape[1], chunk):
        frustum = depth[:, d0:d1].to(dtype).unsqueeze(-1) * ctx_acc
        out += pool_rows(frustum.reshape(-1, C), index[:, d0:d1].reshape(-1), num_rows,
                         method)
    return out


def _lean_backward_torch(grad_rows: Tensor, depth: Tensor, context: Tensor,
                         index: Tensor, chunk: int) -> Tuple[Tensor, Tensor]:
    """Gradients of the lean pooling w.r.t. depth and context, chunk by chunk."""
    M, D, H, W = depth.shape
    C = context.shape[-1]
    dtype = grad_rows.dtype
    ctx_acc = context.to(dtype)
    grad_depth = torch.empty(depth.shape, dtype=dtype, device=depth.device)
    grad_context = torch.zeros(ctx_acc.shape, dtype=dtype, device=depth.device)
    for d0, d1 in _depth_chunks(D, chunk):
        g = gather_rows(grad_rows, index[:, d0:d1].reshape(-1))
        g = g.view(M, d1 - d0, H, W, C)
        grad_depth[:, d0:d1] = (g * ctx_acc.unsqueeze(1)).sum(-1)
        grad_context += (g * depth[:, d0:d1].to(dtype).unsqueeze(-1)).sum(1)
    return grad_depth, grad_context


class _PoolDepthContext(torch.autograd.Function):
    """Lean pooling; saves depth, context and the index, never the frustum."""

    @staticmethod
    def forward(ctx, depth: Tensor, context: Tensor, index: Tensor, num_cells: int,
                method: str, chunk: int, use_triton: bool) -> Tensor:
        num_rows = num_cells + NUM_DUMP_ROWS
        if use_triton:
            out = bev_pool_triton.lean_forward(depth, context, index, num_rows)
        else:
            out = _lean_forward_torch(depth, context, index, num_rows, method, chunk)
        ctx.save_for_backward(depth, context, index)
        ctx.num_cells, ctx.chunk, ctx.use_triton = num_cells, chunk, use_triton
        ctx.mark_non_differentiable(index)
        out_dtype = torch.promote_types(depth.dtype, context.dtype)
        return out[:num_cells].to(out_dtype)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        depth, context, index = ctx.saved_tensors
        dtype = acc_dtype(depth.dtype, context.dtype)
        grad_rows = torch.cat((grad_out.to(dtype),
                               grad_out.new_zeros(NUM_DUMP_ROWS, grad_out.shape[1],
                                                  dtype=dtype)))
        if ctx.use_triton:
            grad_depth, grad_context = bev_pool_triton.lean_backward(
                grad_rows, depth, context, index)
        else:
            grad_depth, grad_context = _lean_backward_torch(grad_rows, depth, context,
                                                            index, ctx.chunk)
        return (grad_depth.to(depth.dtype), grad_context.to(context.dtype), None, None,
                None, None, None)


def pool_depth_context(depth: Tensor,
                       context: Tensor,
                       index: Tensor,
                       num_cells: int,
                       deterministic: bool = False,
                       chunk: int = 8,
                       use_triton: Optional[bool] = None) -> Tensor:
    """Pool ``depth x context`` by cell without materialising the frustum tensor.

    Equals ``pool_frustum((depth[..., None] * context[:, None]).reshape(-1, C),
    index.reshape(-1), num_cells)`` with a fraction of its memory: neither the forward
    nor the backward holds more than ``chunk`` depth bins of the product at a time
    (none at all with Triton).

    Args:
        depth: ``(M, D, H, W)`` depth distribution per camera image (M = B x N).
        context: ``(M, H, W, C)`` context features (channels last).
        index: ``(M, D, H, W)`` int64 flat cell index of every frustum point.
        num_cells: number of real cells; larger indices are dropped.
        deterministic: no atomics (PyTorch path with sorted segment sums).
        chunk: depth bins per step of the PyTorch path. Default 8.
        use_triton: Triton kernels (CUDA only); ``None`` picks them when available
            and not ``deterministic`` (their forward uses atomics).

    Returns:
        ``(num_cells, C)`` sums, dtype promoted from ``depth`` and ``context``.
    """
    M, D, H, W = depth.shape
    if context.shape[:3] != (M, H, W) or index.shape != depth.shape:
        raise ValueError(
            f'pool_depth_context needs depth (M, D, H, W), context (M, H, W, C) and '
            f'index (M, D, H, W); got {tuple(depth.shape)}, {tuple(context.shape)}, '
            f'{tuple(index.shape)}.')
    if chunk < 1:
        raise ValueError(f'chunk must be a positive number of depth bins, got {chunk}.')
    triton_ok = bev_pool_triton.available(depth)
    if use_triton and deterministic:
        raise ValueError('The Triton lean kernel sums with atomics; with '
                         'deterministic=True leave use_triton at None or False.')
    if use_triton is None:
        use_triton = triton_ok and not deterministic
    elif use_triton and not triton_ok:
        raise RuntimeError('use_triton=True needs CUDA tensors and an installed Triton '
                           '(pip install triton); pass use_triton=None to fall back.')
    method = 'sorted' if deterministic else 'index_add'
    return _PoolDepthContext.apply(depth, context.contiguous(), index.contiguous(),
                                   num_cells, method, chunk, bool(use_triton))
