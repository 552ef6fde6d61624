"""The batch size search on a real PointPillars and real synthetic-KITTI batches, with
a modelled device standing in for the GPU (memory = fixed + per-sample/per-element)."""
import json
import os
import os.path as osp
import pickle
import socket

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from mmengine.dataset import pseudo_collate

from mmdet3d_scaling.engine.batch_size_finder import (BatchSizeFinder, LargestSampleBatches,
                                                      ResultCache, SearchResult,
                                                      TrainingState, cache_key,
                                                      is_out_of_memory, lookup_agreed,
                                                      rank_largest, sample_size)
from mmdet3d_scaling.engine.memory_probe import ModeledMemoryProbe
from tests.auto_batch_size_common import build_parts, data_root_for_tests, demo_config

MiB = 2**20


@pytest.fixture(scope='module')
def data_root(tmp_path_factory):
    return data_root_for_tests(str(tmp_path_factory.mktemp('abs_data')))


@pytest.fixture
def parts(data_root, tmp_path):
    cfg = demo_config(data_root, str(tmp_path))
    torch.manual_seed(0)
    model, optim_wrapper, dataset = build_parts(cfg)
    return model, optim_wrapper, dataset


def _finder(parts, probe_kwargs, margin=0.1, max_batch_size=16, steps=1, **kwargs):
    model, optim_wrapper, dataset = parts
    probe = ModeledMemoryProbe(model, **probe_kwargs)
    batches = LargestSampleBatches(dataset, pseudo_collate, num_candidates=4)
    finder = BatchSizeFinder(model, optim_wrapper, batches, probe, margin=margin,
                             steps_per_trial=steps, max_batch_size=max_batch_size,
                             **kwargs)
    return finder, probe


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------- the search
@pytest.mark.parametrize('margin,expected', [(0.1, 6), (0.3, 4)])
def test_search_finds_largest_batch_under_the_margin(parts, margin, expected):
    # memory = 2 MiB + 1 MiB per sample; capacity 9 MiB -> limit 8.1 / 6.3 MiB
    finder, _ = _finder(parts, dict(capacity_bytes=9 * MiB, fixed_bytes=2 * MiB,
                                    bytes_per_sample=MiB), margin=margin)
    result = finder.search()
    assert result.batch_size == result.local_batch_size == expected
    tried = [t.batch_size for t in result.trials]
    assert tried[:4] == [1, 2, 4, 8]  # doubling until the first failure
    assert all(t.fits == (t.batch_size <= expected) for t in result.trials)
    assert {expected, expected + 1} <= set(tried)  # bisection pinned the boundary
    assert result.limit_bytes == int(9 * MiB * (1 - margin))
    assert not result.hit_upper_bound


def test_upper_bound_stops_the_growth(parts):
    finder, _ = _finder(parts, dict(capacity_bytes=100 * MiB, fixed_bytes=0,
                                    bytes_per_sample=MiB), max_batch_size=3)
    result = finder.search()
    assert [t.batch_size for t in result.trials] == [1, 2, 3]
    assert result.batch_size == 3 and result.hit_upper_bound


def test_oom_in_a_trial_is_handled_and_state_restored(parts):
    model, optim_wrapper, _ = parts
    before = _params(model)
    torch.manual_seed(123)
    expected_draw = torch.rand(3)
    torch.manual_seed(123)
    # the modelled device raises a real torch.cuda.OutOfMemoryError above 5.5 MiB,
    # inside the forward of batch 6; the limit with margin alone would allow 8
    finder, probe = _finder(parts, dict(capacity_bytes=10 * MiB, fixed_bytes=0,
                                        bytes_per_sample=MiB,
                                        oom_bytes=int(5.5 * MiB)), steps=2)
    result = finder.search()
    assert result.batch_size == 5
    assert any(t.oom for t in result.trials) and all(
        t.oom for t in result.trials if t.batch_size > 5)
    after = _params(model)
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert not optim_wrapper.optimizer.state  # Adam moments freed with the trials
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.rand(3), expected_draw)  # RNG as before the search
    assert optim_wrapper._accumulative_counts == 1 and optim_wrapper._inner_count == 0
    probe.detach()


