"""The batch size search on a real PointPillars and real synthetic-KITTI batches, with
a modelled device standing in for the GPU (memory = fixed + per-sample/per-element)."""
import os
import os.path as osp
import pickle
import socket

import pytest
import torch
from mmengine.dataset import pseudo_collate

from mmdet3d_scaling.batch_size.cache import ResultCache, lookup_agreed
from mmdet3d_scaling.batch_size.memory_probe import ModeledMemoryProbe
from mmdet3d_scaling.batch_size.samples import LargestSampleBatches, RandomSampleBatches
from mmdet3d_scaling.batch_size.search import BatchSizeFinder
from mmdet3d_scaling.batch_size.trial import is_out_of_memory, local_sync_bn
from tests.auto_batch_size_common import build_parts, demo_config
from tests.multiprocess import start_ranks

MiB = 2**20


def _finder(shared, probe_kwargs, margin=0.1, max_batch_size=8, steps=1, **kwargs):
    model, optim_wrapper, _, batches = shared
    probe = ModeledMemoryProbe(model, **probe_kwargs)
    finder = BatchSizeFinder(model, optim_wrapper, batches, probe, margin=margin,
                             steps_per_trial=steps, max_batch_size=max_batch_size,
                             **kwargs)
    return finder, probe


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------- the search
@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_search_finds_largest_batch_under_the_margin(shared, parts):
    # memory = 2 MiB + 1 MiB per sample; capacity 5 MiB, 10 % kept free: limit 4.5 MiB
    probe_kwargs = dict(capacity_bytes=5 * MiB, fixed_bytes=2 * MiB, bytes_per_sample=MiB)
    finder, probe = _finder(shared, probe_kwargs)
    result = finder.search()
    probe.detach()
    assert result.batch_size == result.local_batch_size == 2
    # doubling until the first failure (4), then bisection between 2 and 4
    assert [(t.batch_size, t.fits) for t in result.trials] == [
        (1, True), (2, True), (4, False), (3, False)]
    # trials run with the device limited to 4.5 MiB: 4 and 3 run out of memory there
    assert [(t.peak_bytes, t.oom) for t in result.trials] == [
        (3 * MiB, False), (4 * MiB, False), (None, True), (None, True)]
    assert probe.oom_bytes == 5 * MiB  # the limit is lifted after each trial
    assert result.limit_bytes == int(4.5 * MiB) and not result.hit_upper_bound
    # half the memory kept free: 2.5 MiB allowed, a batch of 1 needs 3
    finder, probe = _finder(shared, probe_kwargs, margin=0.5)
    with pytest.raises(RuntimeError, match='even a batch of 1 does not fit'):
        finder.search()
    probe.detach()
    assert [t.batch_size for t in finder.trials] == [1]


def test_upper_bound_stops_the_growth(shared, parts):
    finder, probe = _finder(shared, dict(capacity_bytes=100 * MiB, fixed_bytes=0,
                                         bytes_per_sample=MiB), max_batch_size=2)
    result = finder.search()
    probe.detach()
    assert [t.batch_size for t in result.trials] == [1, 2]
    assert result.batch_size == 2 and result.hit_upper_bound


def test_oom_in_a_trial_is_handled_and_state_restored(shared, parts):
    model, optim_wrapper, _ = parts
    before = _params(model)
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    # a real torch.cuda.OutOfMemoryError above 3.5 MiB, raised inside the forward of
    # batch 4; the limit with the margin alone would allow 9
    finder, probe = _finder(shared, dict(capacity_bytes=10 * MiB, fixed_bytes=0,
                                         bytes_per_sample=MiB, oom_bytes=int(3.5 * MiB)))
    result = finder.search()
    probe.detach()
    assert result.batch_size == 3
    assert [(t.batch_size, t.oom) for t in result.trials] == [
        (1, False), (2, False), (4, True), (3, False)]
    after = _params(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not optim_wrapper.optimizer.state  # AdamW moments freed with the trials
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.rand(3), expected_draw)  # RNG as before the search
    assert optim_wrapper._accumulative_counts == 1 and optim_wrapper._inner_count == 0


