"""ops/sparse_conv.py: the batched gather-GEMM equals mmcv's per-offset sparse conv.

On the CPU (mmcv's op is CUDA only) against mmcv's loop written out in torch, on indice
pairs built here from the conv geometry, in float64 (values and gradients); on CUDA
against mmcv's own ``indice_conv_forward`` / ``indice_conv_backward`` on pairs from
mmcv's ``get_indice_pairs``, float32 (tolerance: the order of a float sum) and float16.
"""
import itertools
from typing import Tuple

import numpy as np
import pytest
import torch

from mmdet3d_scaling.ops import sparse_conv

from ..devices import needs_cuda

KERNEL = (3, 3, 3)


def _voxels(n: int, shape: Tuple[int, int, int], batch: int, seed: int) -> torch.Tensor:
    """``n`` distinct (batch, z, y, x) int32 coordinates."""
    rng = np.random.default_rng(seed)
    cells = batch * int(np.prod(shape))
    flat = rng.choice(cells, size=n, replace=False)
    b, rest = np.divmod(flat, int(np.prod(shape)))
    z, rest = np.divmod(rest, shape[1] * shape[2])
    y, x = np.divmod(rest, shape[2])
    return torch.from_numpy(np.stack([b, z, y, x], 1).astype(np.int32))


