"""ResumableSampler against mmengine's real DefaultSampler (one process; the per-rank
shards are checked with two gloo ranks in tests/hooks/test_preemption_hook.py)."""
import pytest
from mmengine.dataset import DefaultSampler

from mmdet3d_scaling.datasets import ResumableSampler


@pytest.mark.parametrize('shuffle', [True, False])
def test_same_indices_as_default_sampler_in_every_epoch(shuffle):
    data = list(range(13))
    ours, stock = ResumableSampler(data, shuffle, seed=3), DefaultSampler(data, shuffle, seed=3)
    for epoch in range(3):
        ours.set_epoch(epoch)
        stock.set_epoch(epoch)
        assert list(ours) == list(stock) and len(ours) == len(stock)


def test_skip_leaves_out_the_first_indices_of_that_epoch_only():
    data = list(range(10))
    ours, stock = ResumableSampler(data, seed=0), DefaultSampler(data, seed=0)
    ours.skip_in_epoch(1, 4)
    stock.set_epoch(1)
    assert ours.epoch == 1 and ours.skipped == 4
    assert list(ours) == list(stock)[4:] and len(ours) == 6
    assert list(ours) == list(stock)[4:]  # a second pass (persistent workers) too
    ours.set_epoch(2)
    stock.set_epoch(2)
    assert list(ours) == list(stock) and len(ours) == 10
    ours.skip_in_epoch(0, 99)  # more than the epoch: an empty epoch
    assert list(ours) == [] and len(ours) == 0


def test_negative_skip_is_refused():
    with pytest.raises(ValueError, match='samples to skip must be >= 0, got -1'):
        ResumableSampler(list(range(4)), seed=0).skip_in_epoch(0, -1)