def test_trials_really_train(shared, parts):
    """A trial changes the weights (real optimizer steps) before they are restored."""
    model, optim_wrapper, _ = parts
    finder, probe = _finder(shared, dict(capacity_bytes=100 * MiB, bytes_per_sample=MiB),
                            steps=2)
    original = _params(model)
    changed = {}

    def record(module, args, kwargs):  # the last call is the second step's forward
        changed.update({k: v.detach().clone() for k, v in module.state_dict().items()})
    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    with finder.session():
        trial = finder.try_batch(1)
    handle.remove()
    probe.detach()
    assert trial.fits
    # the second step's forward saw weights updated by the first step's optimizer step
    assert any(not torch.equal(original[k], changed[k]) for k in original
               if original[k].is_floating_point())
    assert all(torch.equal(original[k], v) for k, v in _params(model).items())


def test_other_errors_propagate_and_state_is_restored(shared, parts):
    model, optim_wrapper, _, batches = shared
    before = _params(model)
    probe = ModeledMemoryProbe(model, capacity_bytes=100 * MiB, bytes_per_sample=MiB)

    def broken(n):  # points with 2 features for a 4-feature voxel encoder: a real bug
        data = batches(n)
        data['inputs']['points'] = [p[:, :2] for p in data['inputs']['points']]
        return data
    finder = BatchSizeFinder(model, optim_wrapper, broken, probe, max_batch_size=4)
    try:
        with pytest.raises((IndexError, RuntimeError)) as info:
            finder.search()
    finally:
        probe.detach()
    assert not is_out_of_memory(info.value)
    assert [t.batch_size for t in finder.trials] == []  # the first trial raised
    assert all(torch.equal(before[k], v) for k, v in _params(model).items())


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_largest_up_to_checks_the_bound_then_bisects(shared, parts):
    """The benchmark's confirmation: the bound if it fits, else bisection from a batch
    known to fit; the model comes back unchanged."""
    model = parts[0]
    before = _params(model)
    # 1 MiB a sample, 6.5 MiB of 10 allowed with 35 % kept free: 6 fit, 7 do not
    probe_kwargs = dict(capacity_bytes=10 * MiB, fixed_bytes=0, bytes_per_sample=MiB)
    finder, probe = _finder(shared, probe_kwargs, margin=0.35, max_batch_size=16)
    assert finder.largest_up_to(16, known_good=2) == 6
    assert [(t.batch_size, t.fits) for t in finder.trials] == [
        (16, False), (9, False), (5, True), (7, False), (6, True)]
    assert finder.largest_up_to(5, known_good=2) == 5  # the bound fits: one trial
    assert [t.batch_size for t in finder.trials] == [5]
    probe.detach()
    after = _params(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match='known_good=4, upper=4'):
        finder.largest_up_to(4, known_good=4)


@pytest.mark.slow  # >= 4 s on 2 cores (measured)
def test_new_batch_each_step_draws_random_batches(shared, parts):
    model, optim_wrapper, dataset = parts
    drawn = []
    random_batches = RandomSampleBatches(dataset, pseudo_collate, seed=1)

    def make_batch(n):
        batch = random_batches(n)
        drawn.append([s.metainfo['sample_idx'] for s in batch['data_samples']])
        return batch

    probe = ModeledMemoryProbe(model, capacity_bytes=100 * MiB, fixed_bytes=0,
                               bytes_per_sample=MiB)
    finder = BatchSizeFinder(model, optim_wrapper, make_batch, probe, steps_per_trial=3,
                             max_batch_size=3, new_batch_each_step=True)
    finder.largest_up_to(3, known_good=1)
    probe.detach()
    random_batches.close()
    assert len(drawn) == 3 and all(len(d) == 3 for d in drawn)  # one draw a step
    assert len({tuple(d) for d in drawn}) > 1  # not the same batch three times
    again = RandomSampleBatches(dataset, pseudo_collate, seed=1)
    assert [s.metainfo['sample_idx'] for s in again(3)['data_samples']] == drawn[0]


