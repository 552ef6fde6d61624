"""bev_pool in PyTorch against a naive Python loop: forward, backward, every path.

Paths: the scatter-add default, the sorted (deterministic) path, and the lean
depth x context pooling (PyTorch fallback here; the Triton kernels run only on CUDA,
where ``test_triton_matches_fallback_on_cuda`` covers them).
"""
import importlib

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

# The module (the package's ``bev_pool`` attribute is the function, as upstream's).
bp = importlib.import_module('mmdet3d_scaling.models.bevfusion.ops.bev_pool')

PATHS = [False, True]  # deterministic flag


def naive_bev_pool(feats, coords, B, D, H, W):
    """The definition, one point at a time, in float64."""
    out = torch.zeros(B, feats.shape[1], D, H, W, dtype=torch.float64)
    for f, (x, y, z, b) in zip(feats.double(), coords.tolist()):
        if 0 <= x < H and 0 <= y < W and 0 <= z < D and 0 <= b < B:
            out[b, :, z, x, y] += f
    return out


def random_points(n, grid, C=5, margin=2, seed=0, dtype=torch.float32):
    B, D, H, W = grid
    g = torch.Generator().manual_seed(seed)
    coords = torch.stack([
        torch.randint(-margin, H + margin, (n, ), generator=g),
        torch.randint(-margin, W + margin, (n, ), generator=g),
        torch.randint(-min(margin, 1), D + min(margin, 1), (n, ), generator=g),
        torch.randint(0, B, (n, ), generator=g),
    ], 1)
    feats = torch.randn(n, C, generator=g).to(dtype)
    return feats, coords


@pytest.mark.parametrize('deterministic', PATHS)
def test_forward_matches_naive_loop_with_points_outside(deterministic):
    grid = (2, 2, 7, 6)
    feats, coords = random_points(400, grid)
    outside = ((coords[:, 0] < 0) | (coords[:, 0] >= 7) | (coords[:, 1] < 0)
               | (coords[:, 1] >= 6) | (coords[:, 2] < 0) | (coords[:, 2] >= 2))
    assert outside.sum() > 50  # the test exercises dropping
    out = bp.bev_pool(feats, coords, *grid, deterministic=deterministic)
    assert out.shape == (2, 5, 2, 7, 6) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), naive_bev_pool(feats, coords, *grid),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('deterministic', PATHS)
def test_backward_is_gather_of_cell_gradient(deterministic):
    grid = (2, 2, 5, 4)
    feats, coords = random_points(200, grid, seed=1)
    feats.requires_grad_()
    grad = torch.randn(2, 5, 2, 5, 4)
    bp.bev_pool(feats, coords, *grid, deterministic=deterministic).backward(grad)
    expected = torch.zeros_like(feats)
    for i, (x, y, z, b) in enumerate(coords.tolist()):
        if 0 <= x < 5 and 0 <= y < 4 and 0 <= z < 2:
            expected[i] = grad[b, :, z, x, y]
    torch.testing.assert_close(feats.grad, expected)


@pytest.mark.parametrize('deterministic', PATHS)
def test_gradcheck_float64(deterministic):
    grid = (1, 2, 3, 3)
    feats, coords = random_points(40, grid, C=3, margin=1, seed=2, dtype=torch.float64)
    feats.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda f: bp.bev_pool(f, coords, *grid, deterministic=deterministic), (feats, ))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('deterministic', PATHS)
def test_low_precision_inputs_sum_in_fp32(dtype, deterministic):
    grid = (1, 1, 4, 4)
    # Many points per cell: a bf16/fp16 running sum would drift visibly.
    feats, coords = random_points(3000, grid, C=4, margin=0, seed=3, dtype=dtype)
    feats.requires_grad_()
    out = bp.bev_pool(feats, coords, *grid, deterministic=deterministic)
    assert out.dtype == dtype
    ref = naive_bev_pool(feats.detach(), coords, *grid)
    # Only the final rounding to dtype: relative error within one ulp-ish of dtype.
    eps = torch.finfo(dtype).eps
    assert ((out.double() - ref).abs() <= ref.abs() * eps + 1e-3).all()
    out.float().sum().backward()
    assert feats.grad.dtype == dtype and torch.equal(feats.grad, torch.ones_like(feats))


