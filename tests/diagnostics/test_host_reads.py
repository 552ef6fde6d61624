"""HostReadCensus: would-be host reads by their Python caller, on a CPU;
SyncSiteRecorder: the real synchronisations of a CUDA run (skipped without CUDA)."""
import warnings

import pytest
import torch

from mmdet3d_scaling.diagnostics.host_reads import HostReadCensus, SyncSiteRecorder


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


def test_sync_recorder_is_a_no_op_without_cuda():
    if torch.cuda.is_available():
        pytest.skip('has CUDA')
    with pytest.warns(UserWarning, match='passes through'):
        with SyncSiteRecorder() as rec:
            _reads_four_times(torch.randn(8))
            warnings.warn('passes through')
    assert rec.sites(iters=1) == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_sync_recorder_names_the_caller_of_each_host_wait():
    x = torch.randn(64, device='cuda')
    mode = torch.cuda.get_sync_debug_mode()
    with pytest.warns(UserWarning, match='passes through'):  # other warnings still shown
        with SyncSiteRecorder() as rec:
            for _ in range(2):
                _reads_four_times(x)
            warnings.warn('passes through')
    assert torch.cuda.get_sync_debug_mode() == mode  # restored
    sites = rec.sites(iters=2)
    assert all(s['site'].endswith((': <genexpr>', ': _reads_four_times'))
               and 'test_host_reads.py' in s['site'] for s in sites)
    assert sum(s['calls_per_iter'] for s in sites) >= 4  # .item() x 2, if, bool mask
    assert not any('/torch/' in s['site'] for s in sites)
    counted = sum(rec.counts.values())
    x[0].item()  # after the block: not counted
    assert sum(rec.counts.values()) == counted


def test_sync_recorder_counts_by_stage_when_given_one():
    stage = ['bbox_head.loss']
    rec = SyncSiteRecorder(stage=lambda: stage[-1])
    rec.record('head.py(10): loss')
    rec.record('head.py(10): loss')
    stage.append('backward')
    rec.record('head.py(10): loss')
    rows = rec.sites(iters=2)
    assert rows[0] == dict(stage='bbox_head.loss', site='head.py(10): loss',
                           op='synchronizing CUDA operation', calls_per_iter=1.0)
    assert rows[1]['stage'] == 'backward' and rows[1]['calls_per_iter'] == 0.5
    plain = SyncSiteRecorder()
    plain.record('a.py(1): f')
    assert plain.sites(iters=1) == [dict(site='a.py(1): f', op='synchronizing CUDA operation',
                                         calls_per_iter=1.0)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_sync_recorder_puts_each_wait_in_its_stage():
    from torch import nn

    from mmdet3d_scaling.diagnostics.step_stages import labelled_stages

    class Reads(nn.Module):
        def forward(self, x):
            return _reads_four_times(x)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = Reads()

    class Wrapper:
        def backward(self, loss):
            pass

    model, x = Model(), torch.randn(64, device='cuda')
    with labelled_stages(model, Wrapper()) as stages:
        with SyncSiteRecorder(stage=stages.current) as rec:
            model.head(x)
            x.sum().item()  # outside every stage
    by_stage = {}
    for row in rec.sites(iters=1):
        by_stage[row['stage']] = by_stage.get(row['stage'], 0) + row['calls_per_iter']
    assert by_stage['head.forward'] >= 4 and by_stage['(between steps)'] >= 1