def _pairs(coors: torch.Tensor, shape, stride: int, padding: int, subm: bool):
    """mmcv's (out coords, indice_pairs [K, 2, N], counts [K]) from the geometry:
    input p feeds output q through offset k when p = q * stride - padding + k."""
    table = {tuple(c): i for i, c in enumerate(coors.tolist())}
    if subm:
        outs = [tuple(c) for c in coors.tolist()]
    else:
        out_shape = [(s + 2 * padding - 3) // stride + 1 for s in shape]
        found = set()
        for b, *p in coors.tolist():
            for k in itertools.product(range(3), repeat=3):
                q = [(pi + padding - ki) for pi, ki in zip(p, k)]
                if all(v % stride == 0 and 0 <= v // stride < o
                       for v, o in zip(q, out_shape)):
                    found.add((b, *[v // stride for v in q]))
        outs = sorted(found)
    out_index = {c: i for i, c in enumerate(outs)}
    pairs = torch.full((27, 2, len(coors)), -1, dtype=torch.int32)
    counts = torch.zeros(27, dtype=torch.int32)
    for k, off in enumerate(itertools.product(range(3), repeat=3)):
        for (b, *q), o in out_index.items():
            p = tuple([b] + [qi * stride - padding + ki for qi, ki in zip(q, off)])
            i = table.get(p)
            if i is not None:
                pairs[k, :, counts[k]] = torch.tensor([i, o])
                counts[k] += 1
    return torch.tensor(outs, dtype=torch.int32), pairs, counts


CASES = {  # name: (stride, padding, subm, inverse)
    'subm': (1, 1, True, False),
    'strided': (2, 1, False, False),
    'inverse': (2, 1, False, True),
}


@pytest.mark.parametrize('case', list(CASES))
def test_equals_the_per_offset_loop_on_cpu(case):
    stride, padding, subm, inverse = CASES[case]
    shape = (6, 7, 8)
    coors = _voxels(90, shape, batch=2, seed=0)
    outs, pairs, counts = _pairs(coors, shape, stride, padding, subm)
    n_in, n_out = len(coors), len(outs)
    if inverse:  # the inverse conv reads the strided conv's output rows
        n_in, n_out = n_out, n_in
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(n_in, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(*KERNEL, 5, 4, dtype=torch.float64, generator=gen,
                    requires_grad=True)
    ours = sparse_conv.BatchedIndiceConv.apply(x, w, pairs, counts, n_out, inverse, subm)
    ref = sparse_conv.reference_conv(x, w, pairs, counts, n_out, inverse, subm)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn(n_out, 4, dtype=torch.float64, generator=gen)
    ours_g = torch.autograd.grad(ours, (x, w), grad)
    ref_g = torch.autograd.grad(ref, (x, w), grad)
    for a, b in zip(ours_g, ref_g):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_chunked_rows_give_the_same_result(monkeypatch):
    coors = _voxels(60, (5, 5, 5), batch=1, seed=2)
    _, pairs, counts = _pairs(coors, (5, 5, 5), 1, 1, True)
    x = torch.randn(60, 3, dtype=torch.float64)
    w = torch.randn(*KERNEL, 3, 2, dtype=torch.float64)
    whole = sparse_conv.BatchedIndiceConv.apply(x, w, pairs, counts, 60, False, True)
    monkeypatch.setattr(sparse_conv, 'MAX_CHUNK_NUMBERS', 7 * 27 * 3)  # 7 rows a chunk
    chunked = sparse_conv.BatchedIndiceConv.apply(x, w, pairs, counts, 60, False, True)
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)


def test_mixed_dtypes_are_named():
    x = torch.randn(4, 2, dtype=torch.bfloat16)
    w = torch.randn(*KERNEL, 2, 2)
    pairs = torch.zeros(27, 2, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match='bfloat16.*float32'):
        sparse_conv.indice_subm_conv(x, w, pairs, torch.zeros(27, dtype=torch.int32), 4)


# ------------------------------------------------------------------------ CUDA: mmcv's op


def _mmcv_pairs(coors: torch.Tensor, shape, stride: int, subm: bool):
    from mmcv.ops import sparse_ops
    return sparse_ops.get_indice_pairs(coors, 2, list(shape), KERNEL, [stride] * 3,
                                       [1] * 3, [1] * 3, [0] * 3, subm, False)


@needs_cuda
@pytest.mark.cuda
@pytest.mark.parametrize('case', list(CASES))
@pytest.mark.parametrize('dtype', [torch.float32, torch.float16])
def test_equals_mmcv_on_cuda(case, dtype):
    from mmcv.ops import sparse_ops
    stride, _, subm, inverse = CASES[case]
    shape = (40, 60, 60)
    coors = _voxels(20000, shape, batch=2, seed=3).cuda()
    outids, pairs, counts = _mmcv_pairs(coors, shape, stride, subm)
    n_in, n_out = len(coors), len(outids)
    if inverse:
        n_in, n_out = n_out, n_in
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.randn(n_in, 32, device='cuda', dtype=dtype)
    w = torch.randn(*KERNEL, 32, 16, device='cuda', dtype=dtype) * 0.1
    grad = torch.randn(n_out, 16, device='cuda', dtype=dtype)
    ref = sparse_ops.indice_conv(x, w, pairs, counts, n_out, inverse, subm)
    ref_gx, ref_gw = sparse_ops.indice_conv_backward(x, w, grad, pairs, counts, inverse,
                                                     subm)
    xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
    ours = sparse_conv.BatchedIndiceConv.apply(xs, ws, pairs, counts, n_out, inverse,
                                               subm)
    gx, gw = torch.autograd.grad(ours, (xs, ws), grad)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2,
                                                                         atol=5e-2)
    torch.testing.assert_close(ours, ref, **tol)
    torch.testing.assert_close(gx, ref_gx, **tol)
    scale = ref_gw.abs().max().item()  # a weight grad sums thousands of rows
    torch.testing.assert_close(gw / scale, ref_gw / scale, **tol)


@needs_cuda
@pytest.mark.cuda
def test_bit_identical_across_runs_on_cuda():
    """No atomics: two runs give the same bits (mmcv's scatter per offset does too)."""
    shape = (40, 60, 60)
    coors = _voxels(20000, shape, batch=2, seed=4).cuda()
    _, pairs, counts = _mmcv_pairs(coors, shape, 1, True)
    x = torch.randn(len(coors), 16, device='cuda', requires_grad=True)
    w = torch.randn(*KERNEL, 16, 16, device='cuda', requires_grad=True)
    runs = []
    for _ in range(2):
        out = sparse_conv.indice_subm_conv(x, w, pairs, counts, len(coors))
        runs.append((out, *torch.autograd.grad(out.square().sum(), (x, w))))
    for a, b in zip(*runs):
        assert torch.equal(a, b)
