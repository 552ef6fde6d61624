"""DDP through a real mmengine Runner, 2 and 4 gloo processes on the CPU.

One spawn per world size runs several checks in the same process group. References are
single-process runs of the same config in the pytest process. The toy model has no
BatchNorm, so DDP, accumulation and one big batch agree to float rounding.
"""
import os
import os.path as osp

import pytest
import torch
from mmengine.runner import Runner

import mmdet3d_scaling  # noqa: F401
from tests.parallel.dist_parts import params_of, spawn_checks, toy_cfg

TOL = 1e-5


def _max_diff(a: dict, b: dict) -> float:
    return max(max(abs(x - y) for x, y in zip(a[k], b[k])) for k in a)


def _reference(work_dir: str, total: int, **kw) -> Runner:
    runner = Runner.from_cfg(toy_cfg(work_dir, scaling=dict(total_batch_size=total),
                                     name=f'ref{total}', **kw))
    runner.train()
    return runner


# ----------------------------------------------------------------- checks (spawned)
def check_ddp_matches_reference(rank, world, out):
    runner = Runner.from_cfg(toy_cfg(osp.join(out, 'ddp'), launcher='pytorch',
                                     scaling=dict(total_batch_size=4), name='ddp',
                                     distributed=dict()))
    pg = torch.distributed.distributed_c10d._get_default_group()
    runner.train()
    return dict(params=params_of(runner.model), wrapper=type(runner.model).__name__,
                batch=runner.train_dataloader.batch_size,
                acc=runner.optim_wrapper._accumulative_counts,
                timeout_s=runner.cfg.env_cfg.dist_cfg.timeout, backend=pg.name())


def check_probe_names_unused(rank, world, out):
    cfg = toy_cfg(osp.join(out, 'probe'), launcher='pytorch', model='H4ToyWithUnused',
                  max_iters=2, name='probe',
                  distributed=dict(find_unused_parameters='auto'))
    runner = Runner.from_cfg(cfg)
    runner.train()  # two iterations: DDP would raise without find_unused_parameters
    return dict(probed=runner.model.probed_unused_parameters,
                find_unused=runner.model.find_unused_parameters)


def check_fp16_comm_hook(rank, world, out):
    cfg = toy_cfg(osp.join(out, 'fp16'), launcher='pytorch', name='fp16',
                  scaling=dict(total_batch_size=4),
                  distributed=dict(comm_compression='fp16', bucket_cap_mb=1,
                                   static_graph=True))
    runner = Runner.from_cfg(cfg)
    runner.train()
    return dict(hooks=[h.__name__ for h, _ in runner.model._comm_hooks],
                static_graph=bool(runner.model.static_graph),
                params=params_of(runner.model))


def check_resume_on_two_gpus(rank, world, out):
    ckpt = osp.join(out, 'ref', 'iter_8.pth')
    cfg = toy_cfg(osp.join(out, 'resume'), launcher='pytorch', name='resume',
                  scaling=dict(total_batch_size=4), load_from=ckpt, resume=True,
                  record=osp.join(out, 'resume_record.json'), trusted_checkpoints=[ckpt])
    runner = Runner.from_cfg(cfg)
    runner.train()
    hook = next(h for h in runner.hooks if type(h).__name__ == 'ScalingPlanHook')
    return dict(params=params_of(runner.model), conversion=hook.conversion)


def check_seeds_per_rank(rank, world, out):
    cfg = toy_cfg(osp.join(out, 'seed'), launcher='pytorch', name='seed',
                  randomness=dict(seed=123, diff_rank_seed=True))
    Runner.from_cfg(cfg)
    return dict(seed=torch.initial_seed())