@pytest.mark.parametrize('deterministic', PATHS)
def test_empty_input(deterministic):
    feats = torch.zeros(0, 3, requires_grad=True)
    coords = torch.zeros(0, 4, dtype=torch.long)
    out = bp.bev_pool(feats, coords, 2, 1, 3, 3, deterministic=deterministic)
    assert out.shape == (2, 3, 1, 3, 3) and not out.any()
    out.sum().backward()
    assert feats.grad.shape == (0, 3)


def test_all_points_outside_give_zeros_and_zero_grad():
    feats = torch.randn(10, 2, requires_grad=True)
    coords = torch.tensor([[-1, 0, 0, 0], [0, 9, 0, 0], [0, 0, 3, 0], [0, 0, 0, 5]] * 2
                          + [[-7, -7, -7, -7]] * 2)
    for deterministic in PATHS:
        feats.grad = None
        out = bp.bev_pool(feats, coords, 1, 1, 2, 2, deterministic=deterministic)
        assert not out.any()
        out.sum().backward()
        assert not feats.grad.any()


def test_deterministic_path_is_bitwise_reproducible():
    feats, coords = random_points(5000, (1, 1, 8, 8), C=16, seed=4)
    a = bp.bev_pool(feats, coords, 1, 1, 8, 8, deterministic=True)
    b = bp.bev_pool(feats, coords, 1, 1, 8, 8, deterministic=True)
    assert torch.equal(a, b)


def test_cell_index_layout_and_dump_rows():
    coords = torch.tensor([[1, 2, 0, 1], [0, 0, 1, 0], [5, 0, 0, 0], [0, 0, 0, -1]])
    index = bp.cell_index(coords, (2, 2, 3, 4))  # B, D, H(x), W(y)
    num_cells = 2 * 2 * 3 * 4
    assert index[0] == ((1 * 2 + 0) * 3 + 1) * 4 + 2
    assert index[1] == ((0 * 2 + 1) * 3 + 0) * 4 + 0
    assert (index[2:] >= num_cells).all()
    assert (index[2:] < num_cells + bp.NUM_DUMP_ROWS).all()


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match='coords of shape'):
        bp.bev_pool(torch.zeros(3, 2), torch.zeros(3, 3, dtype=torch.long), 1, 1, 2, 2)
    with pytest.raises(ValueError, match='feats'):
        bp.pool_frustum(torch.zeros(3, 2), torch.zeros(4, dtype=torch.long), 4)
    with pytest.raises(ValueError, match='one of'):
        bp.pool_rows(torch.zeros(3, 2), torch.zeros(3, dtype=torch.long), 4, 'atomic')


# ----------------------------------------------------------------------- lean path


