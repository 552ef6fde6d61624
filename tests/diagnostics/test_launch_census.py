"""LaunchCensus: kernel-running operators by their Python caller, on a CPU."""
import torch

from mmdet3d_scaling.diagnostics.launch_census import COPY_OPS, LaunchCensus


def _three_kernels(x, w):
    y = (x @ w).relu()  # mm, relu
    flat = y.view(-1).unsqueeze(0).t()  # views only: no kernel
    return flat.sum()  # sum


def _one_copy(x):
    return x.to(torch.float64)


def test_counts_kernels_at_their_caller_and_skips_views():
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    with LaunchCensus(exclude=()) as census:
        for _ in range(3):
            _three_kernels(x, w)
    by_op = {op: n for (_, op), n in census.counts.items()}
    assert by_op == {'mm': 3, 'relu': 3, 'sum': 3}
    assert census.total == 9 and census.copies == 0
    sites = census.sites(per=3)
    assert sum(s['count'] for s in sites) == 3
    assert all('test_launch_census.py' in s['site'] and s['site'].endswith('_three_kernels')
               for s in sites)


def test_copies_and_backward():
    x = torch.randn(4, 3)
    w = torch.randn(3, 2, requires_grad=True)
    with LaunchCensus(exclude=()) as census:
        _one_copy(x)
        loss = (x @ w).sum()
        loss.backward()  # ones_like + mm (grad of w); sum's backward is a view
    assert census.copies == 1
    assert sum(n for (_, op), n in census.counts.items() if op in COPY_OPS) == 1
    backward = [s for s in census.sites() if 'test_copies_and_backward' in s['site']]
    ops = {op for s in backward for op in s['top_ops']}
    assert {'mm', 'sum'} <= ops  # forward and backward kernels of this function
    assert w.grad is not None


def test_excluded_frames_and_outside_the_block_are_not_counted():
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    with LaunchCensus(exclude=('test_launch_census.py', )) as census:
        _three_kernels(x, w)
    assert census.total == 0
    _three_kernels(x, w)  # after the block
    assert census.total == 0
    with LaunchCensus() as census:  # default exclusions do not hide this file
        _three_kernels(x, w)
    assert census.total == 3


def test_sites_rank_by_count_and_cut_at_top():
    x, w = torch.randn(4, 3), torch.randn(3, 2)
    with LaunchCensus(exclude=()) as census:
        _three_kernels(x, w)
        _one_copy(x)
    sites = census.sites(top=1)
    assert len(sites) == 1 and sites[0]['count'] == 2  # the line with mm + relu
    assert sites[0]['top_ops'] == {'mm': 1, 'relu': 1}
