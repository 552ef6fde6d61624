"""HostReadCensus: counts would-be host reads by their Python caller, on a CPU."""
import torch

from mmdet3d_scaling.engine.host_reads import HostReadCensus


def _reads_four_times(x):
    total = sum(x[i].item() for i in range(2))  # two .item()
    if x.sum() > 0:  # a __bool__
        total += 1
    return total + x[x > 0].numel()  # a boolean mask


def _no_reads(x):
    return (x * 2).sum()


def test_counts_each_read_at_its_caller():
    x = torch.randn(16)
    with HostReadCensus() as census:
        for _ in range(3):
            _reads_four_times(x)
            _no_reads(x)
    by_op = {(s['op']): s for s in census.sites(per=3)}
    assert census.total == 12
    assert by_op['item']['count'] == 2 and by_op['__bool__']['count'] == 1
    assert by_op['[bool mask]']['count'] == 1
    assert all(s['site'].endswith(': <genexpr>') or s['site'].endswith(': _reads_four_times')
               for s in census.sites())
    assert all('test_host_reads.py' in s['site'] for s in census.sites())


def test_excluded_frames_and_outside_the_block_are_not_counted():
    x = torch.randn(4)
    with HostReadCensus(exclude=('test_host_reads.py', )) as census:
        _reads_four_times(x)
    assert census.total == 0
    census = HostReadCensus()
    _reads_four_times(x)  # not inside the block
    assert census.total == 0


def test_optimizer_step_counters_are_not_reads():
    """AdamW reads its CPU step counters with .item(): no GPU wait, left out."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    with HostReadCensus() as census:
        opt.step()
    assert census.total == 0