def test_trials_really_train(parts):
    """A trial changes the weights (real optimizer steps) before they are restored."""
    model, optim_wrapper, _ = parts
    finder, _ = _finder(parts, dict(capacity_bytes=100 * MiB, bytes_per_sample=MiB))
    state = TrainingState(model, optim_wrapper)
    finder.steps_per_trial = 2
    original = _params(model)
    changed = {}

    def record(module, args, kwargs):  # the last call is the second step's forward
        changed.update({k: v.detach().clone() for k, v in module.state_dict().items()})
    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    trial = finder.try_batch(2, state)
    handle.remove()
    assert trial.fits
    # the second step's forward saw weights updated by the first step's optimizer step
    assert any(not torch.equal(original[k], changed[k]) for k in original
               if original[k].is_floating_point())
    assert all(torch.equal(original[k], v) for k, v in _params(model).items())


def test_batch_of_one_not_fitting_is_a_clear_error(parts):
    finder, _ = _finder(parts, dict(capacity_bytes=MiB, fixed_bytes=2 * MiB))
    with pytest.raises(RuntimeError, match='even a batch of 1 does not fit'):
        finder.search()


def test_other_errors_propagate_and_state_is_restored(parts):
    model, optim_wrapper, dataset = parts
    before = _params(model)
    probe = ModeledMemoryProbe(model, capacity_bytes=100 * MiB, bytes_per_sample=MiB)
    batches = LargestSampleBatches(dataset, pseudo_collate, num_candidates=2)

    def broken(n):  # points with 2 features for a 4-feature voxel encoder: a real bug
        data = batches(n)
        data['inputs']['points'] = [p[:, :2] for p in data['inputs']['points']]
        return data
    finder = BatchSizeFinder(model, optim_wrapper, broken, probe, max_batch_size=4)
    with pytest.raises(Exception) as info:
        finder.search()
    assert not is_out_of_memory(info.value)
    assert all(torch.equal(before[k], v) for k, v in _params(model).items())


def test_bad_arguments(parts):
    model, optim_wrapper, _ = parts
    probe = ModeledMemoryProbe(model, capacity_bytes=MiB)
    with pytest.raises(ValueError, match='margin'):
        BatchSizeFinder(model, optim_wrapper, lambda n: None, probe, margin=1.0)
    with pytest.raises(ValueError, match='init_batch_size'):
        BatchSizeFinder(model, optim_wrapper, lambda n: None, probe, init_batch_size=8,
                        max_batch_size=4)


def test_is_out_of_memory():
    assert is_out_of_memory(torch.cuda.OutOfMemoryError('CUDA out of memory.'))
    assert is_out_of_memory(RuntimeError('CUDA error: out of memory'))
    assert not is_out_of_memory(RuntimeError('shape mismatch'))
    assert not is_out_of_memory(ValueError('out of memory'))


# -------------------------------------------------------------- largest samples
def test_largest_samples_are_picked(parts):
    _, _, dataset = parts
    sizes = [sample_size(dataset.get_data_info(i)) for i in range(len(dataset))]
    assert all(s['points'] > 0 and s['boxes'] > 0 for s in sizes)
    picked = rank_largest(dataset, 3)
    most_points = int(np.argmax([s['points'] for s in sizes]))
    most_boxes = int(np.argmax([s['boxes'] for s in sizes]))
    top = max(range(len(sizes)), key=lambda i: sizes[i]['points'] / sizes[most_points]
              ['points'] + sizes[i]['boxes'] / sizes[most_boxes]['boxes'])
    assert picked[0] == top
    smallest = min(range(len(sizes)), key=lambda i: sizes[i]['points'])
    assert smallest not in picked[:1]


