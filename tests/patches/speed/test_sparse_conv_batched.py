"""patches/speed/sparse_conv_batched.py: mmcv's sparse convs give mmcv's results with it.

mmcv's own modules (``SubMConv3d``, ``SparseConv3d``, ``SparseInverseConv3d``, as
mmdet3d's encoders stack them) run with the patch and, for the reference, with it
reverted: same outputs and gradients (float32 tolerance of a reordered sum), far fewer
CUDA kernels. The patch is opt-in (outside the ``speed`` set the package's conftest
applies): applied here for the module.
"""
import numpy as np
import pytest
import torch

import mmdet3d_scaling  # noqa: F401
import mmcv.ops.sparse_functional as Fsp
from mmdet3d_scaling.patches import patching

from ...devices import needs_cuda
from ..reverting import reverted


@pytest.fixture(autouse=True, scope='module')
def batched_patch():
    applied = patching.apply(['sparse_conv_batched'])
    yield
    patching.revert(applied)


def test_the_speed_set_leaves_it_out():
    assert 'sparse_conv_batched' not in patching.resolve(['speed'])
    assert patching.resolve(['sparse_conv_batched']) == ['sparse_conv_batched']


def test_the_patch_rebinds_mmcvs_three_functions():
    assert 'sparse_conv_batched' in patching.applied()
    for name in ('indice_conv', 'indice_subm_conv', 'indice_inverse_conv'):
        assert getattr(Fsp, name).original is patching.original('sparse_conv_batched', name)


def test_cpu_tensors_go_to_mmcv_unchanged():
    """mmcv's op has no CPU kernel; the patch hands CPU calls to it as they were."""
    x, w = torch.randn(4, 2), torch.randn(3, 3, 3, 2, 2)
    pairs, counts = torch.zeros(27, 2, 4, dtype=torch.int32), torch.ones(27, dtype=torch.int32)
    errors = []
    for fn in (Fsp.indice_subm_conv, Fsp.indice_subm_conv.original):
        with pytest.raises(Exception) as err:
            fn(x, w, pairs, counts, 4)
        errors.append((type(err.value), str(err.value)))
    assert errors[0] == errors[1]


def _encoder():
    """A SECOND-style stack of mmcv's convs: submanifold, strided, inverse."""
    from mmcv.ops import (SparseConv3d, SparseInverseConv3d, SparseSequential,
                          SubMConv3d)
    torch.manual_seed(0)
    return SparseSequential(
        SubMConv3d(4, 16, 3, padding=1, bias=False, indice_key='subm1'),
        torch.nn.ReLU(),
        SubMConv3d(16, 16, 3, padding=1, bias=False, indice_key='subm1'),
        SparseConv3d(16, 32, 3, stride=2, padding=1, bias=False, indice_key='spconv2'),
        torch.nn.ReLU(),
        SubMConv3d(32, 32, 3, padding=1, bias=True, indice_key='subm2'),
        SparseInverseConv3d(32, 16, 3, bias=False, indice_key='spconv2'),
    ).cuda()


def _voxels(n: int = 30000, shape=(41, 200, 176), batch: int = 2):
    rng = np.random.default_rng(0)
    flat = rng.choice(batch * int(np.prod(shape)), size=n, replace=False)
    coords = np.stack(np.unravel_index(flat, (batch, *shape)), 1).astype(np.int32)
    return torch.from_numpy(coords).cuda(), torch.randn(n, 4, device='cuda'), list(shape)


def _run(model, coords, feats, shape):
    from mmcv.ops import SparseConvTensor
    feats = feats.clone().requires_grad_()
    out = model(SparseConvTensor(feats, coords, shape, 2)).features
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out.detach(), feats.grad, grads


def _kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type.name == 'CUDA')


@needs_cuda
@pytest.mark.cuda
def test_mmcv_encoder_equals_upstream_on_cuda():
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _encoder()
    coords, feats, shape = _voxels()
    ours = _run(model, coords, feats, shape)
    with reverted(['sparse_conv_batched']):
        ref = _run(model, coords, feats, shape)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-4, atol=1e-6)
    for a, b in zip(ours[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@needs_cuda
@pytest.mark.cuda
def test_fewer_kernels_on_cuda():
    model = _encoder()
    coords, feats, shape = _voxels()
    step = lambda: _run(model, coords, feats, shape)  # noqa: E731
    step()
    ours = _kernels(step)
    with reverted(['sparse_conv_batched']):
        step()
        upstream = _kernels(step)
    print(f'CUDA kernels a fwd+bwd: {upstream} upstream, {ours} batched')
    assert ours < upstream / 2