def check_sync_bn_from_the_config(rank, world, out):
    # what the CLI's --sync_bn torch sets; without CUDA it becomes 'naive'
    cfg = toy_cfg(osp.join(out, 'syncbn'), launcher='pytorch', name='syncbn',
                  model='H4ToyWithBN', max_iters=2, distributed=dict(sync_bn='torch'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    bn = runner.model.module.bn
    gathered = [torch.zeros_like(bn.running_mean) for _ in range(world)]
    torch.distributed.all_gather(gathered, bn.running_mean)
    return dict(type=type(bn).__name__,
                spread=max((g - gathered[0]).abs().max().item() for g in gathered))


def check_sync_bn_sparse_encoder(rank, world, out):
    from tests.parallel.test_sync_bn import build_encoder, sparse_input
    from mmdet3d_scaling.parallel.sync_bn import (convert_sync_bn,
                                                        resolve_implementation)
    stats = {}
    for mode in ('plain', 'synced'):
        torch.manual_seed(0)
        encoder = build_encoder()
        if mode == 'synced':
            encoder = convert_sync_bn(encoder, resolve_implementation('torch'))
        encoder.train()
        feats, coors = sparse_input(seed=rank)  # different voxels on each rank
        encoder(feats, coors, 1).sum().backward()
        bn = next(m for m in encoder.modules() if hasattr(m, 'running_mean'))
        gathered = [torch.zeros_like(bn.running_mean) for _ in range(world)]
        torch.distributed.all_gather(gathered, bn.running_mean)
        stats[mode] = max((g - gathered[0]).abs().max().item() for g in gathered)
        stats[mode + '_type'] = type(bn).__name__
    return stats


def check_ddp_four_processes(rank, world, out):
    # 16 = 4 GPUs x 2 per GPU x 2 accumulation (DDP no_sync inside each window)
    runner = Runner.from_cfg(toy_cfg(osp.join(out, 'ddp4'), launcher='pytorch',
                                     scaling=dict(total_batch_size=16), name='ddp4',
                                     distributed=dict(gradient_as_bucket_view=True)))
    runner.train()
    return dict(params=params_of(runner.model),
                acc=runner.optim_wrapper._accumulative_counts,
                batch=runner.train_dataloader.batch_size)


def check_fp16_comm_hook_four(rank, world, out):
    # bf16 compression needs NCCL (a config-step error on gloo, see
    # test_distributed_config.py); fp16 with the other DDP options on 4 processes
    cfg = toy_cfg(osp.join(out, 'fp16x4'), launcher='pytorch', name='fp16x4', max_iters=2,
                  scaling=dict(total_batch_size=8),
                  distributed=dict(comm_compression='fp16', gradient_as_bucket_view=False,
                                   find_unused_parameters=True))
    runner = Runner.from_cfg(cfg)
    runner.train()
    return dict(hooks=[h.__name__ for h, _ in runner.model._comm_hooks],
                params=params_of(runner.model))


# -------------------------------------------------------------------------- tests
@pytest.fixture(scope='module')
def two_process_results(tmp_path_factory):
    out = str(tmp_path_factory.mktemp('ddp2'))
    # 1 process, 4 = 1 x 2 x 2 accumulation, 6 optimizer steps, checkpoints at steps 4, 6
    ref = _reference(osp.join(out, 'ref'), 4, checkpoint_interval=4,
                     record=osp.join(out, 'ref_record.json'))
    assert osp.isfile(osp.join(out, 'ref', 'iter_8.pth'))
    results = spawn_checks(2, out, [
        check_ddp_matches_reference, check_probe_names_unused, check_fp16_comm_hook,
        check_resume_on_two_gpus, check_seeds_per_rank, check_sync_bn_sparse_encoder,
        check_sync_bn_from_the_config])
    return dict(out=out, ref=params_of(ref.model), ref_acc=ref.optim_wrapper.
                _accumulative_counts, results=results)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_two_process_ddp_equals_single_process_accumulation(two_process_results):
    assert two_process_results['ref_acc'] == 2
    for rank_result in two_process_results['results']:
        r = rank_result['check_ddp_matches_reference']
        assert r['wrapper'] == 'ScalingDistributedDataParallel'
        assert (r['batch'], r['acc']) == (2, 1)
        assert r['backend'] == 'gloo'
        assert r['timeout_s'] == 180  # explicit env_cfg.dist_cfg.timeout kept
        assert _max_diff(r['params'], two_process_results['ref']) <= TOL


@pytest.mark.multiprocess
@pytest.mark.slow
def test_probe_names_the_unused_parameters(two_process_results):
    for rank_result in two_process_results['results']:
        r = rank_result['check_probe_names_unused']
        assert sorted(r['probed']) == ['unused_head.bias', 'unused_head.weight']
        assert r['find_unused'] is True


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fp16_comm_hook_is_registered_and_trains(two_process_results):
    for rank_result in two_process_results['results']:
        r = rank_result['check_fp16_comm_hook']
        assert r['hooks'] == ['fp16_compress_hook']
        assert r['static_graph'] is True
        # half-precision gradients: close to, not equal to, the fp32 reference
        assert _max_diff(r['params'], two_process_results['ref']) <= 1e-2


@pytest.mark.multiprocess
@pytest.mark.slow
def test_resume_on_another_world_size_keeps_samples_and_lr(two_process_results):
    import json
    out = two_process_results['out']
    with open(osp.join(out, 'ref_record.json')) as f:
        ref = json.load(f)
    with open(osp.join(out, 'resume_record.json')) as f:
        resumed = json.load(f)
    conv = two_process_results['results'][0]['check_resume_on_two_gpus']['conversion']
    # 1 GPU x 2 x acc 2 at iteration 8 == 2 GPUs x 2 x acc 1 at iteration 4: 16 samples
    assert (conv['old_iter'], conv['new_iter'], conv['samples_seen']) == (8, 4, 16)
    assert resumed['start_iter'] == 4
    # the LR of optimizer step 4: iteration 8 (window start) before, iteration 4 now
    assert resumed['lrs']['4'] == pytest.approx(ref['lrs']['8'], rel=1e-12)
    assert resumed['lrs']['4'] == pytest.approx(0.005)  # after the milestone at step 3
    for rank_result in two_process_results['results']:
        params = rank_result['check_resume_on_two_gpus']['params']
        assert _max_diff(params, two_process_results['ref']) <= TOL


@pytest.mark.multiprocess
@pytest.mark.slow
def test_seeds_differ_per_rank(two_process_results):
    seeds = [r['check_seeds_per_rank']['seed'] for r in two_process_results['results']]
    assert seeds == [123, 124]


@pytest.mark.multiprocess
@pytest.mark.slow
def test_naive_sync_bn_synchronises_a_sparse_encoder(two_process_results):
    for rank_result in two_process_results['results']:
        r = rank_result['check_sync_bn_sparse_encoder']
        assert r['plain'] > 1e-7  # different voxels: per-rank statistics differ ...
        assert r['synced'] <= 1e-6  # ... unless synchronised
        assert r['synced_type'] == 'NaiveSyncBatchNorm1d'


@pytest.mark.multiprocess
@pytest.mark.slow
def test_sync_bn_from_the_config_synchronises_statistics(two_process_results):
    for rank_result in two_process_results['results']:
        r = rank_result['check_sync_bn_from_the_config']
        assert r['type'] == 'NaiveSyncBatchNorm1d'
        assert r['spread'] <= 1e-6  # each rank saw other samples, same statistics


@pytest.mark.multiprocess
@pytest.mark.slow
def test_four_processes_match_single_process(tmp_path):
    out = str(tmp_path)
    ref = _reference(osp.join(out, 'ref16'), 16)
    assert ref.optim_wrapper._accumulative_counts == 8
    ref_params = params_of(ref.model)
    results = spawn_checks(4, out, [check_ddp_four_processes, check_fp16_comm_hook_four])
    for rank_result in results:
        r = rank_result['check_ddp_four_processes']
        assert (r['batch'], r['acc']) == (2, 2)
        assert _max_diff(r['params'], ref_params) <= TOL
        assert rank_result['check_fp16_comm_hook_four']['hooks'] == ['fp16_compress_hook']
    final = [r['check_fp16_comm_hook_four']['params'] for r in results]
    assert all(_max_diff(p, final[0]) == 0 for p in final)  # replicas stay identical