def test_bad_arguments(parts):
    model, optim_wrapper, _ = parts
    probe = ModeledMemoryProbe(model, capacity_bytes=MiB)
    with pytest.raises(ValueError, match='margin'):
        BatchSizeFinder(model, optim_wrapper, lambda n: None, probe, margin=1.0)
    with pytest.raises(ValueError, match='init_batch_size'):
        BatchSizeFinder(model, optim_wrapper, lambda n: None, probe, init_batch_size=8,
                        max_batch_size=4)
    probe.detach()
    with pytest.raises(ValueError, match='capacity_bytes'):
        ModeledMemoryProbe(model, capacity_bytes=0)


def test_is_out_of_memory():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError('CUDA out of memory.'))
    assert is_out_of_memory(RuntimeError('CUDA error: out of memory'))
    assert not is_out_of_memory(RuntimeError('shape mismatch'))
    assert not is_out_of_memory(ValueError('out of memory'))


# ------------------------------------------------------------------ distributed
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _rank_main(rank, world_size, port, data_root, out_dir):
    import torch.distributed as torch_dist
    os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch_dist.init_process_group('gloo', rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        cfg = demo_config(data_root, out_dir)
        torch.manual_seed(0)
        model, optim_wrapper, dataset = build_parts(cfg)
        model.train()
        # rank 0 holds 2 samples, rank 1 only 1: both must train with 1
        capacity = (2 if rank == 0 else 1) * MiB
        probe = ModeledMemoryProbe(model, capacity_bytes=capacity, fixed_bytes=0,
                                   bytes_per_sample=MiB, oom_bytes=capacity)
        batches = LargestSampleBatches(dataset, pseudo_collate, num_candidates=2)
        finder = BatchSizeFinder(model, optim_wrapper, batches, probe, margin=0.0,
                                 steps_per_trial=1, max_batch_size=2)
        result = finder.search()
        cache = ResultCache(osp.join(out_dir, 'cache.json'))
        if rank == 0:
            cache.put('k', result)
        torch_dist.barrier()
        cached = lookup_agreed(cache, 'k')
        # SyncBN layers use a group of this rank alone during the search
        bn = torch.nn.SyncBatchNorm(4)
        with local_sync_bn(torch.nn.Sequential(bn)):
            bn_group_size = torch_dist.get_world_size(bn.process_group)
        with open(osp.join(out_dir, f'rank{rank}.pkl'), 'wb') as f:
            pickle.dump(dict(batch=result.batch_size, local=result.local_batch_size,
                             cached=cached.batch_size, bn_group_size=bn_group_size,
                             bn_group_after=bn.process_group,
                             ooms=[t.batch_size for t in result.trials if t.oom]), f)
    finally:
        torch_dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ranks_agree_on_the_minimum(data_root, tmp_path):
    # forked on a CPU so the children inherit the imported stack (spawning re-imports
    # it for half a minute); spawned where CUDA is initialised
    # a GPU a rank where there are 2; else CPU ranks, CUDA hidden (tests/multiprocess.py)
    start_ranks(_rank_main, (2, _free_port(), data_root, str(tmp_path)), nprocs=2)
    out = [pickle.load(open(tmp_path / f'rank{r}.pkl', 'rb')) for r in range(2)]
    assert [o['local'] for o in out] == [2, 1]
    assert [o['batch'] for o in out] == [1, 1]
    assert [o['cached'] for o in out] == [1, 1]
    assert [(o['bn_group_size'], o['bn_group_after']) for o in out] == [(1, None)] * 2
    assert out[0]['ooms'] == [] and out[1]['ooms'] == [2]  # rank 1 ran out of memory
    # in its trial of 2 while rank 0 trained 2 without waiting for it