def lean_inputs(M=3, D=9, H=4, W=5, C=6, cells=(1, 1, 6, 6), seed=5,
                dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    depth = torch.rand(M, D, H, W, generator=g).softmax(1).to(dtype).requires_grad_()
    context = torch.randn(M, H, W, C, generator=g).to(dtype).requires_grad_()
    B, Dz, X, Y = cells
    coords = torch.stack([
        torch.randint(-1, X + 1, (M, D, H, W), generator=g),
        torch.randint(-1, Y + 1, (M, D, H, W), generator=g),
        torch.zeros(M, D, H, W, dtype=torch.long),
        torch.randint(0, B, (M, D, H, W), generator=g),
    ], -1)
    return depth, context, bp.cell_index(coords, cells), B * Dz * X * Y


def materialised(depth, context, index, num_cells):
    frustum = (depth.unsqueeze(-1) * context.unsqueeze(1)).reshape(-1, context.shape[-1])
    return bp.pool_frustum(frustum, index.reshape(-1), num_cells)


@pytest.mark.parametrize('chunk', [1, 4, 100])
@pytest.mark.parametrize('deterministic', PATHS)
def test_lean_path_equals_materialised_forward_and_backward(chunk, deterministic):
    depth, context, index, n = lean_inputs()
    grad = torch.randn(n, context.shape[-1], dtype=torch.float64)
    ref = materialised(depth, context, index, n)
    ref_grads = torch.autograd.grad((ref * grad).sum(), (depth, context))
    out = bp.pool_depth_context(depth, context, index, n, deterministic=deterministic,
                                chunk=chunk)
    grads = torch.autograd.grad((out * grad).sum(), (depth, context))
    torch.testing.assert_close(out, ref)
    for a, b in zip(grads, ref_grads):
        torch.testing.assert_close(a, b)


def test_lean_path_gradcheck():
    depth, context, index, n = lean_inputs(M=2, D=3, H=2, W=2, C=2, cells=(1, 1, 3, 3))
    assert torch.autograd.gradcheck(
        lambda d, c: bp.pool_depth_context(d, c, index, n, chunk=2), (depth, context))


def test_lean_path_mixed_precision_promotes():
    depth, context, index, n = lean_inputs(dtype=torch.float32)
    out = bp.pool_depth_context(depth, context.detach().bfloat16().requires_grad_(),
                                index, n)
    assert out.dtype == torch.float32  # as depth * context would be


def largest_allocation(fn) -> int:
    """Bytes of the largest single CPU allocation of any op in fn()'s forward+backward."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn().sum().backward()
    return max(e.self_cpu_memory_usage for e in prof.events())


def test_lean_path_never_materialises_the_frustum_tensor():
    """No op of the lean path allocates more than its chunk of depth bins; the
    materialised reference allocates the whole M x D x H x W x C tensor."""
    depth, context, index, n = lean_inputs(M=2, D=20, H=6, W=8, C=16,
                                           dtype=torch.float32)
    frustum_bytes = depth.numel() * context.shape[-1] * 4
    lean = largest_allocation(
        lambda: bp.pool_depth_context(depth, context, index, n, chunk=4))
    assert lean <= frustum_bytes * 4 / 20
    full = largest_allocation(lambda: materialised(depth, context, index, n))
    assert full >= frustum_bytes


def test_lean_path_argument_errors():
    depth, context, index, n = lean_inputs()
    with pytest.raises(ValueError, match='context'):
        bp.pool_depth_context(depth, context[:, :2], index, n)
    with pytest.raises(ValueError, match='chunk'):
        bp.pool_depth_context(depth, context, index, n, chunk=0)
    with pytest.raises(ValueError, match='atomics'):
        bp.pool_depth_context(depth, context, index, n, deterministic=True,
                              use_triton=True)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match='Triton'):
            bp.pool_depth_context(depth, context, index, n, use_triton=True)


@pytest.mark.cuda
@pytest.mark.skipif(not (torch.cuda.is_available() and bp.bev_pool_triton.HAS_TRITON),
                    reason='needs CUDA and Triton')
def test_triton_matches_fallback_on_cuda():
    depth, context, index, n = lean_inputs(M=4, D=30, H=8, W=16, C=80,
                                           cells=(2, 1, 20, 20), dtype=torch.float32)
    depth, context, index = (t.detach().cuda() for t in (depth, context, index))
    grad = torch.randn(n, 80, device='cuda')
    results = []
    for use_triton in (False, True):
        d, c = depth.clone().requires_grad_(), context.clone().requires_grad_()
        out = bp.pool_depth_context(d, c, index, n, use_triton=use_triton)
        out.backward(grad)
        results.append((out, d.grad, c.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    rows = torch.randn(n + bp.NUM_DUMP_ROWS, 80, device='cuda')
    assert torch.equal(bp.gather_rows(rows, index.view(-1)),
                       rows.index_select(0, index.view(-1)))
