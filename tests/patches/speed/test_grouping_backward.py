"""patches/speed/grouping_backward.py: the stacked grouping's gradient by one index_add_.

On the CPU the gradient is checked against autograd through point_ops_cpu's gather twin
(the grouping's exact gradient); on a GPU also against mmcv's own kernels."""
import pytest
import torch

import mmdet3d_scaling  # noqa: F401  (applies the patches)
from mmdet3d_scaling.patches.speed import grouping_backward as patch
from mmdet3d_scaling.patches import patching
from mmdet3d_scaling.patches.cpu.point_ops_cpu import stack_grouping_operation_cpu
from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus

CUDA = torch.cuda.is_available()


def _case(feature_counts, index_counts, channels=5, nsample=4, seed=0, invalid=False):
    """Stacked features and segment-local indices with many repeats (as ball query fills
    a ball's empty slots with its first neighbour); ``invalid``: some indices beyond
    their sample's segment."""
    gen = torch.Generator().manual_seed(seed)
    fcnt = torch.tensor(feature_counts, dtype=torch.int32)
    icnt = torch.tensor(index_counts, dtype=torch.int32)
    features = torch.randn(int(fcnt.sum()), channels, generator=gen)
    rows = []
    for n, m in zip(feature_counts, index_counts):
        high = max(n, 1) + (3 if invalid else 0)
        idx = torch.randint(0, high, (m, nsample), generator=gen)
        idx[:, nsample // 2:] = idx[:, :1]  # repeated first neighbour
        rows.append(idx if n else torch.zeros(m, nsample, dtype=torch.long))
    indices = torch.cat(rows).int() if rows else torch.zeros(0, nsample, dtype=torch.int32)
    return features, indices, fcnt, icnt


def _reference_grad(features, indices, fcnt, icnt, grad_out):
    leaf = features.clone().requires_grad_()
    stack_grouping_operation_cpu(leaf, indices, fcnt, icnt).backward(grad_out)
    return leaf.grad


CASES = [((10, 7), (6, 3)), ((1,), (9,)), ((50, 0, 20), (30, 4, 10)),
         ((8, 8, 8, 8), (0, 5, 0, 5)), ((300,), (128,))]


@pytest.mark.parametrize('feature_counts,index_counts', CASES)
@pytest.mark.parametrize('invalid', [False, True])
def test_same_gradient_as_autograd_through_the_gather(feature_counts, index_counts,
                                                      invalid):
    features, indices, fcnt, icnt = _case(feature_counts, index_counts, invalid=invalid)
    grad_out = torch.randn(indices.shape[0], features.shape[1], indices.shape[1],
                           generator=torch.Generator().manual_seed(1))
    ours = patch.stack_grouping_backward(grad_out, indices, fcnt, icnt, features.shape[0])
    theirs = _reference_grad(features, indices, fcnt, icnt, grad_out)
    assert ours.shape == theirs.shape == features.shape
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_repeated_indices_add_up():
    """Four slots of one row holding the same neighbour: its gradient is their sum."""
    features, indices, fcnt, icnt = _case((3,), (1,), channels=2, nsample=4)
    indices[:] = 2
    grad_out = torch.arange(8.).view(1, 2, 4)
    grad = patch.stack_grouping_backward(grad_out, indices, fcnt, icnt, 3)
    assert grad.tolist() == [[0., 0.], [0., 0.], [6., 22.]]


def test_gradient_dtype_follows_the_features():
    features, indices, fcnt, icnt = _case((6,), (3,))
    grad_out = torch.randn(3, 5, 4).half()
    grad = patch.stack_grouping_backward(grad_out, indices, fcnt, icnt, 6, torch.float32)
    assert grad.dtype == torch.float32


def test_no_host_read():
    features, indices, fcnt, icnt = _case((10, 7), (6, 3))
    grad_out = torch.randn(9, 5, 4)
    with HostReadCensus() as census:
        patch.stack_grouping_backward(grad_out, indices, fcnt, icnt, 17)
    assert census.total == 0, census.sites(10)


def test_bound_in_mmdet3d_before_the_cpu_twin():
    from mmdet3d.models.layers.pointnet_modules import stack_point_sa_module as sa
    bound = sa.grouping_operation
    assert bound._grouping_backward and bound._before._point_ops_cpu
    assert patching.apply(['grouping_backward']) == []
    assert sa.grouping_operation is bound  # applied once
    # CPU tensors still reach the CPU twin, with autograd through it
    features, indices, fcnt, icnt = _case((10, 7), (6, 3))
    leaf = features.clone().requires_grad_()
    out = bound(leaf, indices, fcnt, icnt)
    torch.testing.assert_close(out, stack_grouping_operation_cpu(features, indices, fcnt,
                                                                 icnt))
    out.sum().backward()
    assert leaf.grad is not None


# every index inside its sample's segment (mmcv's backward adds an index into an empty
# segment to the next sample's row; the forward reads it as 0 so ours gives it no gradient)
VALID_CASES = [c for c in CASES if 0 not in c[0]]


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason='mmcv stacked grouping runs on CUDA only')
@pytest.mark.parametrize('feature_counts,index_counts', VALID_CASES)
def test_cuda_matches_mmcv_forward_and_backward(feature_counts, index_counts):
    from mmcv.ops import grouping_operation as mmcv_grouping
    features, indices, fcnt, icnt = (t.cuda() for t in _case(feature_counts,
                                                             index_counts, channels=16))
    grad_out = torch.randn(indices.shape[0], 16, indices.shape[1], device='cuda')
    ours_in = features.clone().requires_grad_()
    theirs_in = features.clone().requires_grad_()
    ours = patch.StackGrouping.apply(ours_in, indices, fcnt, icnt)
    theirs = mmcv_grouping(theirs_in, indices, fcnt, icnt)
    assert torch.equal(ours, theirs)
    ours.backward(grad_out)
    theirs.backward(grad_out)
    torch.testing.assert_close(ours_in.grad, theirs_in.grad, rtol=1e-5, atol=1e-5)
