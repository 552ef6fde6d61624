import pytest
import torch

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.patches.cpu import spconv_cpu
from mmdet3d_scaling.patches import patching

spconv = pytest.importorskip('spconv.pytorch')


@pytest.mark.skipif(torch.cuda.is_available(), reason='the patch is for CPU-only torch')
def test_sparse_conv_backward_on_cpu():
    import spconv.pytorch.ops as ops
    assert ops.get_current_stream is spconv_cpu.cpu_current_stream
    torch.manual_seed(0)
    coords = torch.unique(torch.randint(0, 8, (40, 3)), dim=0)
    indices = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32),
                         coords.int()], 1)
    feats = torch.randn(len(coords), 3, requires_grad=True)
    x = spconv.SparseConvTensor(feats, indices, [8, 8, 8], batch_size=1)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(3, 4, 3, indice_key='s1'),
        spconv.SparseConv3d(4, 4, 3, stride=2, padding=1))
    out = net(x)
    out.features.sum().backward()
    assert feats.grad is not None and feats.grad.abs().sum() > 0
    assert all(p.grad is not None for p in net.parameters())


def test_applied_on_import_without_cuda_only():
    assert ('spconv_cpu' in patching.applied()) == (not torch.cuda.is_available())
    assert patching.apply(['spconv_cpu']) == []


def test_sparse_conv_under_cpu_bf16_autocast():
    # What AMP degrades to without a GPU: bf16 autocast, bf16 features from dense layers.
    torch.manual_seed(0)
    coords = torch.unique(torch.randint(0, 8, (40, 3)), dim=0)
    indices = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords.int()], 1)
    dense = torch.nn.Linear(3, 3)
    net = spconv.SparseSequential(spconv.SubMConv3d(3, 4, 3, indice_key='s1'))
    with torch.autocast('cpu', dtype=torch.bfloat16):
        feats = dense(torch.randn(len(coords), 3))
        assert feats.dtype == torch.bfloat16
        out = net(spconv.SparseConvTensor(feats, indices, [8, 8, 8], batch_size=1))
    assert out.features.dtype == torch.float32
    out.features.sum().backward()
    assert dense.weight.grad is not None and net[0].weight.grad is not None
