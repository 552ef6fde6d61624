"""Triton kernels for the lean BEV pooling (depth x context, no frustum tensor).

Optional: Triton is imported lazily-guarded; without it (CPU installs) ``available``
is False and :mod:`.bev_pool` uses its PyTorch fallback. One program handles
``BLOCK_P`` camera pixels and all channels, and walks the depth bins:

* forward: ``out[index[m,d,h,w], :] += depth[m,d,h,w] * context[m,h,w,:]`` (fp32
  atomics);
* backward, no atomics: ``grad_depth[m,d,h,w] = <grad[index], context[m,h,w]>`` and
  ``grad_context[m,h,w] = sum_d depth[m,d,h,w] * grad[index[m,d,h,w]]``.
"""
from typing import Tuple

import torch
from torch import Tensor

try:  # Triton ships with CUDA builds of PyTorch; CPU-only installs lack it.
    import triton
    import triton.language as tl
    HAS_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    triton = tl = None
    HAS_TRITON = False

BLOCK_P = 32


def available(tensor: Tensor) -> bool:
    """Whether the Triton kernels can run on ``tensor``'s device."""
    return HAS_TRITON and tensor.is_cuda


if HAS_TRITON:

    @triton.jit
    def _lean_forward_kernel(depth_ptr, context_ptr, index_ptr, out_ptr, P, D, HW, C,
                             BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        p = (tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
        c = tl.arange(0, BLOCK_C)
        p_mask = p < P
        mask = p_mask[:, None] & (c < C)[None, :]
        ctx = tl.load(context_ptr + p[:, None] * C + c[None, :], mask=mask, other=0.0)
        ctx = ctx.to(tl.float32)
        m = p // HW
        base = m * D * HW + (p - m * HW)
        for d in range(0, D):
            off = base + d * HW
            dep = tl.load(depth_ptr + off, mask=p_mask, other=0.0).to(tl.float32)
            idx = tl.load(index_ptr + off, mask=p_mask, other=0)
            tl.atomic_add(out_ptr + idx[:, None] * C + c[None, :], dep[:, None] * ctx,
                          mask=mask)

    @triton.jit
    def _lean_backward_kernel(grad_ptr, depth_ptr, context_ptr, index_ptr,
                              grad_depth_ptr, grad_context_ptr, P, D, HW, C,
                              BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        p = (tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)).to(tl.int64)
        c = tl.arange(0, BLOCK_C)
        p_mask = p < P
        mask = p_mask[:, None] & (c < C)[None, :]
        ctx = tl.load(context_ptr + p[:, None] * C + c[None, :], mask=mask, other=0.0)
        ctx = ctx.to(tl.float32)
        acc = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        m = p // HW
        base = m * D * HW + (p - m * HW)
        for d in range(0, D):
            off = base + d * HW
            dep = tl.load(depth_ptr + off, mask=p_mask, other=0.0).to(tl.float32)
            idx = tl.load(index_ptr + off, mask=p_mask, other=0)
            g = tl.load(grad_ptr + idx[:, None] * C + c[None, :], mask=mask, other=0.0)
            tl.store(grad_depth_ptr + off, tl.sum(g * ctx, axis=1), mask=p_mask)
            acc += dep[:, None] * g
        tl.store(grad_context_ptr + p[:, None] * C + c[None, :], acc, mask=mask)


    @triton.jit
    def _gather_rows_kernel(src_ptr, index_ptr, out_ptr, R, C, BLOCK_R: tl.constexpr,
                            BLOCK_C: tl.constexpr):
        r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
        c = tl.arange(0, BLOCK_C)
        r_mask = r < R
        mask = r_mask[:, None] & (c < C)[None, :]
        idx = tl.load(index_ptr + r, mask=r_mask, other=0)
        rows = tl.load(src_ptr + idx[:, None] * C + c[None, :], mask=mask)
        tl.store(out_ptr + r[:, None] * C + c[None, :], rows, mask=mask)


def gather_rows(src: Tensor, index: Tensor) -> Tensor:
    """``src[index]`` for a contiguous 2-D CUDA ``src`` (torch's index_select is
    index-bound here: 1.09 ms for 1.8 M rows of 80 floats on an H200)."""
    R, C = index.shape[0], src.shape[1]
    out = torch.empty((R, C), dtype=src.dtype, device=src.device)
    block_c = triton.next_power_of_2(max(C, 1))
    block_r = max(1, min(64, 4096 // block_c))
    _gather_rows_kernel[(triton.cdiv(R, block_r), )](
        src.contiguous(), index.contiguous(), out, R, C, BLOCK_R=block_r,
        BLOCK_C=block_c)
    return out


def _launch_args(depth: Tensor, context: Tensor):
    M, D, H, W = depth.shape
    P, C = M * H * W, context.shape[-1]
    grid = (triton.cdiv(P, BLOCK_P), )
    return grid, (P, D, H * W, C), dict(BLOCK_P=BLOCK_P,
                                        BLOCK_C=triton.next_power_of_2(C))


def lean_forward(depth: Tensor, context: Tensor, index: Tensor, num_rows: int) -> Tensor:
    """fp32 ``(num_rows, C)`` cell sums of ``depth x context``."""
    out = torch.zeros((num_rows, context.shape[-1]), dtype=torch.float32,
                      device=depth.device)
    grid, sizes, meta = _launch_args(depth, context)
    _lean_forward_kernel[grid](depth.contiguous(), context.contiguous(),
                               index.contiguous(), out, *sizes, **meta)
    return out


def lean_backward(grad_rows: Tensor, depth: Tensor, context: Tensor,
                  index: Tensor) -> Tuple[Tensor, Tensor]:
    """fp32 gradients w.r.t. ``depth`` and ``context`` from fp32 ``grad_rows``."""
    grad_depth = torch.empty(depth.shape, dtype=torch.float32, device=depth.device)
    grad_context = torch.empty(context.shape, dtype=torch.float32, device=depth.device)
    grid, sizes, meta = _launch_args(depth, context)
    _lean_backward_kernel[grid](grad_rows.contiguous(), depth.contiguous(),
                                context.contiguous(), index.contiguous(), grad_depth,
                                grad_context, *sizes, **meta)
    return grad_depth, grad_context
