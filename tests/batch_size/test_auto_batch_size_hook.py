"""AutoBatchSizeHook in a real mmengine Runner training the demo PointPillars on
synthetic KITTI-format data; a modelled device (1 MiB per sample) stands in for the GPU.

With capacity 3 MiB and the default 10 % margin (2.7 MiB allowed), 2 samples fit and 3
do not."""
import json
import os
import os.path as osp
import pickle
import socket

import pytest
import torch
from mmengine.config import Config

from mmdet3d_scaling.batch_size.auto_batch_size_hook import AutoBatchSizeHook
from tests.auto_batch_size_common import demo_config
from tests.batch_size.runs import MiB, modeled_probe, train
from tests.multiprocess import start_ranks


def probe(per_sample: float = MiB) -> dict:
    return modeled_probe(3 * MiB, per_sample)


def _run(cfg: Config, **hook_args):
    """Train with AutoBatchSizeHook (``hook_args``: its options, one step a trial);
    without them, as the config asks for it."""
    if hook_args:
        cfg.custom_hooks = list(cfg.get('custom_hooks') or []) + [
            dict(dict(type='AutoBatchSizeHook', steps_per_trial=1), **hook_args)]
    return train(cfg, AutoBatchSizeHook)


@pytest.mark.slow
def test_search_then_train_with_the_batch_and_keep_the_total(data_root, tmp_path):
    work_dir = str(tmp_path / 'work')
    cfg = demo_config(data_root, work_dir, batch_size=4, max_iters=1)
    lr = cfg.optim_wrapper.optimizer.lr
    runner, hook, rec, _ = _run(cfg, probe=probe())
    assert hook.result.batch_size == 2 and not hook.result.from_cache
    assert [t.batch_size for t in hook.result.trials] == [1, 2, 4, 3]
    assert (hook.plan.per_gpu_batch, hook.plan.accumulation, hook.plan.total_batch) == \
        (2, 2, 4)
    # 1 optimizer step of 4 samples as configured: 2 iterations of 2, stepping on 2nd
    assert rec.batches == [2, 2]
    assert rec.stepped == [False, True]
    assert runner.optim_wrapper._accumulative_counts == 2
    assert runner.train_dataloader.batch_size == 2
    # the LR schedule still spans the run: 1 optimizer step = 2 loop iterations
    assert runner.param_schedulers[0].end == 2
    group = runner.optim_wrapper.optimizer.param_groups[0]
    assert group['initial_lr'] == pytest.approx(lr)
    assert osp.isfile(osp.join(work_dir, 'iter_2.pth'))
    cached = json.load(open(osp.join(work_dir, 'auto_batch_size.json')))
    assert [e['batch_size'] for e in cached.values()] == [2]
    # the config in checkpoints records what was used
    assert runner.cfg.train_dataloader.batch_size == 2
    assert runner.cfg.optim_wrapper.accumulative_counts == 2

    # resume: same setting, so the cached result is used. The probe now says 2 MiB a
    # sample (not part of the cache key): a new search would pick 1, the cache says 2.
    cfg = demo_config(data_root, work_dir, batch_size=4, max_iters=2)
    cfg.resume = True
    runner, hook, rec, _ = _run(cfg, probe=probe(per_sample=2 * MiB))
    assert hook.result.from_cache and hook.result.batch_size == 2
    assert rec.batches == [2, 2] and runner.iter == 4  # iterations 3 and 4 of 4


@pytest.mark.slow
def test_scaling_recipe_with_auto_per_gpu_batch(data_root, tmp_path):
    cfg = demo_config(data_root, str(tmp_path), batch_size=1, max_iters=1)
    cfg.scaling = dict(total_batch_size=4, per_gpu_batch_size='auto')
    cfg.auto_batch_size = dict(probe=probe(), steps_per_trial=1, max_batch_size=3)
    runner, hook, rec, _ = _run(cfg)
    assert hook.result.batch_size == 2
    assert rec.batches == [2, 2] and rec.stepped == [False, True]
    assert runner.cfg.scaling_plan['plan']['per_gpu_batch'] == 2


