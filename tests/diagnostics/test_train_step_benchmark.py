"""The train-step benchmark's pure parts: busy share, the config it trains, the trace
file."""
import gzip
import json

import pytest
import torch
from mmengine.config import Config

import mmdet3d_scaling  # noqa: F401
from mmdet3d_scaling.diagnostics.train_step_benchmark import (busy_share, configure,
                                                              write_trace)

BEVFUSION = 'configs/bevfusion/bevfusion_lidar-cam_voxel0075_second_secfpn_6e_nus-3d.py'
ONE_GPU = 'configs/bevfusion_1gpu.py'


def test_busy_share_counts_overlaps_once():
    assert busy_share([(0, 10), (5, 15), (20, 30)], 40) == pytest.approx(25 / 40)
    assert busy_share([(0, 10), (2, 3)], 10) == 1.0
    assert busy_share([], 10) == 0.0


@pytest.mark.parametrize('path', [BEVFUSION, ONE_GPU])
def test_configure_trains_micro_batches_at_the_precision(path):
    cfg = configure(Config.fromfile(path), batch=4, precision='bf16', iters=7, workers=2)
    assert cfg.train_dataloader.batch_size == 4
    assert cfg.train_dataloader.num_workers == 2
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'bfloat16'
    assert 'accumulative_counts' not in cfg.optim_wrapper
    assert cfg.train_cfg == dict(type='IterBasedTrainLoop', max_iters=7, val_interval=10 ** 9)
    assert cfg.get('amp') is None and cfg.val_dataloader is None
    if cfg.get('scaling'):
        assert cfg.scaling.total_batch_size == 4 and cfg.scaling.per_gpu_batch_size == 4


def test_configure_fp32_and_bad_values():
    cfg = configure(Config.fromfile(ONE_GPU), batch=2, precision='fp32', iters=3)
    assert cfg.optim_wrapper.type == 'OptimWrapper' and 'dtype' not in cfg.optim_wrapper
    with pytest.raises(ValueError, match="precision 'tf32'"):
        configure(Config.fromfile(ONE_GPU), batch=2, precision='tf32', iters=3)


def test_configure_drops_the_hooks_that_change_a_micro_batch_or_its_memory_peaks():
    cfg = configure(Config.fromfile('configs/pv_rcnn/pv_rcnn_synthetic_kitti.py'), batch=8,
                    precision='fp32', iters=3)
    kinds = [str(h['type']) for h in cfg.custom_hooks]
    assert not any('GPUMonitor' in k or 'AutoBatchSize' in k or 'Cumulative' in k
                   for k in kinds)
    assert 'NonFiniteGuardHook' in kinds  # the rest stay


@pytest.mark.parametrize('name', ['trace.json', 'trace.json.gz'])
def test_write_trace_writes_a_chrome_trace(tmp_path, name):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(8, 8).matmul(torch.ones(8, 8))
    path = tmp_path / name
    write_trace(prof, str(path))
    opener = gzip.open if name.endswith('.gz') else open
    with opener(path, 'rt') as f:
        events = json.load(f)['traceEvents']
    assert any('mm' in e.get('name', '') for e in events)


def test_add_gc_hook_trains_with_the_garbage_collection_hook():
    from mmdet3d.registry import HOOKS

    from mmdet3d_scaling.diagnostics.train_step_benchmark import add_gc_hook
    cfg = Config.fromfile(BEVFUSION)
    before = list(cfg.get('custom_hooks') or [])
    assert add_gc_hook(cfg) is None and list(cfg.get('custom_hooks') or []) == before
    hook = add_gc_hook(cfg, freeze=True, interval=8)
    assert hook == dict(type='GarbageCollectionHook', freeze=True, collect_interval=8)
    assert cfg.custom_hooks[-1] == hook and cfg.custom_hooks[:-1] == before
    add_gc_hook(cfg, freeze=True)  # replaces, never two
    assert sum('GarbageCollection' in h['type'] for h in cfg.custom_hooks) == 1
    built = HOOKS.build(cfg.custom_hooks[-1])
    assert built.freeze and built.collect_interval is None