def test_bigger_samples_cost_more_modelled_memory(parts):
    """With a per-element model, batches of the largest samples need more memory than
    batches of the smallest: the bias shows up in the search result."""
    model, optim_wrapper, dataset = parts
    sizes = [sample_size(dataset.get_data_info(i))['points'] for i in range(len(dataset))]
    probe = ModeledMemoryProbe(model, capacity_bytes=2**40, bytes_per_element=8.0,
                               fixed_bytes=0)
    state = TrainingState(model, optim_wrapper)
    peaks = {}
    for name, idx in (('large', int(np.argmax(sizes))), ('small', int(np.argmin(sizes)))):
        finder = BatchSizeFinder(model, optim_wrapper,
                                 lambda n, i=idx: pseudo_collate([dataset[i]] * n), probe)
        peaks[name] = finder.try_batch(2, state).peak_bytes
    assert peaks['large'] > peaks['small']
    probe.detach()


def test_candidates_cycle_and_are_loaded_once(parts):
    _, _, dataset = parts
    batches = LargestSampleBatches(dataset, pseudo_collate, num_candidates=2)
    data = batches(5)
    assert len(data['data_samples']) == 5
    assert len(batches._loaded) == 2
    first = data['inputs']['points'][0]
    assert torch.equal(first, data['inputs']['points'][2])  # cycled through 2 samples
    with pytest.raises(ValueError, match='num_candidates'):
        LargestSampleBatches(dataset, pseudo_collate, num_candidates=0)


# ------------------------------------------------------------------------ cache
def test_cache_roundtrip_and_key(tmp_path):
    cache = ResultCache(str(tmp_path / 'sub' / 'abs.json'))
    key = cache_key(dict(model={'a': 1}, world_size=2, device='X'))
    assert key == cache_key(dict(device='X', world_size=2, model={'a': 1}))
    assert key != cache_key(dict(model={'a': 1}, world_size=4, device='X'))
    assert cache.get(key) is None and lookup_agreed(cache, key) is None
    result = SearchResult(batch_size=6, local_batch_size=6, capacity_bytes=9, limit_bytes=8,
                          margin=0.1, max_batch_size=16, hit_upper_bound=False,
                          device_name='X', seconds=1.5)
    cache.put(key, result)
    again = lookup_agreed(cache, key)
    assert again.batch_size == 6 and again.from_cache
    assert json.load(open(cache.path))[key]['batch_size'] == 6
    with open(cache.path, 'w') as f:
        f.write('{broken')
    with pytest.raises(ValueError, match='delete it'):
        cache.get(key)


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
        # rank 0 holds 7 samples, rank 1 only 3: both must train with 3
        capacity = (7 if rank == 0 else 3) * MiB
        probe = ModeledMemoryProbe(model, capacity_bytes=capacity, fixed_bytes=0,
                                   bytes_per_sample=MiB, oom_bytes=capacity)
        batches = LargestSampleBatches(dataset, pseudo_collate, num_candidates=2)
        finder = BatchSizeFinder(model, optim_wrapper, batches, probe, margin=0.0,
                                 steps_per_trial=1, max_batch_size=8)
        result = finder.search()
        cache = ResultCache(osp.join(out_dir, 'cache.json'))
        if rank == 0:
            cache.put('k', result)
        torch_dist.barrier()
        cached = lookup_agreed(cache, 'k')
        with open(osp.join(out_dir, f'rank{rank}.pkl'), 'wb') as f:
            pickle.dump(dict(batch=result.batch_size, local=result.local_batch_size,
                             cached=cached.batch_size,
                             ooms=[t.batch_size for t in result.trials if t.oom]), f)
    finally:
        torch_dist.destroy_process_group()


def test_ranks_agree_on_the_minimum(data_root, tmp_path):
    mp.spawn(_rank_main, args=(2, _free_port(), data_root, str(tmp_path)), nprocs=2,
             join=True)
    out = [pickle.load(open(tmp_path / f'rank{r}.pkl', 'rb')) for r in range(2)]
    assert [o['local'] for o in out] == [7, 3]
    assert [o['batch'] for o in out] == [3, 3]
    assert [o['cached'] for o in out] == [3, 3]
    assert out[1]['ooms']  # rank 1 ran out of memory mid-trial without hanging rank 0
