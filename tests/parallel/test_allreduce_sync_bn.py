"""AllReduceSyncBatchNorm over 2 gloo processes equals one BatchNorm over the whole batch
(outputs, input and parameter gradients, running statistics), with uneven and empty
per-rank batches; and the 'allreduce' conversion reaches every BatchNorm."""
import pytest
import torch
import torch.distributed as dist
from torch import nn

from mmdet3d_scaling.parallel.allreduce_sync_bn import AllReduceSyncBatchNorm
from mmdet3d_scaling.parallel.sync_bn import convert_sync_bn, resolve_implementation
from tests.parallel.dist_parts import spawn_checks

TOL = 1e-5
# (full input shape, rows of rank 0; rank 1 gets the rest)
CASES = {'bn2d_uneven': ((6, 3, 4, 5), 4), 'bn1d_rank1_empty': ((5, 3), 5),
         'bn1d_3d_input': ((4, 3, 7), 1)}


def _case(shape, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen, dtype=torch.float64).float() * 3 + 1
    w = torch.randn(shape, generator=gen)
    return x, w


def _bn_for(shape):
    bn = nn.BatchNorm2d(shape[1]) if len(shape) == 4 else nn.BatchNorm1d(shape[1])
    with torch.no_grad():
        bn.weight.copy_(torch.linspace(0.5, 1.5, shape[1]))
        bn.bias.copy_(torch.linspace(-1, 1, shape[1]))
    return bn


def check_matches_full_batch(rank: int, world_size: int, out_dir: str) -> dict:
    dist.init_process_group('gloo')
    diffs = {}
    for name, (shape, rows0) in CASES.items():
        x, w = _case(shape)
        ref = _bn_for(shape).train()
        ref_in = x.clone().requires_grad_(True)
        (ref(ref_in) * w).sum().backward()
        ref_out = ref(x)  # a second forward must not matter for grads; used for outputs
        sync = convert_sync_bn(nn.Sequential(_bn_for(shape)), 'allreduce')[0].train()
        assert isinstance(sync, AllReduceSyncBatchNorm)
        part = slice(0, rows0) if rank == 0 else slice(rows0, shape[0])
        mine = x[part].clone().requires_grad_(True)
        out = sync(mine)
        (out * w[part]).sum().backward()
        grads = torch.cat([sync.weight.grad, sync.bias.grad])
        dist.all_reduce(grads)  # DDP would average; the sum is the full-batch gradient
        # ref ran two forwards: its running stats moved twice; compare after one
        one = _bn_for(shape).train()
        one(x)
        diffs[name] = max(
            (out - ref_out[part]).abs().max().item() if out.numel() else 0.0,
            (mine.grad - ref_in.grad[part]).abs().max().item() if out.numel() else 0.0,
            (grads - torch.cat([ref.weight.grad, ref.bias.grad])).abs().max().item(),
            (sync.running_mean - one.running_mean).abs().max().item(),
            (sync.running_var - one.running_var).abs().max().item())
    diffs['saved_bytes_over_input'] = _saved_bytes_over_input()
    diffs['sparse'] = _sparse_matches_dense(rank)
    dist.destroy_process_group()
    return diffs


def _saved_bytes_over_input() -> float:
    """Bytes autograd keeps for the backward pass beyond the input itself."""
    x = torch.randn(64, 8, 32, 32, requires_grad=True)
    sync = convert_sync_bn(nn.Sequential(nn.BatchNorm2d(8)), 'allreduce')[0].train()
    saved = {}

    def pack(t):
        saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        sync(x).sum().backward()
    return float(sum(saved.values()) - x.numel() * x.element_size())


def _sparse_matches_dense(rank: int) -> float:
    """A spconv SparseBatchNorm converted with 'allreduce' takes a SparseConvTensor and
    normalises its features as the dense layer normalises the same rows."""
    import spconv.pytorch as spconv
    from spconv.pytorch.modules import SparseBatchNorm
    feats, _ = _case((7 + 3 * rank, 3), seed=rank)
    indices = torch.stack([torch.zeros(len(feats)), torch.arange(len(feats)),
                           torch.zeros(len(feats)), torch.zeros(len(feats))], 1).int()
    sparse = convert_sync_bn(nn.Sequential(SparseBatchNorm(3)), 'allreduce')[0].train()
    dense = convert_sync_bn(nn.Sequential(nn.BatchNorm1d(3)), 'allreduce')[0].train()
    out = sparse(spconv.SparseConvTensor(feats, indices, [len(feats) + 1, 1, 1], 1))
    return (out.features - dense(feats)).abs().max().item()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_processes_equal_one_batchnorm_over_the_whole_batch(tmp_path):
    results = spawn_checks(2, str(tmp_path), [check_matches_full_batch])
    for rank_result in results:
        diffs = rank_result['check_matches_full_batch']
        assert set(CASES) < set(diffs)
        assert all(diffs[name] <= TOL for name in CASES), diffs
        assert diffs['sparse'] <= TOL
        # only per-channel statistics beyond the input (the autograd form kept 2 inputs)
        assert 0 <= diffs['saved_bytes_over_input'] <= 1024, diffs


def test_single_process_and_eval_are_plain_batchnorm():
    x, _ = _case((6, 3, 4, 5))
    ref, sync = _bn_for(x.shape), convert_sync_bn(nn.Sequential(_bn_for(x.shape)),
                                                  'allreduce')[0]
    assert torch.allclose(sync.train()(x), ref.train()(x), atol=TOL)
    assert torch.allclose(sync.running_var, ref.running_var)
    assert torch.allclose(sync.eval()(x), ref.eval()(x), atol=TOL)


def test_converting_again_keeps_the_layer():
    once = convert_sync_bn(nn.Sequential(nn.BatchNorm2d(3)), 'allreduce')
    layer = once[0]
    assert convert_sync_bn(once, 'torch')[0] is layer  # already synchronised: kept


def test_allreduce_trains_without_cuda():
    assert resolve_implementation('allreduce', cuda=False) == 'allreduce'