@pytest.mark.slow
def test_epoch_based_loop_and_converted_scheduler(data_root, tmp_path):
    cfg = demo_config(data_root, str(tmp_path), batch_size=4)
    cfg.train_dataloader.dataset.dataset.indices = 4  # 4 frames
    cfg.train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=1)
    cfg.train_dataloader.sampler = dict(type='DefaultSampler', shuffle=False)
    cfg.param_scheduler = [dict(type='LinearLR', start_factor=0.5, by_epoch=True,
                                convert_to_iter_based=True, begin=0, end=1)]
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=1)
    runner, _, rec, _ = _run(cfg, probe=probe(), max_batch_size=3)  # trials 1, 2, 3
    assert rec.batches == [2, 2]  # 4 frames, batch 2
    assert rec.stepped == [False, True]
    assert runner.train_loop.max_iters == 2
    assert runner.param_schedulers[0].end == 2  # one epoch = 2 iterations now


@pytest.mark.slow
def test_scale_lr_instead_of_accumulating(data_root, tmp_path):
    cfg = demo_config(data_root, str(tmp_path), batch_size=4, max_iters=1)
    lr = cfg.optim_wrapper.optimizer.lr
    runner, _, rec, _ = _run(cfg, probe=probe(), adjust='lr', lr_scaling='linear',
                             max_batch_size=3)
    assert rec.batches == [2] and rec.stepped == [True]
    assert runner.optim_wrapper._accumulative_counts == 1
    group = runner.optim_wrapper.optimizer.param_groups[0]
    assert group['initial_lr'] == pytest.approx(lr * 0.5)  # total 4 -> 2


@pytest.mark.slow
def test_without_cuda_and_probe_it_keeps_the_batch(data_root, tmp_path):
    if torch.cuda.is_available():
        pytest.skip('this machine has a GPU: the hook would search on it')
    cfg = demo_config(data_root, str(tmp_path), batch_size=1, max_iters=1)
    _, hook, rec, _ = _run(cfg, steps_per_trial=1)
    assert hook.result is None and rec.batches == [1]


@pytest.mark.slow
def test_conflicting_settings_are_errors(data_root, tmp_path):
    cfg = demo_config(data_root, str(tmp_path), batch_size=2, max_iters=1)
    cfg.optim_wrapper.accumulative_counts = 2
    with pytest.raises(ValueError, match='without a scaling recipe'):
        _run(cfg, probe=probe())
    with pytest.raises(ValueError, match="adjust='sideways'"):
        AutoBatchSizeHook(adjust='sideways')
    with pytest.raises(ValueError, match='margin'):
        AutoBatchSizeHook(margin=1.5)


# ------------------------------------------------------------------- distributed
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def _ddp_rank(rank: int, data_root: str, work_dir: str, port: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE='2',
                      MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cfg = demo_config(data_root, work_dir, batch_size=2, max_iters=1)
    cfg.launcher = 'pytorch'
    # rank 0 allows 2.25 MiB (2 samples), rank 1 only 1.35 MiB (1 sample)
    capacity = int((2.5 if rank == 0 else 1.5) * MiB)
    runner, hook, rec, _ = _run(cfg, probe=modeled_probe(capacity))
    with open(osp.join(work_dir, f'rank{rank}.pkl'), 'wb') as f:
        pickle.dump(dict(batch=hook.result.batch_size, local=hook.result.local_batch_size,
                         plan=(hook.plan.per_gpu_batch, hook.plan.accumulation),
                         batches=rec.batches, stepped=rec.stepped,
                         wrapped=type(runner.model).__name__), f)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_ranks_train_with_the_smallest_batch(data_root, tmp_path):
    """Real 2-process gloo DDP: total 4 = 2 GPUs x 2; rank 1 fits only 1, so both train
    1 x 2 GPUs x 2 accumulation, and one cache entry serves both ranks."""
    # a GPU a rank where there are 2; else CPU ranks, CUDA hidden (tests/multiprocess.py)
    start_ranks(_ddp_rank, (data_root, str(tmp_path), _free_port()), nprocs=2)
    out = [pickle.load(open(tmp_path / f'rank{r}.pkl', 'rb')) for r in range(2)]
    assert [o['local'] for o in out] == [2, 1]
    for o in out:
        assert o['batch'] == 1 and o['plan'] == (1, 2)
        assert o['batches'] == [1, 1] and o['stepped'] == [False, True]
        assert 'DistributedDataParallel' in o['wrapped']
    cached = json.load(open(tmp_path / 'auto_batch_size.json'))
    assert [e['batch_size'] for e in cached.values()] == [1]
